package pgbackend

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/internal/testkit/pgtest"
)

// groupedBackend is a backend whose elections named group.<n> are grouped.
func groupedBackend(t *testing.T, cfg Config, group string) *Backend {
	b := newBackend(t, cfg)
	b.GroupHeartbeats(group)
	return b
}

// winAll grants a lease of an hour on b and wins each election under it.
func winAll(t *testing.T, ctx context.Context, b *Backend, elections ...string) (elector.LeaseID, map[string]elector.Observation) {
	t.Helper()
	lease, _, err := b.Grant(ctx, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	won := map[string]elector.Observation{}
	for _, election := range elections {
		o, err := b.Campaign(ctx, election, []byte("record of "+election), lease)
		if err != nil || o.Holder == nil || o.Holder.Lease != lease {
			t.Fatalf("campaign of %s: %+v, %v", election, o, err)
		}
		won[election] = o
	}
	return lease, won
}

// beatAll sends a heartbeat (an Update with the value won) of each key at once.
func beatAll(t *testing.T, ctx context.Context, b *Backend, won map[string]elector.Observation) map[string]bool {
	t.Helper()
	var (
		mu  sync.Mutex
		wg  sync.WaitGroup
		got = map[string]bool{}
	)
	for election, o := range won {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok, err := b.Update(ctx, election, o.Holder.Token, o.Holder.Value)
			if err != nil {
				t.Errorf("heartbeat of %s: %v", election, err)
			}
			mu.Lock()
			got[election] = ok
			mu.Unlock()
		}()
	}
	wg.Wait()
	return got
}

// beginByHand begins a transaction on a connection of its own, as an operator's, rolled
// back at the end of the test unless committed.
func beginByHand(t *testing.T, ctx context.Context, server *pgtest.Server) pgx.Tx {
	t.Helper()
	conn, err := pgx.Connect(ctx, server.DSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(context.Background()) })
	return tx
}

