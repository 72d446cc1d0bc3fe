package electortest

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
)

// Harness is one store under test, as the factory given to Run returns it.
type Harness struct {
	// NewClient returns a new, independent client of the store, as one candidate has. The
	// suite closes it.
	NewClient func(t *testing.T) elector.Backend
	// TTL is the lease ttl the suite asks for. A real store needs one long enough that a
	// lease does not run out while a subtest works with it (a second or two).
	TTL time.Duration
	// Advance lets d pass for the store's leases and intents: the fake moves its clock, a
	// real store sleeps.
	Advance func(d time.Duration)
	// Election returns an election name that no other subtest uses (subtests may share one
	// server).
	Election func() string
	// NamesPrev says that the store reports, on a won campaign, the token of the term
	// before (elector.Observation.Prev); the suite then requires it to be exact, where it
	// otherwise also accepts 0.
	NamesPrev bool
}

// reportWithin bounds every wait for a watch to report: a store that never reports fails
// the test, one that is merely slow passes.
const reportWithin = 10 * time.Second

// Run checks that a store honours elector.Backend's contract. newHarness is called once per
// subtest.
//
// A store may coalesce changes of one key that follow each other quickly into the last of
// them (PostgreSQL's does: it keeps no history), so the watch subtests make one change at a
// time and wait for it to be reported before the next.
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	runSuite(t, newHarness, []suiteCase{
		{"one_leader_among_candidates", oneLeader},
		{"losing_campaign_reports_the_holder", losingCampaign},
		{"campaign_needs_a_live_lease", campaignNeedsLease},
		{"tokens_strictly_increase", tokensIncrease},
		{"release_hands_over_without_waiting_for_the_ttl", releaseHandsOver},
		{"release_by_a_deposed_holder_spares_the_successor", staleRelease},
		{"release_acknowledges_even_when_the_key_is_gone", releaseAcknowledgesGoneKey},
		{"campaign_names_the_previous_term", campaignNamesPrev},
		{"expire_only_a_key_unwritten_since", expireUnwritten},
		{"revoked_lease_is_seen", revokedLease},
		{"expired_lease_is_seen", expiredLease},
		{"renew_keeps_the_lease", renewKeeps},
		{"released_after_acknowledge", releasedAfterAcknowledge},
		{"acknowledgement_says_why", acknowledgementSaysWhy},
		{"not_released_while_the_lease_lives", notReleasedWhileAlive},
		{"acknowledgement_outlives_the_lease", acknowledgementOutlivesTheLease},
		{"without_a_lease_only_the_acknowledgement_counts", onlyTheAcknowledgementCounts},
		{"update_guarded_by_token", updateGuarded},
		{"watch_reports_each_change_in_order", watchOrder},
		{"watch_reports_changes_since_afterRev", watchSinceRev},
		{"intents_relay_resign_and_transfer", intents},
		{"intent_expires", intentExpires},
		{"intent_created_only_where_none_is_pending", intentCreated},
		{"candidates_live_with_their_lease", candidates},
		{"candidates_watch_starts_with_the_list_and_reports_each_change", candidatesWatch},
		{"candidates_watch_reports_an_expired_lease", candidatesWatchExpiry},
		{"candidates_watch_keeps_the_store_order", candidatesWatchOrder},
		{"candidates_watch_ends_with_its_context_or_client", candidatesWatchEnds},
		{"history_keeps_the_newest_entries_for_everyone", history},
	})
}

// suiteCase is one subtest of a suite: its name and what it checks.
type suiteCase struct {
	name string
	run  func(t *testing.T, h *harness)
}

// runSuite runs each case as a subtest, with a harness of its own from newHarness.
func runSuite(t *testing.T, newHarness func(t *testing.T) Harness, cases []suiteCase) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			tc.run(t, &harness{Harness: h, t: t, election: h.Election()})
		})
	}
}

type harness struct {
	Harness
	t        *testing.T
	election string
	// batchedBeats makes beatAll send its heartbeats in one UpdateAll.
	batchedBeats bool
}

func (h *harness) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), reportWithin)
	h.t.Cleanup(cancel)
	return ctx
}

// keepAlive renews lease on b every third of ttl until the test ends, for a test whose
// steps may together outlast one ttl (a polling store reports each within a poll interval).
func (h *harness) keepAlive(b elector.Backend, lease elector.LeaseID, ttl time.Duration) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	h.t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		tick := time.NewTicker(ttl / 3)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				rctx, rcancel := context.WithTimeout(ctx, ttl/3)
				_, _ = b.Renew(rctx, lease) // a failure shows as the test's own error
				rcancel()
			}
		}
	}()
}

