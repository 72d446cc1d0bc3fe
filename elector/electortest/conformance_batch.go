package electortest

import (
	"fmt"
	"sync"
	"testing"

	"github.com/caddyleader/caddy-leader/elector"
)

// RunBatch checks that a store's batched calls (elector.Batcher, or one call per election
// where the store does not batch: elector.Batched) keep, for every election of a batch,
// the rules Run checks of the single calls. The batches are large enough to need several
// requests on a store that bounds one request (etcd: 128 operations).
func RunBatch(t *testing.T, newHarness func(t *testing.T) Harness) {
	runSuite(t, newHarness, []suiteCase{
		{"batch_campaign_wins_the_vacant_and_reports_the_held", batchCampaignEach},
		{"batch_larger_than_one_request", batchLarge},
		{"batched_and_single_campaigns_share_elections", batchedAndSingleShare},
		{"batch_release_acknowledges_each_term_to_its_successor", batchReleaseAcknowledges},
		{"batch_release_by_a_deposed_holder_spares_the_successor", batchStaleRelease},
		{"batch_expire_only_keys_unwritten_since", batchExpireUnwritten},
		{"batch_campaign_needs_a_live_lease", batchNeedsLease},
		{"batch_update_answers_each_key", batchUpdateEach},
		{"batch_reads_answer_each_key_and_history", batchReadsEach},
	})
}

// batchSize is more elections than one etcd transaction may hold operations.
const batchSize = 300

// elections returns n election names no other subtest uses.
func (h *harness) elections(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = h.Election()
	}
	return names
}

// claims are the claims of names, each with a value naming its election and who claims.
func claims(names []string, who string) []elector.Claim {
	cs := make([]elector.Claim, len(names))
	for i, name := range names {
		cs[i] = elector.Claim{Election: name, Value: []byte(who + " holds " + name)}
	}
	return cs
}

// winAll campaigns for every one of names on b under lease, in one batch, and fails the
// test unless b wins them all; it returns the terms won.
func (h *harness) winAll(b elector.Backend, lease elector.LeaseID, who string, names []string) []elector.HeldTerm {
	h.t.Helper()
	obs, err := elector.Batched(b).CampaignAll(h.ctx(), claims(names, who), lease)
	if err != nil {
		h.t.Fatalf("CampaignAll: %v", err)
	}
	if len(obs) != len(names) {
		h.t.Fatalf("CampaignAll of %d claims returned %d observations", len(names), len(obs))
	}
	terms := make([]elector.HeldTerm, len(names))
	for i, o := range obs {
		if o.Holder == nil || o.Holder.Lease != lease || string(o.Holder.Value) != who+" holds "+names[i] || o.Holder.Token <= 0 {
			h.t.Fatalf("CampaignAll: %s on a vacant key: holder %+v; want %s's win", names[i], o.Holder, who)
		}
		terms[i] = elector.HeldTerm{Election: names[i], Token: o.Holder.Token, Rev: o.Revision}
	}
	return terms
}

// holderOf reads election's key on b: nil when vacant.
func (h *harness) holderOf(b elector.Backend, election string) *elector.Holder {
	h.t.Helper()
	o, err := b.Observe(h.ctx(), election)
	if err != nil {
		h.t.Fatalf("Observe(%s): %v", election, err)
	}
	return o.Holder
}

// batchCampaignEach: in one batch, a wins every vacant key and loses the one another
// holds, with that holder reported, as a single Campaign would.
func batchCampaignEach(t *testing.T, h *harness) {
	a, la, _ := h.client()
	b, lb, _ := h.client()
	names := h.elections(3)
	held, err := b.Campaign(h.ctx(), names[1], []byte("b's"), lb)
	if err != nil || held.Holder == nil || held.Holder.Lease != lb {
		t.Fatalf("Campaign = %+v, %v; want b's win", held.Holder, err)
	}
	obs, err := elector.Batched(a).CampaignAll(h.ctx(), claims(names, "a"), la)
	if err != nil {
		t.Fatalf("CampaignAll: %v", err)
	}
	for i, o := range obs {
		want := la
		if i == 1 {
			want = lb
		}
		if o.Holder == nil || o.Holder.Lease != want {
			t.Errorf("%s: CampaignAll reports holder %+v, want lease %d", names[i], o.Holder, want)
			continue
		}
		if now := h.holderOf(b, names[i]); now == nil || now.Lease != want || now.Token != o.Holder.Token {
			t.Errorf("%s: the store holds %+v, the batch reported %+v", names[i], now, o.Holder)
		}
	}
	if obs[1].Holder != nil && obs[1].Holder.Token != held.Holder.Token {
		t.Errorf("the held key's token changed from %d to %d", held.Holder.Token, obs[1].Holder.Token)
	}
}

