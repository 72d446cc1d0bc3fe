package electortest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
)

// RunGrouped checks the rules a store that groups heartbeats (elector.HeartbeatGrouper)
// adds to elector.Backend's, for elections the harness names in a group its clients
// grouped. Each holder watches its keys, as an elector does. Run(t, newHarness) with the
// same harness checks that grouped elections keep every other rule.
func RunGrouped(t *testing.T, newHarness func(t *testing.T) Harness) {
	grouping := func(check func(t *testing.T, h *harness)) func(t *testing.T, h *harness) {
		return func(t *testing.T, h *harness) {
			if _, ok := h.NewClient(t).(elector.HeartbeatGrouper); !ok {
				t.Skip("the store does not group heartbeats")
			}
			check(t, h)
		}
	}
	// The same heartbeats, sent in one UpdateAll where the store has it.
	batched := func(check func(t *testing.T, h *harness)) func(t *testing.T, h *harness) {
		return grouping(func(t *testing.T, h *harness) {
			if _, ok := h.NewClient(t).(elector.HeartbeatBatcher); !ok {
				t.Skip("the store does not batch heartbeats")
			}
			h.batchedBeats = true
			check(t, h)
		})
	}
	runSuite(t, newHarness, []suiteCase{
		{"heartbeats_of_many_keys_share_a_write_and_each_is_reported", grouping(heartbeatsShareAWrite)},
		{"batched_heartbeats_share_a_write_and_each_is_reported", batched(heartbeatsShareAWrite)},
		{"batched_heartbeat_of_a_deleted_key_fails_and_the_others_go_on", batched(heartbeatOfADeletedKey)},
		{"expire_waits_for_the_holders_beacon", grouping(expireWaitsForTheBeacon)},
		{"heartbeat_of_a_deleted_key_fails_and_the_others_go_on", grouping(heartbeatOfADeletedKey)},
		{"a_watch_read_late_reports_the_vacancy_or_ends", grouping(lateReaderSeesTheVacancy)},
	})
}

// held is one key a holder won, and the watches of it.
type held struct {
	election string
	won      elector.Observation
	value    []byte
	// own is the holder's watch, follower a follower's, from when each saw the key.
	own, follower <-chan elector.Observation
}

// holdMany has a win n keys of the group under lease la, each watched by a and by b from
// what each saw.
func (h *harness) holdMany(a elector.Backend, la elector.LeaseID, b elector.Backend, n int) []held {
	h.t.Helper()
	keys := make([]held, n)
	for i := range keys {
		name := h.election
		if i > 0 {
			name = h.Election()
		}
		value := []byte("holder of " + name)
		won, err := a.Campaign(h.ctx(), name, value, la)
		if err != nil || won.Holder == nil || won.Holder.Lease != la {
			h.t.Fatalf("Campaign(%s) = %+v, %v; want a win", name, won.Holder, err)
		}
		seen, err := b.Observe(h.ctx(), name)
		if err != nil {
			h.t.Fatal(err)
		}
		keys[i] = held{election: name, won: won, value: value,
			own: h.watchOf(a, name, won), follower: h.watchOf(b, name, seen)}
	}
	return keys
}

// watchOf watches election from the observation seen, as the elector does: through
// elector.SeenWatcher where the store has it (so that it is checked here), else Watch.
func (h *harness) watchOf(b elector.Backend, election string, seen elector.Observation) <-chan elector.Observation {
	ctx, cancel := context.WithCancel(context.Background())
	h.t.Cleanup(cancel)
	if sw, ok := b.(elector.SeenWatcher); ok {
		return sw.WatchSeen(ctx, election, seen)
	}
	return b.Watch(ctx, election, seen.Revision)
}

// beatAll sends a heartbeat (an Update with the value the key holds) of every key at once
// (in one UpdateAll when h.batchedBeats) and returns what each answered.
func (h *harness) beatAll(a elector.Backend, keys []held) []bool {
	oks := make([]bool, len(keys))
	if h.batchedBeats {
		updates := make([]elector.KeyUpdate, len(keys))
		for i, k := range keys {
			updates[i] = elector.KeyUpdate{Election: k.election, Token: k.won.Holder.Token, Value: k.value}
		}
		for i, r := range h.updateAll(a, updates) {
			if r.Err != nil {
				h.t.Errorf("heartbeat of %s: %v", keys[i].election, r.Err)
			}
			oks[i] = r.Updated
		}
		return oks
	}
	var wg sync.WaitGroup
	for i, k := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok, err := a.Update(h.ctx(), k.election, k.won.Holder.Token, k.value)
			if err != nil {
				h.t.Errorf("heartbeat of %s: %v", k.election, err)
			}
			oks[i] = ok
		}()
	}
	wg.Wait()
	return oks
}

// heartbeatsShareAWrite: the heartbeats of many keys sent at once are carried by fewer
// writes than keys, each follower's watch reports one for its key (same holder, same
// token, a later revision), and a vacancy comes after them.
// A key may be reported more than once: every beacon of the lease counts for each key it
// holds.
func heartbeatsShareAWrite(t *testing.T, h *harness) {
	a, la, _ := h.client()
	b, _, _ := h.client()
	keys := h.holdMany(a, la, b, 16)
	for i, ok := range h.beatAll(a, keys) {
		if !ok {
			t.Fatalf("heartbeat of %s = false; want true", keys[i].election)
		}
	}
	revs := map[int64]bool{}
	for _, k := range keys {
		o := h.next(k.follower)
		if o.Holder == nil || o.Holder.Token != k.won.Holder.Token || o.Holder.Lease != la || string(o.Holder.Value) != string(k.value) {
			t.Fatalf("%s: the follower's watch reported %+v after the heartbeat; want the same holder", k.election, o.Holder)
		}
		if o.Revision <= k.won.Revision {
			t.Fatalf("%s: the heartbeat was reported at revision %d, not after the campaign's %d", k.election, o.Revision, k.won.Revision)
		}
		revs[o.Revision] = true
	}
	if len(revs) > len(keys)/2 {
		t.Fatalf("the heartbeats of %d keys were %d writes; want them to share", len(keys), len(revs))
	}
	if err := a.Revoke(h.ctx(), la); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		h.untilVacant(k.follower) // a lease's beacon is a heartbeat of every key it holds
	}
}