// client returns a new client with a granted lease.
func (h *harness) client() (elector.Backend, elector.LeaseID, time.Duration) {
	h.t.Helper()
	b := h.NewClient(h.t)
	h.t.Cleanup(func() { b.Close() })
	id, ttl, err := b.Grant(h.ctx(), h.TTL)
	if err != nil {
		h.t.Fatalf("Grant: %v", err)
	}
	if id == 0 {
		h.t.Fatal("Grant returned lease 0")
	}
	if ttl < h.TTL {
		h.t.Fatalf("Grant(%s) granted %s, less than asked", h.TTL, ttl)
	}
	return b, id, ttl
}

// win campaigns with b under lease and fails the test unless b wins.
func (h *harness) win(b elector.Backend, lease elector.LeaseID, value string) elector.Observation {
	h.t.Helper()
	o, err := b.Campaign(h.ctx(), h.election, []byte(value), lease)
	if err != nil {
		h.t.Fatalf("Campaign: %v", err)
	}
	if o.Holder == nil || o.Holder.Lease != lease || string(o.Holder.Value) != value {
		h.t.Fatalf("Campaign on a vacant key did not win: %+v", o.Holder)
	}
	return o
}

func (h *harness) observe(b elector.Backend) elector.Observation {
	h.t.Helper()
	o, err := b.Observe(h.ctx(), h.election)
	if err != nil {
		h.t.Fatalf("Observe: %v", err)
	}
	return o
}

// next waits for the watch's next observation.
func (h *harness) next(ch <-chan elector.Observation) elector.Observation {
	h.t.Helper()
	select {
	case o, ok := <-ch:
		if !ok {
			h.t.Fatal("watch closed")
		}
		if o.Err != nil {
			h.t.Fatalf("watch broke: %v", o.Err)
		}
		return o
	case <-time.After(reportWithin):
		h.t.Fatalf("watch reported nothing within %s", reportWithin)
	}
	return elector.Observation{}
}

func (h *harness) watch(b elector.Backend, afterRev int64) <-chan elector.Observation {
	ctx, cancel := context.WithCancel(context.Background())
	h.t.Cleanup(cancel)
	return b.Watch(ctx, h.election, afterRev)
}

func oneLeader(t *testing.T, h *harness) {
	const n = 4
	type result struct {
		lease elector.LeaseID
		obs   elector.Observation
		err   error
	}
	results := make([]result, n)
	clients := make([]elector.Backend, n)
	for i := range n {
		clients[i], results[i].lease, _ = h.client()
	}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			results[i].obs, results[i].err = clients[i].Campaign(h.ctx(), h.election, fmt.Appendf(nil, "c%d", i), results[i].lease)
		})
	}
	wg.Wait()
	winners := 0
	var token int64
	for i, r := range results {
		if r.err != nil {
			t.Fatalf("candidate %d: Campaign: %v", i, r.err)
		}
		if r.obs.Holder == nil {
			t.Fatalf("candidate %d: Campaign reports nobody holding the key", i)
		}
		if r.obs.Holder.Lease == r.lease {
			winners++
			token = r.obs.Holder.Token
		}
	}
	if winners != 1 {
		t.Fatalf("%d of %d candidates won", winners, n)
	}
	for i, r := range results {
		if r.obs.Holder.Token != token {
			t.Errorf("candidate %d sees token %d, the winner %d", i, r.obs.Holder.Token, token)
		}
	}
}

func losingCampaign(t *testing.T, h *harness) {
	a, la, _ := h.client()
	b, lb, _ := h.client()
	won := h.win(a, la, "a")
	o, err := b.Campaign(h.ctx(), h.election, []byte("b"), lb)
	if err != nil {
		t.Fatal(err)
	}
	if o.Holder == nil || o.Holder.Lease != la || o.Holder.Token != won.Holder.Token || string(o.Holder.Value) != "a" {
		t.Fatalf("losing campaign reports %+v, want a's term (lease %d, token %d)", o.Holder, la, won.Holder.Token)
	}
}

func campaignNeedsLease(t *testing.T, h *harness) {
	a, la, _ := h.client()
	if err := a.Revoke(h.ctx(), la); err != nil {
		t.Fatal(err)
	}
	o, err := a.Campaign(h.ctx(), h.election, []byte("a"), la)
	if err == nil && o.Holder != nil && o.Holder.Lease == la {
		t.Fatal("a campaign under a revoked lease won the key")
	}
	if o := h.observe(a); o.Holder != nil {
		t.Fatalf("key held after a campaign under a revoked lease: %+v", o.Holder)
	}
}

