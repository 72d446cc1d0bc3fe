package pgbackend

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/internal/testkit/pgtest"
)

// TestGroupWatchReadsWhatNotificationsName: between the whole reads of a group's keys
// (every 10 s, or every poll interval if longer: an hour here, so none), the group's
// watches learn of a change by reading the keys its notifications name, and of a beacon
// by reading the held keys' leases. A write and a delete by hand, a beacon and a lease
// deleted by hand each reach the watches of the keys they change, and until the lease
// goes (its 64 keys' deletes are more than a quarter of the group) no read of the whole
// group is made.
func TestGroupWatchReadsWhatNotificationsName(t *testing.T) {
	server := pgtest.Start(t)
	server.Exec(t, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
	holder := groupedBackend(t, Config{DSN: server.DSN()}, "g")
	watcher := groupedBackend(t, Config{DSN: server.DSN(), PollInterval: time.Hour}, "g")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const keys = 64
	var elections []string
	for i := range keys {
		elections = append(elections, fmt.Sprintf("g.%d", i))
	}
	lease, won := winAll(t, ctx, holder, elections...)
	watches := map[string]<-chan elector.Observation{}
	for _, election := range elections {
		watches[election] = watcher.Watch(ctx, election, 0)
	}
	for _, election := range elections {
		if o := next(ctx, t, watches[election]); o.Holder == nil || o.Holder.Lease != lease {
			t.Fatalf("the watch of %s began with %+v; want its holder", election, o)
		}
	}
	// A change by hand reaches a watch only through the listener here: once it has, the
	// listener is up and the whole read its start asks for is over.
	server.Exec(t, `UPDATE caddy_leader_elections SET rev = caddy_leader_next() WHERE name = 'g.0'`)
	awaitReport(ctx, t, "g.0", watches["g.0"], func(o elector.Observation) bool { return o.Holder != nil })
	server.Exec(t, "SELECT pg_stat_statements_reset()")
	wholeReads := func() int64 {
		return server.QueryInt(t, `SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements WHERE query LIKE '%starts_with(v.name%'`)
	}

	for _, tc := range []struct {
		name string
		do   func()
		// changed lists the keys whose watches must report, and want what they report.
		changed []string
		want    func(o elector.Observation) bool
	}{{
		name: "a_key_written_by_hand",
		do: func() {
			server.Exec(t, `UPDATE caddy_leader_elections SET value = 'by hand', rev = caddy_leader_next() WHERE name = 'g.7'`)
		},
		changed: []string{"g.7"},
		want:    func(o elector.Observation) bool { return o.Holder != nil && string(o.Holder.Value) == "by hand" },
	}, {
		name: "a_beacon",
		do: func() {
			delete(won, "g.7") // its value is not the one won any more
			beatAll(t, ctx, holder, won)
		},
		changed: append(elections[:7:7], elections[8:]...),
		want:    func(o elector.Observation) bool { return o.Holder != nil && o.Holder.Lease == lease },
	}, {
		name:    "a_key_deleted_by_hand",
		do:      func() { server.Exec(t, `DELETE FROM caddy_leader_elections WHERE name = 'g.9'`) },
		changed: []string{"g.9"},
		want:    func(o elector.Observation) bool { return o.Holder == nil },
	}} {
		t.Run(tc.name, func(t *testing.T) {
			tc.do()
			for _, election := range tc.changed {
				awaitReport(ctx, t, election, watches[election], tc.want)
			}
			if n := wholeReads(); n != 0 {
				t.Errorf("the watches read the whole group %d times; want none before the poll interval", n)
			}
		})
	}
	t.Run("the_lease_deleted_by_hand", func(t *testing.T) {
		server.Exec(t, fmt.Sprintf(`DELETE FROM caddy_leader_leases WHERE id = %d`, lease))
		for _, election := range elections {
			if election != "g.9" {
				awaitReport(ctx, t, election, watches[election], func(o elector.Observation) bool { return o.Holder == nil })
			}
		}
	})
}

// next is the next report of watch, failing t if ctx ends first or the watch ends.
func next(ctx context.Context, t *testing.T, watch <-chan elector.Observation) elector.Observation {
	t.Helper()
	select {
	case o, ok := <-watch:
		if !ok || o.Err != nil {
			t.Fatalf("the watch ended (%+v, open %v)", o, ok)
		}
		return o
	case <-ctx.Done():
		t.Fatal("the watch reported nothing")
	}
	return elector.Observation{}
}

// awaitReport reads election's watch until it reports what want accepts, failing t if it
// does not within ten seconds.
func awaitReport(ctx context.Context, t *testing.T, election string, watch <-chan elector.Observation, want func(elector.Observation) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		select {
		case o, ok := <-watch:
			if !ok || o.Err != nil {
				t.Fatalf("the watch of %s ended (%+v, open %v)", election, o, ok)
			}
			if want(o) {
				return
			}
		case <-ctx.Done():
			t.Fatalf("the watch of %s did not report the change", election)
		}
	}
}
