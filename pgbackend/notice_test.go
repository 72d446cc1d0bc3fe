package pgbackend

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/internal/testkit/pgtest"
)

func TestParseNotice(t *testing.T) {
	key, intents, candidates := topic{"e", keyTopic}, topic{"e", intentsTopic}, topic{"e", candidatesTopic}
	for _, tc := range []struct {
		name, payload string
		want          []topic
	}{
		{"an_earlier_versions_payload_wakes_both", "e", []topic{key, intents}},
		{"key_written", "e/k", []topic{key}},
		{"intent_changed", "e/i", []topic{intents}},
		{"candidate_changed", "e/c", []topic{candidates}},
		{"key_deleted", "e/d/7/9/12", []topic{key}},
		{"key_deleted_with_garbage", "e/d/x/9/12", []topic{key}},
		{"a_later_versions_kind_wakes_every_watch", "e/z/1", []topic{key, intents, candidates}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := parseNotice(tc.payload); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("parseNotice(%q) = %+v, want %+v", tc.payload, got, tc.want)
			}
		})
	}
}

// TestWatchActsOnNotifications: a notification makes a watch look, never act: a key's
// delete is reported after one read of the key, a forged delete makes the watch read and
// report nothing, a flood of forged notifications costs a bounded number of reads, an
// intent's change makes no key watch read, and an earlier version's trigger still wakes it. The watcher polls once an hour, so only
// notifications wake it; its statements are counted by its pool's acquisitions.
func TestWatchActsOnNotifications(t *testing.T) {
	server := pgtest.Start(t)
	holder := newBackend(t, Config{DSN: server.DSN()})
	watcher := newBackend(t, Config{DSN: server.DSN(), PollInterval: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	exec := func(t *testing.T, sql string, args ...any) {
		t.Helper()
		if _, err := holder.Pool().Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	statements := func() int64 { return watcher.Pool().Stat().AcquireCount() }
	// quiet waits until the watcher has sent no statement for a while, and returns how
	// many it sent.
	quiet := func() int64 {
		for n := statements(); ; {
			time.Sleep(300 * time.Millisecond)
			if m := statements(); m == n {
				return n
			}
			n = statements()
		}
	}
	next := func(t *testing.T, changes <-chan elector.Observation, what string) elector.Observation {
		t.Helper()
		select {
		case o := <-changes:
			if o.Err != nil {
				t.Fatalf("waiting for %s: the watch broke: %v", what, o.Err)
			}
			return o
		case <-time.After(10 * time.Second):
			t.Fatalf("waiting for %s: the watch reported nothing within 10s (it polls once an hour)", what)
		}
		return elector.Observation{}
	}
	// watchHeld starts a term on holder and a watch of it on watcher that has reported a
	// heartbeat (so its listener is up) and gone quiet.
	watchHeld := func(t *testing.T, election string) (<-chan elector.Observation, elector.LeaseID, elector.Observation) {
		t.Helper()
		lease, won := win(t, ctx, holder, election, "beat-0", time.Hour)
		base, err := watcher.Observe(ctx, election)
		if err != nil {
			t.Fatal(err)
		}
		wctx, stop := context.WithCancel(ctx)
		t.Cleanup(stop)
		changes := watcher.Watch(wctx, election, base.Revision)
		for beat := 1; ; beat++ {
			if ok, err := holder.Update(ctx, election, won.Holder.Token, []byte(fmt.Sprintf("beat-%d", beat))); err != nil || !ok {
				t.Fatalf("heartbeat: Update = %v, %v", ok, err)
			}
			select {
			case o := <-changes:
				if o.Err != nil || o.Holder == nil {
					t.Fatalf("the watch reported %+v, want the heartbeat", o)
				}
			case <-time.After(time.Second):
				continue // the listener was not up yet
			}
			break
		}
		quiet()
		return changes, lease, won
	}

	t.Run("a_delete_is_reported_after_one_read", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			end  func(t *testing.T, election string, token int64, lease elector.LeaseID)
		}{
			{"release", func(t *testing.T, election string, token int64, lease elector.LeaseID) {
				if err := holder.Release(ctx, election, token, lease, elector.EndedResigned); err != nil {
					t.Fatal(err)
				}
			}},
			{"the_row_deleted_by_hand", func(t *testing.T, election string, _ int64, _ elector.LeaseID) {
				exec(t, `DELETE FROM caddy_leader_elections WHERE name = $1`, election)
			}},
			{"the_lease_revoked", func(t *testing.T, _ string, _ int64, lease elector.LeaseID) {
				if err := holder.Revoke(ctx, lease); err != nil {
					t.Fatal(err)
				}
			}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				election := "notice-" + tc.name
				changes, lease, won := watchHeld(t, election)
				before := statements()
				tc.end(t, election, won.Holder.Token, lease)
				if o := next(t, changes, "the vacancy"); o.Holder != nil {
					t.Fatalf("the watch reported %+v, want the vacancy", o)
				}
				// The read that found the vacancy was sent before the report: no wait.
				if n := statements(); n != before+1 {
					t.Errorf("the watch sent %d statements to report the vacancy, want 1 (the read that found it)", n-before)
				}
			})
		}
	})

	t.Run("a_forged_delete_makes_the_watch_read", func(t *testing.T) {
		election := "notice-forged"
		changes, _, won := watchHeld(t, election)
		before := statements()
		// The term's token, a write that is not the last one, and a vacancy revision far
		// ahead: the watch must read, find the holder, and report nothing.
		exec(t, `SELECT pg_notify('caddy_leader_changes', $1)`,
			fmt.Sprintf("%s/d/%d/%d/%d", election, won.Holder.Token, won.Holder.Token, int64(1)<<62))
		if n := quiet(); n != before+1 {
			t.Errorf("the watch sent %d statements after a forged delete, want 1 (a read)", n-before)
		}
		if ok, err := holder.Update(ctx, election, won.Holder.Token, []byte("after")); err != nil || !ok {
			t.Fatalf("heartbeat: Update = %v, %v", ok, err)
		}
		if o := next(t, changes, "the heartbeat"); o.Holder == nil || string(o.Holder.Value) != "after" {
			t.Errorf("after a forged delete the watch reported %+v, want the heartbeat", o)
		}
	})

	t.Run("a_flood_of_forged_notifications_costs_bounded_reads", func(t *testing.T) {
		election := "notice-flood"
		changes, _, won := watchHeld(t, election)
		before := statements()
		const forged = 500
		start := time.Now()
		for i := range forged {
			exec(t, `SELECT pg_notify('caddy_leader_changes', $1)`,
				fmt.Sprintf("%s/d/%d/%d/%d", election, won.Holder.Token, i, int64(1)<<62))
		}
		elapsed := time.Since(start)
		reads := quiet() - before
		// A burst of 4, then one per 20 ms of the flood (and of quiet's own wait).
		if limit := 4 + int64((elapsed+time.Second)/(20*time.Millisecond)) + 1; reads > limit {
			t.Errorf("%d forged notifications in %s cost the watcher %d reads, want at most %d", forged, elapsed, reads, limit)
		}
		select {
		case o := <-changes:
			t.Errorf("forged notifications made the watch report %+v", o)
		default:
		}
	})

	t.Run("an_intent_wakes_no_key_watch", func(t *testing.T) {
		election := "notice-intent"
		_, _, _ = watchHeld(t, election)
		intents := watcher.WatchIntent(ctx, election)
		if c := <-intents; c.Err != nil || c.Value != nil {
			t.Fatalf("the intent watch first reported %+v, want no intent", c)
		}
		before := quiet()
		if err := holder.SetIntent(ctx, election, []byte("intent"), time.Hour); err != nil {
			t.Fatal(err)
		}
		select {
		case c := <-intents:
			if c.Err != nil || string(c.Value) != "intent" {
				t.Fatalf("the intent watch reported %+v", c)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the intent watch reported nothing within 10s")
		}
		if n := quiet(); n != before+1 {
			t.Errorf("an intent's change cost the watcher %d statements, want 1 (the intent watch's read)", n-before)
		}
	})

	t.Run("an_announcement_wakes_the_candidates_watch_alone", func(t *testing.T) {
		election := "notice-candidates"
		_, lease, _ := watchHeld(t, election)
		wctx, stop := context.WithCancel(ctx)
		defer stop()
		candidates := watcher.WatchCandidates(wctx, election)
		report := func(what string) []elector.CandidateEntry {
			t.Helper()
			select {
			case c := <-candidates:
				if c.Err != nil {
					t.Fatalf("waiting for %s: the candidates watch broke: %v", what, c.Err)
				}
				return c.Candidates
			case <-time.After(10 * time.Second):
				t.Fatalf("waiting for %s: the candidates watch reported nothing within 10s (it polls once an hour)", what)
			}
			return nil
		}
		if got := report("the first list"); len(got) != 0 {
			t.Fatalf("the candidates watch first reported %+v, want none", got)
		}
		before := quiet()
		if err := holder.Announce(ctx, election, "alpha", []byte("a-1"), lease); err != nil {
			t.Fatal(err)
		}
		if got := report("the announcement"); len(got) != 1 || got[0].ID != "alpha" || string(got[0].Value) != "a-1" {
			t.Fatalf("the candidates watch reported %+v, want alpha=a-1", got)
		}
		if n := quiet(); n != before+1 {
			t.Errorf("an announcement cost the watcher %d statements, want 1 (the candidates watch's read)", n-before)
		}
		// A forged notification makes the watch read, and report nothing: the list is
		// what the read finds.
		exec(t, `SELECT pg_notify('caddy_leader_changes', $1)`, election+"/c")
		if n := quiet(); n != before+2 {
			t.Errorf("a forged notification cost the watcher %d statements, want 1 (a read)", n-before-1)
		}
		select {
		case c := <-candidates:
			t.Fatalf("after a forged notification the candidates watch reported %+v", c)
		default:
		}
		if err := holder.Revoke(ctx, lease); err != nil {
			t.Fatal(err)
		}
		if got := report("the revoke"); len(got) != 0 {
			t.Fatalf("after the lease was revoked the candidates watch reported %+v, want none", got)
		}
	})

	t.Run("an_earlier_versions_notification_wakes_the_watch", func(t *testing.T) {
		election := "notice-earlier"
		changes, _, won := watchHeld(t, election)
		exec(t, `ALTER TABLE caddy_leader_elections DISABLE TRIGGER caddy_leader_elections_notify`)
		defer exec(t, `ALTER TABLE caddy_leader_elections ENABLE TRIGGER caddy_leader_elections_notify`)
		if ok, err := holder.Update(ctx, election, won.Holder.Token, []byte("unannounced")); err != nil || !ok {
			t.Fatalf("Update = %v, %v", ok, err)
		}
		exec(t, `SELECT pg_notify('caddy_leader_changes', $1)`, election) // as the older trigger sent it
		if o := next(t, changes, "the write"); o.Holder == nil || string(o.Holder.Value) != "unannounced" {
			t.Errorf("the watch reported %+v, want the write", o)
		}
	})
}