func tokensIncrease(t *testing.T, h *harness) {
	var last int64
	next := func(o elector.Observation, how string) {
		t.Helper()
		if o.Holder.Token <= last {
			t.Fatalf("after %s: token %d does not exceed the previous %d", how, o.Holder.Token, last)
		}
		last = o.Holder.Token
	}
	a, la, _ := h.client()
	o := h.win(a, la, "a")
	next(o, "first campaign")
	if ok, err := a.Update(h.ctx(), h.election, o.Holder.Token, []byte("a2")); err != nil || !ok {
		t.Fatalf("Update: %v %v", ok, err)
	}
	if got := h.observe(a); got.Holder.Token != last {
		t.Fatalf("Update changed the token from %d to %d", last, got.Holder.Token)
	}
	if err := a.Release(h.ctx(), h.election, last, la, elector.EndedResigned); err != nil {
		t.Fatal(err)
	}
	b, lb, _ := h.client()
	next(h.win(b, lb, "b"), "release")
	if err := b.Revoke(h.ctx(), lb); err != nil {
		t.Fatal(err)
	}
	// The same lease campaigning again after a release starts a new term too.
	next(h.win(a, la, "a"), "revoke")
	if err := a.Release(h.ctx(), h.election, last, la, elector.EndedResigned); err != nil {
		t.Fatal(err)
	}
	next(h.win(a, la, "a"), "release and campaign under the same lease")
}

func releaseHandsOver(t *testing.T, h *harness) {
	a, la, _ := h.client()
	b, lb, _ := h.client()
	o := h.win(a, la, "a")
	if lost, err := b.Campaign(h.ctx(), h.election, []byte("b"), lb); err != nil || lost.Holder.Lease != la {
		t.Fatalf("b's campaign while a holds: %+v %v", lost.Holder, err)
	}
	if err := a.Release(h.ctx(), h.election, o.Holder.Token, la, elector.EndedTransferred); err != nil {
		t.Fatal(err)
	}
	// No Advance: the key is free at once, not when a's lease runs out.
	won := h.win(b, lb, "b")
	h.released(won, b, o.Holder.Token, la, elector.EndedTransferred, "Released after Release")
	if _, err := a.Renew(h.ctx(), la); err != nil {
		t.Fatalf("Release must keep the lease: Renew: %v", err)
	}
}

func staleRelease(t *testing.T, h *harness) {
	a, la, _ := h.client()
	b, lb, _ := h.client()
	old := h.win(a, la, "a")
	if err := a.Release(h.ctx(), h.election, old.Holder.Token, la, elector.EndedResigned); err != nil {
		t.Fatal(err)
	}
	succ := h.win(b, lb, "b")
	if err := a.Release(h.ctx(), h.election, old.Holder.Token, la, elector.EndedResigned); err != nil {
		t.Fatal(err)
	}
	if ok, err := a.Update(h.ctx(), h.election, old.Holder.Token, []byte("a again")); err != nil || ok {
		t.Fatalf("Update with a deposed token = %v, %v; want false", ok, err)
	}
	if o := h.observe(b); o.Holder == nil || o.Holder.Token != succ.Holder.Token || string(o.Holder.Value) != "b" {
		t.Fatalf("the successor's key was touched: %+v", o.Holder)
	}
}

func revokedLease(t *testing.T, h *harness) {
	a, la, _ := h.client()
	b, _, _ := h.client()
	o := h.win(a, la, "a")
	changes := h.watch(b, o.Revision)
	if err := a.Revoke(h.ctx(), la); err != nil {
		t.Fatal(err)
	}
	if got := h.next(changes); got.Holder != nil {
		t.Fatalf("watch after revoke reports %+v, want the key gone", got.Holder)
	}
	if _, err := a.Renew(h.ctx(), la); !errors.Is(err, elector.ErrLeaseNotFound) {
		t.Fatalf("Renew of a revoked lease: %v, want ErrLeaseNotFound", err)
	}
	if got := h.observe(b); got.Holder != nil {
		t.Fatalf("key still held after its lease was revoked: %+v", got.Holder)
	}
	if ok, _, err := b.Released(h.ctx(), h.election, o.Holder.Token, la); err != nil || !ok {
		t.Fatalf("Released after the lease was revoked = %v, %v; want true", ok, err)
	}
}