// batchLarge: a batch larger than one request wins every key, and releases them all.
func batchLarge(t *testing.T, h *harness) {
	a, la, ttl := h.client()
	h.keepAlive(a, la, ttl)
	b := h.NewClient(t)
	t.Cleanup(func() { b.Close() })
	n := batchSize
	if _, batches := a.(elector.Batcher); !batches {
		// One request per election: a few show the same, and a rate-limited client
		// (Kubernetes') would spend seconds on hundreds.
		n = 20
	}
	names := h.elections(n)
	terms := h.winAll(a, la, "a", names)
	for _, i := range []int{0, n / 2, n - 1} {
		if now := h.holderOf(b, names[i]); now == nil || now.Lease != la || now.Token != terms[i].Token {
			t.Fatalf("%s: the store holds %+v, want a's term %d", names[i], now, terms[i].Token)
		}
	}
	if err := elector.Batched(a).ReleaseAll(h.ctx(), terms, la, "batch"); err != nil {
		t.Fatalf("ReleaseAll: %v", err)
	}
	for i, name := range names {
		if now := h.holderOf(b, name); now != nil {
			t.Fatalf("%s (%d of %d) still held after ReleaseAll: %+v", name, i, n, now)
		}
	}
}

// batchedAndSingleShare: two batches (in opposite orders) and single campaigns race for the
// same keys: each key has one holder, the one whose campaign reported the win.
func batchedAndSingleShare(t *testing.T, h *harness) {
	const n = 40
	names := h.elections(n)
	reversed := make([]string, n)
	for i, name := range names {
		reversed[n-1-i] = name
	}
	type claimant struct {
		b     elector.Backend
		lease elector.LeaseID
		won   map[string]int64 // election -> token the claimant was told it won
	}
	cs := make([]*claimant, 3)
	for i := range cs {
		b, lease, ttl := h.client()
		h.keepAlive(b, lease, ttl)
		cs[i] = &claimant{b: b, lease: lease, won: map[string]int64{}}
	}
	record := func(c *claimant, name string, o elector.Observation) {
		if o.Holder != nil && o.Holder.Lease == c.lease {
			c.won[name] = o.Holder.Token
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for i, order := range [][]string{names, reversed} {
		wg.Go(func() {
			c := cs[i]
			obs, err := elector.Batched(c.b).CampaignAll(h.ctx(), claims(order, fmt.Sprint("batch ", i)), c.lease)
			if err != nil {
				errs <- err
				return
			}
			for j, o := range obs {
				record(c, order[j], o)
			}
		})
	}
	wg.Go(func() {
		c := cs[2]
		for _, name := range names {
			o, err := c.b.Campaign(h.ctx(), name, []byte("single"), c.lease)
			if err != nil {
				errs <- err
				return
			}
			record(c, name, o)
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("campaign: %v", err)
	}
	for _, name := range names {
		var winners []int
		for i, c := range cs {
			if _, ok := c.won[name]; ok {
				winners = append(winners, i)
			}
		}
		if len(winners) != 1 {
			t.Errorf("%s: claimants %v were told they won, want exactly one", name, winners)
			continue
		}
		c := cs[winners[0]]
		if now := h.holderOf(c.b, name); now == nil || now.Lease != c.lease || now.Token != c.won[name] {
			t.Errorf("%s: the store holds %+v, claimant %d was told it won with token %d", name, now, winners[0], c.won[name])
		}
	}
}

// batchReleaseAcknowledges: after a batch release, the successor's batch campaign wins
// every key with a newer token, and learns of each predecessor's acknowledgement and its
// why, as after a single Release.
func batchReleaseAcknowledges(t *testing.T, h *harness) {
	a, la, _ := h.client()
	b, lb, _ := h.client()
	names := h.elections(5)
	before := h.winAll(a, la, "a", names)
	if err := elector.Batched(a).ReleaseAll(h.ctx(), before, la, "handed over"); err != nil {
		t.Fatalf("ReleaseAll: %v", err)
	}
	obs, err := elector.Batched(b).CampaignAll(h.ctx(), claims(names, "b"), lb)
	if err != nil {
		t.Fatalf("CampaignAll: %v", err)
	}
	for i, o := range obs {
		name, prev := names[i], before[i].Token
		if o.Holder == nil || o.Holder.Lease != lb {
			t.Fatalf("%s: the successor's batch did not win: %+v", name, o.Holder)
		}
		if o.Holder.Token <= prev {
			t.Errorf("%s: token %d after %d, want it to increase", name, o.Holder.Token, prev)
		}
		if h.NamesPrev && o.Prev != prev {
			t.Errorf("%s: Prev = %d, want the released term %d", name, o.Prev, prev)
		}
		if o.PrevReleased && o.Prev == prev {
			if o.PrevWhy != "handed over" {
				t.Errorf("%s: PrevWhy = %q, want %q", name, o.PrevWhy, "handed over")
			}
			continue
		}
		ok, why, err := b.Released(h.ctx(), name, prev, 0)
		if err != nil || !ok || why != "handed over" {
			t.Errorf("%s: Released(%d) = %v, %q, %v; want the acknowledgement of the batch release", name, prev, ok, why, err)
		}
	}
}

// batchStaleRelease: a batch release retried after its first answer was lost, once a
// successor holds one of its keys, spares the successor there and releases the rest.
func batchStaleRelease(t *testing.T, h *harness) {
	a, la, _ := h.client()
	b, lb, _ := h.client()
	names := h.elections(2)
	terms := h.winAll(a, la, "a", names)
	if err := elector.Batched(a).ReleaseAll(h.ctx(), terms[:1], la, "first try"); err != nil {
		t.Fatalf("ReleaseAll: %v", err)
	}
	successor := h.winAll(b, lb, "b", names[:1])
	if err := elector.Batched(a).ReleaseAll(h.ctx(), terms, la, "retry"); err != nil {
		t.Fatalf("ReleaseAll again: %v", err)
	}
	if now := h.holderOf(b, names[0]); now == nil || now.Token != successor[0].Token {
		t.Errorf("%s: the deposed holder's release took the successor's key: %+v", names[0], now)
	}
	if now := h.holderOf(b, names[1]); now != nil {
		t.Errorf("%s: still held after the retried release: %+v", names[1], now)
	}
}

// batchExpireUnwritten: a follower's batch expiry deletes each key unwritten since it saw
// it, and spares, in the same batch, one its holder rewrote since.
func batchExpireUnwritten(t *testing.T, h *harness) {
	a, la, _ := h.client()
	b := h.NewClient(t)
	t.Cleanup(func() { b.Close() })
	names := h.elections(2)
	h.winAll(a, la, "a", names)
	seen := make([]elector.HeldTerm, len(names))
	for i, name := range names {
		o, err := b.Observe(h.ctx(), name)
		if err != nil || o.Holder == nil {
			t.Fatalf("Observe(%s) = %+v, %v", name, o.Holder, err)
		}
		seen[i] = elector.HeldTerm{Election: name, Token: o.Holder.Token, Rev: o.Revision}
	}
	if ok, err := a.Update(h.ctx(), names[1], seen[1].Token, []byte("rewritten")); err != nil || !ok {
		t.Fatalf("Update = %v, %v", ok, err)
	}
	deleted, err := elector.Batched(b).ExpireAll(h.ctx(), seen)
	if err != nil {
		t.Fatalf("ExpireAll: %v", err)
	}
	if len(deleted) != 2 || !deleted[0] || deleted[1] {
		t.Fatalf("ExpireAll = %v, want [true false]: the rewritten key must stay", deleted)
	}
	if now := h.holderOf(b, names[0]); now != nil {
		t.Errorf("%s: held after its expiry: %+v", names[0], now)
	}
	if now := h.holderOf(b, names[1]); now == nil || now.Token != seen[1].Token {
		t.Errorf("%s: the rewritten key is %+v, want it held still", names[1], now)
	}
}

// batchNeedsLease: a batch under a revoked lease fails and takes no key.
func batchNeedsLease(t *testing.T, h *harness) {
	a, la, _ := h.client()
	if err := a.Revoke(h.ctx(), la); err != nil {
		t.Fatalf("Revoke: %v", err)
	}
	names := h.elections(3)
	if _, err := elector.Batched(a).CampaignAll(h.ctx(), claims(names, "a"), la); err == nil {
		t.Errorf("CampaignAll under a revoked lease returned no error")
	}
	for _, name := range names {
		if now := h.holderOf(a, name); now != nil {
			t.Errorf("%s: held after a batch under a revoked lease: %+v", name, now)
		}
	}
}

// updateAll is b's UpdateAll (elector.HeartbeatBatcher), or Update for each where b has
// none.
func (h *harness) updateAll(b elector.Backend, updates []elector.KeyUpdate) []elector.UpdateResult {
	h.t.Helper()
	var out []elector.UpdateResult
	if hb, ok := b.(elector.HeartbeatBatcher); ok {
		out = hb.UpdateAll(h.ctx(), updates)
	} else {
		out = elector.UpdateEach(h.ctx(), updates, 8, b.Update)
	}
	if len(out) != len(updates) {
		h.t.Fatalf("UpdateAll of %d updates returned %d results", len(updates), len(out))
	}
	return out
}

// batchUpdateEach: one batch of updates (heartbeats, with the value the keys hold, and new
// values) rewrites every key still its term's and reports each that is not, a key taken
// by another term or deleted, without writing it.
func batchUpdateEach(t *testing.T, h *harness) {
	a, la, ttl := h.client()
	h.keepAlive(a, la, ttl)
	b, lb, _ := h.client()
	n := batchSize
	if _, batches := a.(elector.Batcher); !batches {
		n = 20 // as in batchLarge: a rate-limited client would spend seconds on hundreds
	}
	names := h.elections(n)
	terms := h.winAll(a, la, "a", names)
	// names[0] goes to b; names[1] is released and stays vacant.
	if err := elector.Batched(a).ReleaseAll(h.ctx(), terms[:2], la, "moved"); err != nil {
		t.Fatalf("ReleaseAll: %v", err)
	}
	taken := h.winAll(b, lb, "b", names[:1])
	updates := make([]elector.KeyUpdate, len(names))
	for i, name := range names {
		value := "a holds " + name // a heartbeat: the value the key holds
		if i%2 == 1 {
			value = "a rewrote " + name
		}
		updates[i] = elector.KeyUpdate{Election: name, Token: terms[i].Token, Value: []byte(value)}
	}
	for i, r := range h.updateAll(a, updates) {
		want := i >= 2
		if r.Err != nil || r.Updated != want {
			t.Errorf("%s: UpdateAll = %v, %v; want %v", names[i], r.Updated, r.Err, want)
		}
	}
	if now := h.holderOf(b, names[0]); now == nil || now.Token != taken[0].Token || string(now.Value) != "b holds "+names[0] {
		t.Errorf("%s: the update of a taken key wrote it: %+v", names[0], now)
	}
	if now := h.holderOf(b, names[1]); now != nil {
		t.Errorf("%s: the update of a released key wrote it: %+v", names[1], now)
	}
	for _, i := range []int{2, 3, n - 1} {
		now := h.holderOf(b, names[i])
		if now == nil || now.Token != terms[i].Token || string(now.Value) != string(updates[i].Value) {
			t.Errorf("%s: holder %+v after UpdateAll; want term %d with %q", names[i], now, terms[i].Token, updates[i].Value)
		}
	}
}

// batchReadsEach: ObserveAll and HistoryAll give, for each election of a batch larger than
// one request, what Observe and History give: held and vacant keys, with and without a
// history, one election's answer never another's.
func batchReadsEach(t *testing.T, h *harness) {
	a, la, ttl := h.client()
	h.keepAlive(a, la, ttl)
	n := batchSize
	if _, batches := a.(elector.ReadBatcher); !batches {
		n = 20 // one request per election, as in batchLarge
	}
	names := h.elections(n)
	var held []string
	for i, name := range names {
		if i%3 == 0 {
			held = append(held, name)
		}
		if i%4 == 0 {
			if err := a.AppendHistory(h.ctx(), name, []byte("entry of "+name), 4); err != nil {
				t.Fatalf("AppendHistory(%s): %v", name, err)
			}
		}
	}
	h.winAll(a, la, "a", held)
	reads := elector.BatchedReads(a)
	obs, err := reads.ObserveAll(h.ctx(), names)
	if err != nil || len(obs) != n {
		t.Fatalf("ObserveAll of %d: %d observations, %v", n, len(obs), err)
	}
	histories, err := reads.HistoryAll(h.ctx(), names)
	if err != nil || len(histories) != n {
		t.Fatalf("HistoryAll of %d: %d histories, %v", n, len(histories), err)
	}
	for i, name := range names {
		single := h.holderOf(a, name)
		switch got := obs[i].Holder; {
		case (got == nil) != (single == nil):
			t.Errorf("%s: ObserveAll reports holder %+v, Observe %+v", name, got, single)
		case got != nil && (got.Lease != single.Lease || got.Token != single.Token || string(got.Value) != string(single.Value)):
			t.Errorf("%s: ObserveAll reports holder %+v, Observe %+v", name, got, single)
		case (i%3 == 0) != (got != nil):
			t.Errorf("%s: ObserveAll reports holder %+v; held: %v", name, got, i%3 == 0)
		}
		if got, want := fmt.Sprintf("%q", histories[i]), fmt.Sprintf("%q", h.history(a, name)); got != want {
			t.Errorf("%s: HistoryAll gives %s, History %s", name, got, want)
		}
		if i%4 == 0 && (len(histories[i]) != 1 || string(histories[i][0]) != "entry of "+name) {
			t.Errorf("%s: HistoryAll gives %q; want its one entry", name, histories[i])
		}
	}
}

// history reads election's history on b.
func (h *harness) history(b elector.Backend, election string) [][]byte {
	h.t.Helper()
	list, err := b.History(h.ctx(), election)
	if err != nil {
		h.t.Fatalf("History(%s): %v", election, err)
	}
	return list
}