// expireWaitsForTheBeacon: a follower that saw the key before the holder's last heartbeat
// cannot expire it; one that saw the heartbeat can, and the holder's next heartbeat then
// fails.
func expireWaitsForTheBeacon(t *testing.T, h *harness) {
	a, la, _ := h.client()
	b, _, _ := h.client()
	k := h.holdMany(a, la, b, 1)[0]
	token := k.won.Holder.Token
	before := h.observe(b).Revision
	if !h.beatAll(a, []held{k})[0] {
		t.Fatal("heartbeat = false; want true")
	}
	beat := h.next(k.follower)
	if ok, err := b.Expire(h.ctx(), k.election, token, before); err != nil || ok {
		t.Fatalf("Expire as of a revision before the heartbeat = %v, %v; want false", ok, err)
	}
	if ok, err := b.Expire(h.ctx(), k.election, token, beat.Revision); err != nil || !ok {
		t.Fatalf("Expire as of the heartbeat = %v, %v; want true", ok, err)
	}
	h.untilVacant(k.own)
	if ok, err := a.Update(h.ctx(), k.election, token, k.value); err != nil || ok {
		t.Fatalf("heartbeat of an expired key = %v, %v; want false", ok, err)
	}
}

// heartbeatOfADeletedKey: of two keys under one lease, the one deleted (by a follower's
// Expire, as an operator's delete) answers false; the other's heartbeats go on.
func heartbeatOfADeletedKey(t *testing.T, h *harness) {
	a, la, _ := h.client()
	b, _, _ := h.client()
	keys := h.holdMany(a, la, b, 2)
	gone, kept := keys[0], keys[1]
	if got := h.beatAll(a, keys); !got[0] || !got[1] {
		t.Fatalf("first heartbeats = %v; want [true true]", got)
	}
	// The two heartbeats, sent at once, may go in two beacons (one on its way when the
	// other comes): a follower expires as of the last one it saw, and the second beacon
	// reaches its watch too (a beacon is a heartbeat of every key of its lease).
	seen := h.next(gone.follower)
	ok, err := b.Expire(h.ctx(), gone.election, gone.won.Holder.Token, seen.Revision)
	for beacons := 1; err == nil && !ok && beacons < len(keys); beacons++ {
		seen = h.next(gone.follower)
		ok, err = b.Expire(h.ctx(), gone.election, gone.won.Holder.Token, seen.Revision)
	}
	if err != nil || !ok {
		t.Fatalf("Expire = %v, %v; want true", ok, err)
	}
	h.untilVacant(gone.own)
	// The lease lives a ttl unrenewed: on a loaded machine the steps above can take that
	// long, and then both keys are rightly gone. Renew it, so that only the delete counts.
	if _, err := a.Renew(h.ctx(), la); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	if got := h.beatAll(a, keys); got[0] || !got[1] {
		t.Fatalf("heartbeats after the delete of %s: %v; want [false true]", gone.election, got)
	}
	if o, err := b.Observe(h.ctx(), kept.election); err != nil || o.Holder == nil || o.Holder.Token != kept.won.Holder.Token {
		t.Fatalf("%s after the other's delete: %+v, %v; want still held", kept.election, o.Holder, err)
	}
}

// lateReaderSeesTheVacancy: a follower's watch that nobody reads while the holder beats
// many times and then lets go may drop heartbeats (a later one stands for them), but when
// it is read it reports the vacancy after them, or ends, which makes its reader read the
// key again: never the holder as the last word.
func lateReaderSeesTheVacancy(t *testing.T, h *harness) {
	a, la, _ := h.client()
	b, _, _ := h.client()
	k := h.holdMany(a, la, b, 1)[0]
	const beats = 24 // more than a store would buffer for one key
	for i := range beats {
		if !h.beatAll(a, []held{k})[0] {
			t.Fatalf("heartbeat %d = false; want true", i)
		}
	}
	if err := a.Revoke(h.ctx(), la); err != nil {
		t.Fatal(err)
	}
	reported := 0
	for {
		select {
		case o, ok := <-k.follower:
			switch {
			case !ok || o.Err != nil:
				t.Logf("the watch ended after %d reports (%v)", reported, o.Err)
				return
			case o.Holder == nil:
				t.Logf("the vacancy came after %d reports", reported)
				return
			case o.Holder.Token != k.won.Holder.Token:
				t.Fatalf("the watch reported token %d; want %d or the vacancy", o.Holder.Token, k.won.Holder.Token)
			}
			reported++
		case <-time.After(reportWithin):
			t.Fatalf("after %d reports the watch neither reported the vacancy nor ended within %s", reported, reportWithin)
		}
	}
}

// untilVacant waits for the watch to report the key vacant.
func (h *harness) untilVacant(ch <-chan elector.Observation) {
	h.t.Helper()
	for o := h.next(ch); o.Holder != nil; o = h.next(ch) {
	}
}