func expiredLease(t *testing.T, h *harness) {
	a, la, ttl := h.client()
	b, _, _ := h.client()
	o := h.win(a, la, "a")
	changes := h.watch(b, o.Revision)
	h.Advance(ttl + ttl/2)
	if got := h.next(changes); got.Holder != nil {
		t.Fatalf("watch after expiry reports %+v, want the key gone", got.Holder)
	}
	if _, err := a.Renew(h.ctx(), la); !errors.Is(err, elector.ErrLeaseNotFound) {
		t.Fatalf("Renew of an expired lease: %v, want ErrLeaseNotFound", err)
	}
	if ok, _, err := b.Released(h.ctx(), h.election, o.Holder.Token, la); err != nil || !ok {
		t.Fatalf("Released after the lease expired = %v, %v; want true", ok, err)
	}
	lb, _, err := b.Grant(h.ctx(), h.TTL)
	if err != nil {
		t.Fatal(err)
	}
	if got := h.win(b, lb, "b"); got.Holder.Token <= o.Holder.Token {
		t.Fatalf("token %d after expiry does not exceed %d", got.Holder.Token, o.Holder.Token)
	}
}

func renewKeeps(t *testing.T, h *harness) {
	a, la, ttl := h.client()
	h.win(a, la, "a")
	for range 3 {
		h.Advance(ttl / 2)
		got, err := a.Renew(h.ctx(), la)
		if err != nil {
			t.Fatalf("Renew: %v", err)
		}
		if got < h.TTL {
			t.Fatalf("Renew granted %s, less than asked %s", got, h.TTL)
		}
	}
	if o := h.observe(a); o.Holder == nil || o.Holder.Lease != la {
		t.Fatalf("key lost although its lease was renewed: %+v", o.Holder)
	}
}

func releasedAfterAcknowledge(t *testing.T, h *harness) {
	a, la, _ := h.client()
	b, _, _ := h.client()
	o := h.win(a, la, "a")
	tok := o.Holder.Token
	if ok, _, err := b.Released(h.ctx(), h.election, tok, la); err != nil || ok {
		t.Fatalf("Released while the holder leads = %v, %v; want false", ok, err)
	}
	if err := a.Acknowledge(h.ctx(), h.election, tok, la, elector.EndedKeyDeleted); err != nil {
		t.Fatal(err)
	}
	if ok, _, err := b.Released(h.ctx(), h.election, tok, la); err != nil || !ok {
		t.Fatalf("Released after Acknowledge = %v, %v; want true", ok, err)
	}
	if ok, _, err := b.Released(h.ctx(), h.election, tok+1, la); err != nil || ok {
		t.Fatalf("an acknowledgement of token %d released token %d: %v, %v", tok, tok+1, ok, err)
	}
	// Acknowledging under a lease that is gone is no error: Released says true anyway.
	if err := a.Revoke(h.ctx(), la); err != nil {
		t.Fatal(err)
	}
	if err := a.Acknowledge(h.ctx(), h.election, tok, la, elector.EndedKeyDeleted); err != nil {
		t.Fatalf("Acknowledge after the lease is gone: %v", err)
	}
}

// acknowledgementOutlivesTheLease releases a term and revokes its lease at once, as every
// shutdown does: the successor must still find the acknowledgement, once.
func acknowledgementOutlivesTheLease(t *testing.T, h *harness) {
	a, la, _ := h.client()
	b, _, _ := h.client()
	tok := h.win(a, la, "a").Holder.Token
	if err := a.Release(h.ctx(), h.election, tok, la, elector.EndedResigned); err != nil {
		t.Fatal(err)
	}
	if err := a.Revoke(h.ctx(), la); err != nil {
		t.Fatal(err)
	}
	if ok, _, err := b.Released(h.ctx(), h.election, tok, 0); err != nil || !ok {
		t.Fatalf("Released(lease 0) after Release and Revoke = %v, %v; want true", ok, err)
	}
	if ok, _, err := b.Released(h.ctx(), h.election, tok, 0); err != nil || ok {
		t.Fatalf("Released(lease 0) a second time = %v, %v; want false: the acknowledgement is consumed", ok, err)
	}
}

// onlyTheAcknowledgementCounts revokes a holder's lease without its acknowledgement (an
// operator's revoke): asked with lease 0, Released must not take the lease's absence for
// the holder having stopped.
func onlyTheAcknowledgementCounts(t *testing.T, h *harness) {
	a, la, _ := h.client()
	b, _, _ := h.client()
	tok := h.win(a, la, "a").Holder.Token
	if err := b.Revoke(h.ctx(), la); err != nil {
		t.Fatal(err)
	}
	if ok, _, err := b.Released(h.ctx(), h.election, tok, 0); err != nil || ok {
		t.Fatalf("Released(lease 0) after a revoke without acknowledgement = %v, %v; want false", ok, err)
	}
	if ok, _, err := b.Released(h.ctx(), h.election, tok, la); err != nil || !ok {
		t.Fatalf("Released(lease) after the revoke = %v, %v; want true", ok, err)
	}
}

