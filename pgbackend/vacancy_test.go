package pgbackend

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/internal/testkit/pgtest"
)

// TestWatchReportsTheLastWriteBeforeAVacancy: a holder's heartbeat (an Update) followed at
// once by the key's going away, both between two reads of a polling watch, reaches the
// watch as that heartbeat and then the vacancy, never as the vacancy alone. A follower
// counts the vanished holder's deadline from the last write the watch showed it; a watch
// that merged the heartbeat into the vacancy would make it count from an older one, while
// the holder still admits (issue 18, hole 3). The watch polls once an hour here and is
// woken by hand after both writes, so the two always fall between two of its reads.
func TestWatchReportsTheLastWriteBeforeAVacancy(t *testing.T) {
	server := pgtest.Start(t)
	holder := newBackend(t, Config{DSN: server.DSN()})
	watcher := newBackend(t, Config{DSN: server.DSN(), DisableListen: true, PollInterval: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	exec := func(t *testing.T, sql string, args ...any) {
		t.Helper()
		if _, err := holder.Pool().Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}

	for _, tc := range []struct {
		name string
		// watchFromVacancy starts the watch before the term begins: the whole term
		// comes and goes between two reads.
		watchFromVacancy bool
		end              func(t *testing.T, election string, token int64, lease elector.LeaseID)
	}{
		{name: "heartbeat_then_the_row_deleted_by_hand", end: func(t *testing.T, election string, _ int64, _ elector.LeaseID) {
			exec(t, `DELETE FROM caddy_leader_elections WHERE name = $1`, election)
		}},
		{name: "heartbeat_then_release", end: func(t *testing.T, election string, token int64, lease elector.LeaseID) {
			if err := holder.Release(ctx, election, token, lease, elector.EndedResigned); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "heartbeat_then_the_lease_revoked", end: func(t *testing.T, _ string, _ int64, lease elector.LeaseID) {
			if err := holder.Revoke(ctx, lease); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "heartbeat_then_truncate", end: func(t *testing.T, _ string, _ int64, _ elector.LeaseID) {
			exec(t, `TRUNCATE caddy_leader_elections`)
		}},
		{name: "a_whole_term_between_two_reads", watchFromVacancy: true, end: func(t *testing.T, election string, _ int64, _ elector.LeaseID) {
			exec(t, `DELETE FROM caddy_leader_elections WHERE name = $1`, election)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			election := "vacancy-" + tc.name
			wctx, stop := context.WithCancel(ctx)
			defer stop()
			var changes <-chan elector.Observation
			watch := func() {
				base, err := watcher.Observe(ctx, election)
				if err != nil {
					t.Fatal(err)
				}
				changes = watcher.Watch(wctx, election, base.Revision)
			}
			if tc.watchFromVacancy {
				watch()
			}
			lease, won := win(t, ctx, holder, election, "beat-0", time.Hour)
			if !tc.watchFromVacancy {
				watch()
			}
			if ok, err := holder.Update(ctx, election, won.Holder.Token, []byte("beat-1")); err != nil || !ok {
				t.Fatalf("heartbeat: Update = %v, %v", ok, err)
			}
			tc.end(t, election, won.Holder.Token, lease)
			watcher.listener.deliver(election)

			var got []string
			for {
				var o elector.Observation
				select {
				case o = <-changes:
				case <-time.After(10 * time.Second):
					t.Fatalf("the watch reported %v, then nothing for 10s", got)
				}
				if o.Err != nil {
					t.Fatalf("the watch broke after %v: %v", got, o.Err)
				}
				if o.Holder == nil {
					got = append(got, "vacant")
					break
				}
				got = append(got, fmt.Sprintf("%s@%d", o.Holder.Value, o.Holder.Token))
			}
			if len(got) < 2 {
				t.Fatalf("the watch reported %v: the vacancy with no write of term %d before it", got, won.Holder.Token)
			}
			if last, want := got[len(got)-2], fmt.Sprintf("beat-1@%d", won.Holder.Token); last != want {
				t.Errorf("the watch reported %v: before the vacancy %s, want %s", got, last, want)
			}
		})
	}
}