// TestHeartbeatsOfAGroupWriteTheBeacon: the heartbeats of a lease's keys in a group,
// sent together, leave the keys' rows as they are and write the lease's beat, in fewer
// statements than keys (counted by pg_stat_statements).
func TestHeartbeatsOfAGroupWriteTheBeacon(t *testing.T) {
	server := pgtest.Start(t)
	server.Exec(t, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
	holder := groupedBackend(t, Config{DSN: server.DSN()}, "g")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const keys = 16
	var elections []string
	for i := range keys {
		elections = append(elections, fmt.Sprintf("g.%d", i))
	}
	lease, won := winAll(t, ctx, holder, elections...)
	server.Exec(t, "SELECT pg_stat_statements_reset()")
	for election, ok := range beatAll(t, ctx, holder, won) {
		if !ok {
			t.Errorf("heartbeat of %s = false; want true", election)
		}
	}
	if n := server.QueryInt(t, `SELECT count(*) FROM caddy_leader_elections WHERE rev <> token`); n != 0 {
		t.Errorf("%d keys were rewritten; want none", n)
	}
	if beat := server.QueryInt(t, fmt.Sprintf(`SELECT beat FROM caddy_leader_leases WHERE id = %d`, lease)); beat == 0 {
		t.Error("the lease's beat was not written")
	}
	beacons := server.QueryInt(t, `SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements WHERE query LIKE '%SET beat%'`)
	if beacons == 0 || beacons > keys/2 {
		t.Errorf("%d heartbeats were %d beacon writes; want them to share", keys, beacons)
	}
}

// TestBeaconSeesADeleteItWaitedFor: a key deleted by a transaction that holds its lease's
// row (as a guarded Expire does) while the beacon waits for that row is a heartbeat that
// fails, and the lease's other key's succeeds. A check of the keys in the beacon's own
// snapshot, taken before the wait, would find the key and tell its holder it still holds
// it, after a follower has judged it silent.
func TestBeaconSeesADeleteItWaitedFor(t *testing.T) {
	server := pgtest.Start(t)
	holder := groupedBackend(t, Config{DSN: server.DSN()}, "g")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lease, won := winAll(t, ctx, holder, "g.gone", "g.kept")
	tx := beginByHand(t, ctx, server)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM caddy_leader_leases WHERE id = $1 FOR SHARE`, int64(lease)); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `DELETE FROM caddy_leader_elections WHERE name = 'g.gone'`); err != nil {
		t.Fatal(err)
	}
	answers := make(chan map[string]bool, 1)
	go func() { answers <- beatAll(t, ctx, holder, won) }()
	// Until the beacon waits for the lease's row.
	for server.QueryInt(t, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%SET beat%'`) == 0 {
		select {
		case got := <-answers:
			t.Fatalf("the heartbeats were answered %v while the lease's row was locked", got)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := <-answers; got["g.gone"] || !got["g.kept"] {
		t.Fatalf("heartbeats after a delete the beacon waited for: %v; want g.gone false, g.kept true", got)
	}
}

// TestBeaconReportedBeforeAVacancy: a grouped key's heartbeat (its lease's beacon)
// followed at once by the key's going away, both between two reads of a polling watch,
// reaches the watch as a write at or after the beacon and then the vacancy: the vacated
// key keeps its lease's beat, or a new revision when the lease went first. A vacancy
// alone would make a follower count the holder's deadline from the write before the
// beacon. The watch polls once an hour and is woken by hand after both.
func TestBeaconReportedBeforeAVacancy(t *testing.T) {
	server := pgtest.Start(t)
	holder := groupedBackend(t, Config{DSN: server.DSN()}, "v")
	watcher := groupedBackend(t, Config{DSN: server.DSN(), DisableListen: true, PollInterval: time.Hour}, "v")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, tc := range []struct {
		name string
		end  func(t *testing.T, election string, token int64, lease elector.LeaseID)
	}{
		{"beacon_then_the_row_deleted_by_hand", func(t *testing.T, election string, _ int64, _ elector.LeaseID) {
			server.Exec(t, fmt.Sprintf(`DELETE FROM caddy_leader_elections WHERE name = '%s'`, election))
		}},
		{"beacon_then_release", func(t *testing.T, election string, token int64, lease elector.LeaseID) {
			if err := holder.Release(ctx, election, token, lease, elector.EndedResigned); err != nil {
				t.Fatal(err)
			}
		}},
		{"beacon_then_the_lease_revoked", func(t *testing.T, _ string, _ int64, lease elector.LeaseID) {
			if err := holder.Revoke(ctx, lease); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			election := "v." + tc.name
			base, err := watcher.Observe(ctx, election)
			if err != nil {
				t.Fatal(err)
			}
			wctx, stop := context.WithCancel(ctx)
			defer stop()
			changes := watcher.Watch(wctx, election, base.Revision)
			lease, won := win(t, ctx, holder, election, "record", time.Hour)
			// The watch reports the new holder from a read before the heartbeat.
			watcher.listener.deliver("v/b")
			next := func() elector.Observation {
				select {
				case o := <-changes:
					if o.Err != nil {
						t.Fatalf("the watch broke: %v", o.Err)
					}
					return o
				case <-time.After(10 * time.Second):
					t.Fatal("the watch reported nothing for 10s")
				}
				panic("unreachable")
			}
			if o := next(); o.Holder == nil || o.Holder.Token != won.Holder.Token {
				t.Fatalf("the watch reported %+v first; want the holder of term %d", o.Holder, won.Holder.Token)
			}
			// Until the watcher sends nothing more: the heartbeat and the end come
			// after its last read, not between it and another.
			for n := watcher.Pool().Stat().AcquireCount(); ; {
				time.Sleep(300 * time.Millisecond)
				if m := watcher.Pool().Stat().AcquireCount(); m == n {
					break
				} else {
					n = m
				}
			}
			if ok, err := holder.Update(ctx, election, won.Holder.Token, won.Holder.Value); err != nil || !ok {
				t.Fatalf("heartbeat: Update = %v, %v", ok, err)
			}
			beat := server.QueryInt(t, fmt.Sprintf(`SELECT beat FROM caddy_leader_leases WHERE id = %d`, lease))
			if beat <= won.Holder.Token {
				t.Fatalf("the heartbeat wrote beat %d, not after the campaign's %d", beat, won.Holder.Token)
			}
			tc.end(t, election, won.Holder.Token, lease)
			watcher.listener.deliver("v/b")

			lastWrite := base.Revision
			for o := next(); o.Holder != nil; o = next() {
				lastWrite = o.Revision
			}
			if lastWrite < beat {
				t.Fatalf("the last write the watch reported before the vacancy is at %d, before the beacon at %d", lastWrite, beat)
			}
		})
	}
}

// beforeBeacons turns the store's schema into that of a release before beacons: no beat
// on the leases or the vacated keys, and triggers that know of none.
const beforeBeacons = `
DROP TRIGGER caddy_leader_leases_gone ON caddy_leader_leases;
ALTER TABLE caddy_leader_leases DROP COLUMN beat;
ALTER TABLE caddy_leader_vacated DROP COLUMN beat;
CREATE OR REPLACE FUNCTION caddy_leader_notify_vacated() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
	INSERT INTO caddy_leader_vacated (name, value, lease, token, rev)
	VALUES (OLD.name, OLD.value, OLD.lease, OLD.token, OLD.rev)
	ON CONFLICT (name) DO UPDATE
		SET value = EXCLUDED.value, lease = EXCLUDED.lease, token = EXCLUDED.token, rev = EXCLUDED.rev;
	RETURN NULL;
END
$f$;`

// TestAnInstanceStartedBeforeTheMigrationSeesBeacons: an instance that started (with
// skip_schema) when the leases had no beat column writes no beacons, but once the column
// is added, the beacon of an instance started after counts for it as a write of the
// key: its read reports it, and its Expire of the key with the revision it saw before
// is refused. Blind to beacons, it would delete a key whose holder is alive and admits.
func TestAnInstanceStartedBeforeTheMigrationSeesBeacons(t *testing.T) {
	server := pgtest.Start(t)
	ddl, err := Schema("")
	if err != nil {
		t.Fatal(err)
	}
	server.Exec(t, ddl)
	server.Exec(t, beforeBeacons)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	older := groupedBackend(t, Config{DSN: server.DSN(), SkipSchema: true}, "s")
	if _, err := older.Observe(ctx, "s.0"); err != nil {
		t.Fatal(err)
	}
	if !older.noBeat.Load() {
		t.Fatal("the instance started before the migration found a beat column")
	}
	server.Exec(t, ddl) // the migration
	newer := groupedBackend(t, Config{DSN: server.DSN(), SkipSchema: true}, "s")
	lease, won := winAll(t, ctx, newer, "s.0")
	token := won["s.0"].Holder.Token
	before, err := older.read(ctx, "s.0", 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := beatAll(t, ctx, newer, won); !got["s.0"] {
		t.Fatal("the heartbeat failed")
	}
	beat := server.QueryInt(t, fmt.Sprintf(`SELECT beat FROM caddy_leader_leases WHERE id = %d`, lease))
	if beat <= before.rowRev {
		t.Fatalf("the beacon wrote beat %d, not after the key's write at %d", beat, before.rowRev)
	}
	for _, tc := range []struct {
		name  string
		check func(t *testing.T)
	}{
		{"a_read_reports_the_beacon", func(t *testing.T) {
			r, err := older.read(ctx, "s.0", 0)
			if err != nil {
				t.Fatal(err)
			}
			if r.obs.Holder == nil || r.rowRev < beat {
				t.Fatalf("read: holder %+v, last write at %d; want the holder, written at %d or later", r.obs.Holder, r.rowRev, beat)
			}
		}},
		{"expire_with_the_revision_before_the_beacon_is_refused", func(t *testing.T) {
			expired, err := older.Expire(ctx, "s.0", token, before.rowRev)
			if err != nil || expired {
				t.Fatalf("Expire of a key its holder's beacon wrote since = %v, %v; want false", expired, err)
			}
		}},
	} {
		t.Run(tc.name, tc.check)
	}
}

// TestVacancyKeepsTheBeatOfAHeldHeartbeat: an operator's DELETE of a grouped key, made
// before a beacon and committed after the beacon read the keys, must not leave the
// vacated key with the beat before the beacon if the heartbeat was answered held:
// followers would count the holder's deadline from a write earlier than the one its
// holder counts from. The beacon waits for the delete and answers false instead.
func TestVacancyKeepsTheBeatOfAHeldHeartbeat(t *testing.T) {
	server := pgtest.Start(t)
	holder := groupedBackend(t, Config{DSN: server.DSN()}, "g")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lease, won := winAll(t, ctx, holder, "g.0")
	tx := beginByHand(t, ctx, server)
	var pid int64
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	// The operator's delete: its vacated trigger has read the beat already.
	if _, err := tx.Exec(ctx, `DELETE FROM caddy_leader_elections WHERE name = 'g.0'`); err != nil {
		t.Fatal(err)
	}
	answers := make(chan map[string]bool, 1)
	go func() { answers <- beatAll(t, ctx, holder, won) }()
	// Until the heartbeat is answered, or waits for the operator's transaction.
	var got map[string]bool
	waiting := fmt.Sprintf(`SELECT count(*) FROM pg_stat_activity WHERE %d = ANY (pg_blocking_pids(pid))`, pid)
	for got == nil && server.QueryInt(t, waiting) == 0 {
		select {
		case got = <-answers:
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got == nil {
		got = <-answers
	}
	if !got["g.0"] {
		return // not held: nobody counts from the beacon
	}
	beat := server.QueryInt(t, fmt.Sprintf(`SELECT beat FROM caddy_leader_leases WHERE id = %d`, lease))
	r, err := holder.read(ctx, "g.0", 0)
	if err != nil {
		t.Fatal(err)
	}
	if r.obs.Holder != nil || r.rowRev < beat {
		t.Fatalf("after a heartbeat answered held at beat %d and the key's delete: holder %+v, last write at %d; want a vacancy written at %d or later",
			beat, r.obs.Holder, r.rowRev, beat)
	}
}

// TestGroupedWatchesNeedNoGoroutineEach: the watches of a group's keys, intents and
// candidates take their rows from the group's one read each, handed over by the feed's
// goroutine, so that a set of thousands of shards watches its rows with a fixed number of
// goroutines; and they still report, and end with their context.
func TestGroupedWatchesNeedNoGoroutineEach(t *testing.T) {
	server := pgtest.Start(t)
	b := groupedBackend(t, Config{DSN: server.DSN()}, "g")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lease, won := winAll(t, ctx, b, "g.0")
	watches, stop := context.WithCancel(ctx)
	// One watch of each kind starts the group's feeds, each with its goroutine.
	_ = b.Watch(watches, "g.0", won["g.0"].Revision)
	_ = b.WatchIntent(watches, "g.0")
	_ = b.WatchCandidates(watches, "g.0")
	if _, err := b.Campaign(ctx, "g.1", []byte("record of g.1"), lease); err != nil {
		t.Fatal(err)
	}

	const n = 300
	before := runtime.NumGoroutine()
	keys := make([]<-chan elector.Observation, n)
	intents := make([]<-chan elector.IntentChange, n)
	candidates := make([]<-chan elector.CandidatesChange, n)
	for i := range n {
		election := fmt.Sprintf("g.%d", i+1)
		keys[i] = b.Watch(watches, election, 0)
		intents[i] = b.WatchIntent(watches, election)
		candidates[i] = b.WatchCandidates(watches, election)
	}
	if grown := runtime.NumGoroutine() - before; grown > n/10 {
		t.Fatalf("%d watches of each kind of the group's rows started %d goroutines; want them to share the feeds'", n, grown)
	}
	select {
	case o, ok := <-keys[0]:
		if !ok || o.Err != nil || o.Holder == nil || o.Holder.Lease != lease {
			t.Fatalf("watch of g.1 reported %+v (open %v); want its holder", o, ok)
		}
	case <-ctx.Done():
		t.Fatal("watch of g.1 reported nothing")
	}
	stop()
	for i := range n {
		for _, ended := range []func() bool{
			func() bool { return drained(ctx, keys[i]) },
			func() bool { return drained(ctx, intents[i]) },
			func() bool { return drained(ctx, candidates[i]) },
		} {
			if !ended() {
				t.Fatalf("a watch of g.%d did not end with its context", i+1)
			}
		}
	}
}

// drained reads ch until it is closed, and reports whether that happened before ctx ended.
func drained[T any](ctx context.Context, ch <-chan T) bool {
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return true
			}
		case <-ctx.Done():
			return false
		}
	}
}