// notReleasedWhileAlive checks the lease's last moments: however little of its ttl is left,
// a lease that can still be renewed is not released.
func notReleasedWhileAlive(t *testing.T, h *harness) {
	a, la, ttl := h.client()
	b, _, _ := h.client()
	o := h.win(a, la, "a")
	h.Advance(ttl * 3 / 4)
	released, _, err := b.Released(h.ctx(), h.election, o.Holder.Token, la)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Renew(h.ctx(), la); err == nil && released {
		t.Fatal("Released said true for a lease that could be renewed afterwards")
	}
}

func updateGuarded(t *testing.T, h *harness) {
	a, la, _ := h.client()
	o := h.win(a, la, "a")
	tok := o.Holder.Token
	for _, tc := range []struct {
		name  string
		token int64
		value string
		want  bool
	}{
		{"right_token", tok, "a2", true},
		{"other_token", tok + 1, "x", false},
		{"older_token", tok - 1, "y", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ok, err := a.Update(h.ctx(), h.election, tc.token, []byte(tc.value))
			if err != nil || ok != tc.want {
				t.Fatalf("Update = %v, %v; want %v", ok, err, tc.want)
			}
		})
	}
	got := h.observe(a)
	if got.Holder == nil || string(got.Holder.Value) != "a2" || got.Holder.Lease != la || got.Holder.Token != tok {
		t.Fatalf("after updates the key is %+v, want value a2 under lease %d, token %d", got.Holder, la, tok)
	}
	if err := a.Release(h.ctx(), h.election, tok, la, elector.EndedResigned); err != nil {
		t.Fatal(err)
	}
	if ok, err := a.Update(h.ctx(), h.election, tok, []byte("z")); err != nil || ok {
		t.Fatalf("Update of a released key = %v, %v; want false", ok, err)
	}
	if o := h.observe(a); o.Holder != nil {
		t.Fatalf("Update re-created a released key: %+v", o.Holder)
	}
}

func watchOrder(t *testing.T, h *harness) {
	a, la, ttlA := h.client()
	b, lb, ttlB := h.client()
	h.keepAlive(a, la, ttlA)
	h.keepAlive(b, lb, ttlB)
	o := h.win(a, la, "a")
	changes := h.watch(b, o.Revision)
	rev := o.Revision
	step := func(how string, change func(), check func(elector.Observation) bool) {
		t.Helper()
		change()
		got := h.next(changes)
		if got.Revision <= rev {
			t.Fatalf("after %s: revision %d does not exceed the previous %d", how, got.Revision, rev)
		}
		rev = got.Revision
		if !check(got) {
			t.Fatalf("after %s: watch reports %+v", how, got.Holder)
		}
	}
	tok := o.Holder.Token
	for _, v := range []string{"a2", "a3"} {
		step("update to "+v, func() {
			if ok, err := a.Update(h.ctx(), h.election, tok, []byte(v)); err != nil || !ok {
				t.Fatalf("Update: %v %v", ok, err)
			}
		}, func(o elector.Observation) bool {
			return o.Holder != nil && bytes.Equal(o.Holder.Value, []byte(v)) && o.Holder.Token == tok && o.Holder.Lease == la
		})
	}
	step("release", func() {
		if err := a.Release(h.ctx(), h.election, tok, la, elector.EndedResigned); err != nil {
			t.Fatal(err)
		}
	}, func(o elector.Observation) bool { return o.Holder == nil })
	step("b's campaign", func() { h.win(b, lb, "b") },
		func(o elector.Observation) bool {
			return o.Holder != nil && o.Holder.Lease == lb && o.Holder.Token > tok
		})
}

func watchSinceRev(t *testing.T, h *harness) {
	a, la, _ := h.client()
	o := h.win(a, la, "a")
	if ok, err := a.Update(h.ctx(), h.election, o.Holder.Token, []byte("a2")); err != nil || !ok {
		t.Fatalf("Update: %v %v", ok, err)
	}
	// The update happened before the watch started, after afterRev: it is reported.
	got := h.next(h.watch(a, o.Revision))
	if got.Revision <= o.Revision || got.Holder == nil || string(got.Holder.Value) != "a2" {
		t.Fatalf("watch from revision %d reports revision %d, %+v; want the update", o.Revision, got.Revision, got.Holder)
	}
}

func intents(t *testing.T, h *harness) {
	a, _, ttl := h.client()
	b, _, _ := h.client()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	changes := b.WatchIntent(ctx, h.election)
	next := func() elector.IntentChange {
		t.Helper()
		select {
		case c, ok := <-changes:
			if !ok || c.Err != nil {
				t.Fatalf("intent watch ended: %v", c.Err)
			}
			return c
		case <-time.After(reportWithin):
			t.Fatalf("intent watch reported nothing within %s", reportWithin)
		}
		return elector.IntentChange{}
	}
	if c := next(); c.Value != nil {
		t.Fatalf("first report %q, want no intent", c.Value)
	}
	for _, v := range []string{`{"resign":"a"}`, `{"transfer":"b"}`} {
		if err := a.SetIntent(h.ctx(), h.election, []byte(v), 10*ttl); err != nil {
			t.Fatal(err)
		}
		if c := next(); string(c.Value) != v {
			t.Fatalf("intent watch reports %q, want %q", c.Value, v)
		}
	}
	// Clearing an intent that was replaced since spares the newer one.
	if err := a.ClearIntent(h.ctx(), h.election, []byte(`{"resign":"a"}`)); err != nil {
		t.Fatal(err)
	}
	fresh := b.WatchIntent(ctx, h.election)
	select {
	case c := <-fresh:
		if c.Err != nil || string(c.Value) != `{"transfer":"b"}` {
			t.Fatalf("after clearing the replaced intent a new watch reports %q (%v), want the newer one", c.Value, c.Err)
		}
	case <-time.After(reportWithin):
		t.Fatalf("a new intent watch reported nothing within %s", reportWithin)
	}
	if err := a.ClearIntent(h.ctx(), h.election, []byte(`{"transfer":"b"}`)); err != nil {
		t.Fatal(err)
	}
	if c := next(); c.Value != nil {
		t.Fatalf("after ClearIntent the watch reports %q", c.Value)
	}
}

func intentExpires(t *testing.T, h *harness) {
	a, _, ttl := h.client()
	if err := a.SetIntent(h.ctx(), h.election, []byte("resign"), ttl); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	changes := a.WatchIntent(ctx, h.election)
	var seen atomic.Bool
	for {
		select {
		case c, ok := <-changes:
			if !ok || c.Err != nil {
				t.Fatalf("intent watch ended: %v", c.Err)
			}
			if c.Value != nil {
				seen.Store(true)
				h.Advance(ttl + ttl/2)
				continue
			}
			if !seen.Load() {
				t.Fatal("intent watch reports no intent right after SetIntent")
			}
			return
		case <-time.After(reportWithin + ttl*2):
			t.Fatal("the intent did not expire")
		}
	}
}

// intentCreated checks CreateIntent (elector.IntentCreator) where the store has it: it
// leaves a pending intent alone, whoever stored it, and stores one where the last was
// cleared or has expired.
func intentCreated(t *testing.T, h *harness) {
	a, _, ttl := h.client()
	b, _, _ := h.client()
	ca, ok := a.(elector.IntentCreator)
	if !ok {
		t.Skip("the store does not create intents only where none is pending")
	}
	cb := b.(elector.IntentCreator)
	pending := func() string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), reportWithin)
		defer cancel()
		for c := range a.WatchIntent(ctx, h.election) {
			if c.Err != nil {
				t.Fatalf("intent watch: %v", c.Err)
			}
			return string(c.Value)
		}
		t.Fatalf("intent watch reported nothing within %s", reportWithin)
		return ""
	}
	create := func(c elector.IntentCreator, v string, ttl time.Duration) bool {
		t.Helper()
		created, err := c.CreateIntent(h.ctx(), h.election, []byte(v), ttl)
		if err != nil {
			t.Fatalf("CreateIntent %s: %v", v, err)
		}
		return created
	}
	if !create(ca, "a1", 10*ttl) {
		t.Fatal("CreateIntent found an intent pending where none was ever stored")
	}
	if create(cb, "b1", 10*ttl) || create(ca, "a2", 10*ttl) {
		t.Fatal("CreateIntent replaced a pending intent")
	}
	if got := pending(); got != "a1" {
		t.Fatalf("pending intent %q, want the first one, a1", got)
	}
	// An operator's SetIntent replaces it as before; CreateIntent still leaves that alone.
	if err := b.SetIntent(h.ctx(), h.election, []byte("op"), 10*ttl); err != nil {
		t.Fatal(err)
	}
	if create(ca, "a3", 10*ttl) {
		t.Fatal("CreateIntent replaced an intent stored with SetIntent")
	}
	if err := a.ClearIntent(h.ctx(), h.election, []byte("op")); err != nil {
		t.Fatal(err)
	}
	if !create(cb, "b2", ttl) {
		t.Fatal("CreateIntent found an intent pending after it was cleared")
	}
	// Once b2 expires, a new one is stored.
	h.Advance(ttl + ttl/2)
	for deadline := time.Now().Add(reportWithin); !create(ca, "a4", 10*ttl); {
		if time.Now().After(deadline) {
			t.Fatalf("CreateIntent still finds an intent pending %s after its ttl ran out", reportWithin)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := pending(); got != "a4" {
		t.Fatalf("pending intent %q, want a4", got)
	}
}

func candidates(t *testing.T, h *harness) {
	a, la, _ := h.client()
	b, lb, _ := h.client()
	for _, c := range []struct {
		b     elector.Backend
		id    string
		lease elector.LeaseID
	}{{b, "beta", lb}, {a, "alpha", la}} {
		if err := c.b.Announce(h.ctx(), h.election, c.id, []byte(c.id+"-1"), c.lease); err != nil {
			t.Fatalf("Announce %s: %v", c.id, err)
		}
	}
	list := func() string {
		entries, err := a.Candidates(h.ctx(), h.election)
		if err != nil {
			t.Fatal(err)
		}
		return render(entries)
	}
	if got := list(); got != "alpha=alpha-1 beta=beta-1" {
		t.Fatalf("Candidates = %q, want alpha=alpha-1 beta=beta-1 (sorted by id, with their values)", got)
	}
	if err := b.Announce(h.ctx(), h.election, "beta", []byte("beta-2"), lb); err != nil {
		t.Fatal(err)
	}
	if got := list(); got != "alpha=alpha-1 beta=beta-2" {
		t.Fatalf("after beta announced again Candidates = %q, want its new value only", got)
	}
	if err := b.Revoke(h.ctx(), lb); err != nil {
		t.Fatal(err)
	}
	if got := list(); got != "alpha=alpha-1" {
		t.Fatalf("after beta's lease was revoked Candidates = %q, want alpha only", got)
	}
	if err := b.Announce(h.ctx(), h.election, "beta", []byte("beta-3"), lb); err == nil {
		t.Fatal("Announce under a revoked lease succeeded")
	}
}

// releaseAcknowledgesGoneKey: a Release whose key is gone already (a first try whose answer
// was lost, or an operator's delete) still tells the successor that the term stopped.
func releaseAcknowledgesGoneKey(t *testing.T, h *harness) {
	a, la, _ := h.client()
	b, lb, _ := h.client()
	o := h.win(a, la, "a")
	if err := a.Release(h.ctx(), h.election, o.Holder.Token, la, elector.EndedResigned); err != nil {
		t.Fatal(err)
	}
	won := h.win(b, lb, "b")
	h.released(won, b, o.Holder.Token, 0, elector.EndedResigned, "Released after Release")
	// The acknowledgement was consumed; releasing again acknowledges again, and spares
	// b's key.
	if err := a.Release(h.ctx(), h.election, o.Holder.Token, la, elector.EndedResigned); err != nil {
		t.Fatal(err)
	}
	if ok, _, err := b.Released(h.ctx(), h.election, o.Holder.Token, 0); err != nil || !ok {
		t.Fatalf("Released after a Release of a key already gone = %v, %v; want true", ok, err)
	}
	if got := h.observe(b); got.Holder == nil || string(got.Holder.Value) != "b" {
		t.Fatalf("the successor's key was touched: %+v", got.Holder)
	}
}

// campaignNamesPrev: a store that says which term came before a new one (Observation.Prev)
// names the newest term before it, however that term ended; one that does not say
// reports 0. A losing campaign names nothing.
func campaignNamesPrev(t *testing.T, h *harness) {
	a, la, _ := h.client()
	b, lb, _ := h.client()
	check := func(o elector.Observation, want int64, after string) {
		t.Helper()
		if (h.NamesPrev || o.Prev != 0) && o.Prev != want {
			t.Fatalf("after %s: Prev = %d, want %d (or 0 from a store that does not say)", after, o.Prev, want)
		}
	}
	first := h.win(a, la, "a")
	if first.Prev != 0 {
		t.Fatalf("the first term of a new election: Prev = %d, want 0", first.Prev)
	}
	if lost, err := b.Campaign(h.ctx(), h.election, []byte("b"), lb); err != nil || lost.Prev != 0 {
		t.Fatalf("a losing campaign: Prev = %d, %v; want 0", lost.Prev, err)
	}
	if err := a.Release(h.ctx(), h.election, first.Holder.Token, la, elector.EndedResigned); err != nil {
		t.Fatal(err)
	}
	second := h.win(b, lb, "b")
	check(second, first.Holder.Token, "a release")
	if err := b.Revoke(h.ctx(), lb); err != nil {
		t.Fatal(err)
	}
	third := h.win(a, la, "a")
	check(third, second.Holder.Token, "a revoke")
	// PrevReleased may stay false, but must not claim an acknowledgement that a revoke
	// never wrote.
	if third.PrevReleased {
		t.Fatal("after a revoke: PrevReleased is set, but the revoked term never acknowledged its end")
	}
	if second.PrevReleased && second.Prev != first.Holder.Token {
		t.Fatalf("PrevReleased set for Prev %d, not the released term %d", second.Prev, first.Holder.Token)
	}
}

// expireUnwritten: Expire deletes the key only if it is still the term's and nobody wrote it
// after the revision the caller saw it at.
func expireUnwritten(t *testing.T, h *harness) {
	a, la, _ := h.client()
	b, _, _ := h.client()
	won := h.win(a, la, "a")
	if ok, err := a.Update(h.ctx(), h.election, won.Holder.Token, []byte("a, a heartbeat later")); err != nil || !ok {
		t.Fatalf("Update: %v %v", ok, err)
	}
	if ok, err := b.Expire(h.ctx(), h.election, won.Holder.Token, won.Revision); err != nil || ok {
		t.Fatalf("Expire as of a revision before the last write = %v, %v; want false", ok, err)
	}
	seen := h.observe(b)
	if ok, err := b.Expire(h.ctx(), h.election, won.Holder.Token+1, seen.Revision); err != nil || ok {
		t.Fatalf("Expire of another token = %v, %v; want false", ok, err)
	}
	if got := h.observe(b); got.Holder == nil || got.Holder.Token != won.Holder.Token {
		t.Fatalf("a refused Expire touched the key: %+v", got.Holder)
	}
	if ok, err := b.Expire(h.ctx(), h.election, won.Holder.Token, seen.Revision); err != nil || !ok {
		t.Fatalf("Expire as of the last write = %v, %v; want true", ok, err)
	}
	if got := h.observe(b); got.Holder != nil {
		t.Fatalf("the key is still held after Expire: %+v", got.Holder)
	}
}

// released checks that the successor b, which won with observation won, learns that the
// holder of term token (under lease) acknowledged its end, and why: from the campaign
// itself (PrevReleased and PrevWhy, which may consume the acknowledgement), or else from
// Released.
func (h *harness) released(won elector.Observation, b elector.Backend, token int64, lease elector.LeaseID, why, what string) {
	h.t.Helper()
	if won.PrevReleased && won.Prev == token {
		if won.PrevWhy != why {
			h.t.Fatalf("%s: the campaign's PrevWhy = %q, want %q", what, won.PrevWhy, why)
		}
		return
	}
	ok, got, err := b.Released(h.ctx(), h.election, token, lease)
	if err != nil || !ok {
		h.t.Fatalf("%s = %v, %v; want true", what, ok, err)
	}
	if got != why {
		h.t.Fatalf("%s: why = %q, want %q", what, got, why)
	}
}

// acknowledgementSaysWhy: the why of an acknowledgement, written by Acknowledge or
// Release, comes back to the successor as it was written, whichever way it learns of the
// acknowledgement. An empty why is how an instance of an older release acknowledges (the
// stores kept no reason then): it must still count as an acknowledgement.
func acknowledgementSaysWhy(t *testing.T, h *harness) {
	a, la, ttl := h.client()
	b, lb, _ := h.client()
	h.keepAlive(a, la, ttl) // the cases together outlast a ttl
	h.keepAlive(b, lb, ttl)
	for _, why := range []string{elector.EndedHandedOver, elector.EndedResigned, elector.EndedTransferred,
		elector.EndedKeyDeleted, elector.EndedDeadlineMissed, ""} {
		t.Run(strings.ReplaceAll(cmp.Or(why, "no reason"), " ", "_"), func(t *testing.T) {
			// A fresh election each, bound to this subtest.
			h := &harness{Harness: h.Harness, t: t, election: h.Election()}
			tok := h.win(a, la, "a").Holder.Token
			if err := a.Acknowledge(h.ctx(), h.election, tok, la, why); err != nil {
				t.Fatal(err)
			}
			ok, got, err := b.Released(h.ctx(), h.election, tok, 0)
			if err != nil || !ok || got != why {
				t.Fatalf("Released after Acknowledge(%q) = %v, %q, %v; want true, %q", why, ok, got, err, why)
			}
			// Consumed: the release of the same term acknowledges it anew.
			if err := a.Release(h.ctx(), h.election, tok, la, why); err != nil {
				t.Fatal(err)
			}
			h.released(h.win(b, lb, "b"), b, tok, 0, why, "Released after Release")
		})
	}
}
