package electortest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/elector/electortest"
)

// Failsafe mode on the fake store: the store goes away (every request fails with an
// unreachable error) while the candidates still reach each other over an in-memory mesh.
// The fleet's watchdog fails every test in which two members admit at once.

var errDown = fmt.Errorf("connection refused: %w", elector.ErrUnreachable)

// rosterReady waits until leader leads a failsafe-ready term: its roster, listing all n
// members, is confirmed in the store.
func rosterReady(t *testing.T, f *electortest.Fleet, leader *electortest.Member, n int) {
	t.Helper()
	f.Await("a confirmed roster of every member", within, func() bool {
		return len(leader.Election.Failsafe().Roster) == n
	})
}

// leadsThroughout fails the test unless m leads at every sample for d (real time, which
// keepTime turns into as much store time).
func leadsThroughout(t *testing.T, m *electortest.Member, d time.Duration) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if !m.Leading() {
			t.Fatalf("%s stopped leading %s before the end: %s", m.ID, time.Until(end), m.Election.Term().Reason)
		}
	}
}

// failsafeReady starts a fleet of n with failsafe mode over a mesh, on a store whose clock
// runs, and waits until its leader leads a failsafe-ready term.
func failsafeReady(t *testing.T, n int) (*electortest.Mesh, *electortest.Fleet, *electortest.Store, *electortest.Member, int64) {
	t.Helper()
	mesh := electortest.NewMesh()
	f, s := meshedFleet(t, n, mesh)
	keepTime(t, s)
	leader, token := f.Leader(within)
	rosterReady(t, f, leader, n)
	return mesh, f, s, leader, token
}

// aPeer is a member of f other than leader.
func aPeer(f *electortest.Fleet, leader *electortest.Member) *electortest.Member {
	for _, m := range f.Members {
		if m != leader {
			return m
		}
	}
	return nil
}

// cutFromStore cuts every member of f off from the store; a candidate started later still
// reaches it.
func cutFromStore(f *electortest.Fleet) {
	for _, m := range f.Members {
		client(f, m).SetDown(errDown)
	}
}

func TestFailsafeOutage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		failsafe bool
	}{
		{name: "with_failsafe_the_leader_leads_throughout", failsafe: true},
		{name: "without_failsafe_nobody_leads_after_a_ttl", failsafe: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var mesh *electortest.Mesh
			if tc.failsafe {
				mesh = electortest.NewMesh()
			}
			f, s := meshedFleet(t, 3, mesh)
			keepTime(t, s)
			leader, token := f.Leader(within)
			if tc.failsafe {
				rosterReady(t, f, leader, 3)
			}
			s.SetDown(errDown)
			if !tc.failsafe {
				f.Await("every member stopping", 2*ttl, func() bool { return len(f.Leaders()) == 0 })
				return
			}
			leadsThroughout(t, leader, 4*ttl)
			if got := leader.Election.Term().Token; got != token {
				t.Fatalf("token changed during the failsafe: %d, was %d", got, token)
			}
			st := leader.Election.Failsafe()
			if !st.Active || st.Rounds < 6 || st.Refused != 0 {
				t.Fatalf("failsafe status %+v: want active, about one round every ttl/3, none refused", st)
			}
			for _, m := range f.Members {
				if m != leader && m.Election.Failsafe().Confirming != token {
					t.Fatalf("%s does not keep term %d alive: %+v", m.ID, token, m.Election.Failsafe())
				}
			}
			// The store is back, the lease long gone in it: a new term, a greater token.
			s.SetDown(nil)
			f.Await("a new term", 4*ttl, func() bool {
				l := f.Leaders()
				return len(l) == 1 && l[0].Election.Term().Token > token
			})
			f.Await("the failsafe ending", within, func() bool { return !leader.Election.Failsafe().Active })
		})
	}
}

// One peer that cannot be reached ends the admission at once, and nobody leads until the
// store is back.
func TestFailsafeRefusalStopsAdmission(t *testing.T) {
	t.Parallel()
	mesh, f, s, leader, token := failsafeReady(t, 3)
	s.SetDown(errDown)
	leadsThroughout(t, leader, ttl)
	peer := aPeer(f, leader)
	mesh.Cut(leader.ID, peer.ID, true)
	cut := time.Now()
	// The next round (within ttl/3) is refused; a round takes up to ttl/4.
	f.Await("the leader stopping", ttl, func() bool { return !leader.Leading() })
	t.Logf("stopped admitting %s after the cut", time.Since(cut).Round(time.Millisecond))
	// The cut peer's confirmation runs out; then the store comes back for it alone.
	time.Sleep(ttl + ttl/2)
	client(f, peer).SetDown(nil)
	s.SetDown(nil)
	for _, m := range f.Members {
		if m != peer {
			client(f, m).SetDown(errDown)
		}
	}
	next, tok, _ := f.NewLeader(leader, token, 4*ttl)
	if next != peer {
		t.Fatalf("%s leads; only %s reaches the store", next.ID, peer.ID)
	}
	if leader.Leading() {
		t.Fatalf("the old leader still leads beside term %d", tok)
	}
}

// A peer that keeps a term alive does not campaign, even when the store is back for it and
// the key is vacant.
func TestFailsafePeerDoesNotCampaignWhileConfirming(t *testing.T) {
	t.Parallel()
	_, f, _, leader, token := failsafeReady(t, 3)
	cutFromStore(f)
	// The leader's lease runs out in the store; one peer gets the store back.
	time.Sleep(ttl + ttl/2)
	peer := aPeer(f, leader)
	client(f, peer).SetDown(nil)
	leadsThroughout(t, leader, 3*ttl)
	if peer.Election.Term().Holds() {
		t.Fatalf("%s took the key while it kept term %d alive", peer.ID, token)
	}
}

// A newcomer that is not in the roster wins the vacant key while the old leader rides out
// the outage: it admits only after a roster member promised to confirm the old term no
// more and that member's last confirmation ran out, and the old leader stops first. A
// newcomer without failsafe mode of its own (configured apart from the fleet) fences the
// roster just the same.
func TestFailsafeNewcomerWaitsForFence(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		configure func(*elector.Config, *electortest.Mesh)
	}{
		{"with_failsafe", func(c *elector.Config, mesh *electortest.Mesh) {
			c.Failsafe = &elector.FailsafeConfig{URL: electortest.MeshURL(c.ID), Transport: mesh.From(c.ID)}
		}},
		{"without_failsafe", fenceOnly},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			newcomerWaitsForFence(t, tc.configure)
		})
	}
}

func newcomerWaitsForFence(t *testing.T, configure func(*elector.Config, *electortest.Mesh)) {
	mesh, f, s, leader, token := failsafeReady(t, 2)
	cutFromStore(f)
	time.Sleep(ttl + ttl/2) // the old leader's lease runs out in the store
	e, _ := startNewcomer(t, s, mesh, "newcomer", configure)
	won := time.Now()
	var both int
	for time.Since(won) < 4*ttl {
		_, newcomer := e.Check()
		if newcomer && leader.Leading() {
			both++
		}
		if newcomer {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if _, ok := e.Check(); !ok {
		t.Fatalf("the newcomer never led: %+v", e.Term())
	}
	if both > 0 || leader.Leading() {
		t.Fatalf("the old leader and the newcomer admitted at once (%d samples); old leader %+v %+v", both, leader.Election.Term(), leader.Election.Failsafe())
	}
	if got := e.Term().Token; got <= token {
		t.Fatalf("newcomer's token %d not above %d", got, token)
	}
}

// startNewcomer starts candidate id of election "main" on s, reachable on mesh, configured
// by configure; it returns its election and its store client.
func startNewcomer(t *testing.T, s *electortest.Store, mesh *electortest.Mesh, id string,
	configure func(*elector.Config, *electortest.Mesh)) (*elector.Election, *electortest.Client) {
	t.Helper()
	sc := s.Client()
	cfg := elector.Config{
		ID: id, TTL: ttl, Backend: sc, Now: s.Now,
		Logger: zaptest.NewLogger(t).Named(id),
	}
	configure(&cfg, mesh)
	c, err := elector.NewCandidate(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mesh.Add(id, c)
	e := c.Election("main")
	c.Start()
	e.Start()
	t.Cleanup(func() {
		sc.SetDown(nil)
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		c.Release(e)
		_ = c.Close(ctx)
	})
	return e, sc
}

// fenceOnly configures a candidate without failsafe mode that fences other terms' rosters.
func fenceOnly(c *elector.Config, mesh *electortest.Mesh) { c.Fence = mesh.From(c.ID) }

// A term of a candidate without failsafe mode retires the failsafe roster once it has
// settled: after the fleet that wrote it is gone, a crash of that leader is followed by a
// successor that need not (and could not) fence anyone.
func TestFailsafeRosterRetiredBySettledTerm(t *testing.T) {
	t.Parallel()
	mesh, f, s, _, _ := failsafeReady(t, 2)
	first, firstClient := startNewcomer(t, s, mesh, "first", fenceOnly)
	for _, m := range f.Members { // the failsafe fleet leaves for good
		ctx, cancel := context.WithTimeout(context.Background(), within)
		m.Candidate.Release(m.Election)
		_ = m.Candidate.Close(ctx)
		cancel()
	}
	f.Await("the newcomer leading", within, func() bool { _, ok := first.Check(); return ok })
	time.Sleep(ttl / 2)          // its roster write
	firstClient.SetDown(errDown) // it crashes, as far as the store can tell
	second, _ := startNewcomer(t, s, mesh, "second", fenceOnly)
	f.Await("a successor of the crashed newcomer leading", 3*within, func() bool {
		_, ok := second.Check()
		return ok
	})
	if _, ok := first.Check(); ok {
		t.Fatal("the crashed newcomer still admits beside its successor")
	}
}

func TestUnreachable(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{name: "wrapped_sentinel", err: errDown, want: true},
		{name: "deadline", err: fmt.Errorf("renew: %w", context.DeadlineExceeded), want: true},
		{name: "lease_not_found", err: elector.ErrLeaseNotFound, want: false},
		{name: "rewound", err: fmt.Errorf("%w", elector.ErrStoreRewound), want: false},
		{name: "other", err: errors.New("permission denied"), want: false},
		{name: "nil", err: nil, want: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := elector.Unreachable(electortest.NewStore().Client(), tc.err); got != tc.want {
				t.Fatalf("Unreachable(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

// A question that does not carry the term's MAC is refused, and changes nothing.
func TestFailsafeAnswerRefusesForgeries(t *testing.T) {
	t.Parallel()
	f, s := meshedFleet(t, 2, electortest.NewMesh())
	keepTime(t, s)
	leader, token := f.Leader(within)
	peer := aPeer(f, leader)
	for _, tc := range []struct {
		name, body, want string
	}{
		{name: "wrong_mac", body: fmt.Sprintf(`{"kind":"confirm","election":"main","token":%d,"from":%q,"to":%q,"ttl":%d,"at":%d,"nonce":"n","mac":"AAAA"}`,
			token, leader.ID, peer.ID, int64(ttl), time.Now().UnixNano()), want: "not authenticated"},
		{name: "unknown_term", body: fmt.Sprintf(`{"kind":"confirm","election":"main","token":%d,"from":%q,"to":%q,"ttl":%d,"at":%d,"nonce":"n"}`,
			token+100, leader.ID, peer.ID, int64(ttl), time.Now().UnixNano()), want: "unknown term"},
		{name: "other_election", body: `{"kind":"confirm","election":"other"}`, want: "not a candidate in this election"},
		{name: "not_json", body: `confirm`, want: "malformed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r struct {
				Accepted bool   `json:"accepted"`
				Reason   string `json:"reason"`
				MAC      []byte `json:"mac"`
			}
			if err := json.Unmarshal(peer.Candidate.FailsafeAnswer(context.Background(), []byte(tc.body)), &r); err != nil {
				t.Fatal(err)
			}
			if r.Accepted || r.Reason != tc.want || r.MAC != nil {
				t.Fatalf("answer %+v, want a refusal %q without a MAC", r, tc.want)
			}
			if st := peer.Election.Failsafe(); st.Confirming != 0 {
				t.Fatalf("%s keeps term %d alive after a forged question", peer.ID, st.Confirming)
			}
		})
	}
}

// A candidate that fences other terms' rosters, started less than a ttl ago, takes over at
// once once the old term acknowledged its end, when the store holds no roster a term could
// ride a failsafe with: whatever an earlier process of its id confirmed, nobody rides on
// it. The store's clock stops once the newcomer has started, so a wait for its first ttl
// would never end. The old leader acknowledges only after the newcomer won (it is cut off
// from the store when an operator deletes its key), as on a store whose release and
// acknowledgement are two writes.
func TestFencingNewcomerWithoutRosterTakesOverAtOnce(t *testing.T) {
	t.Parallel()
	s := electortest.NewStore()
	mesh := electortest.NewMesh()
	stopClock := keepTime(t, s) // the first leader waits a ttl for terms it cannot see
	old, oldClient := startNewcomer(t, s, mesh, "old", fenceOnly)
	awaitLeading(t, old)
	e, _ := startNewcomer(t, s, mesh, "new", fenceOnly)
	stopClock()
	awaitTrue(t, "the newcomer sees the old leader", func() bool { return e.Term().Leader.ID == "old" })
	token := old.Term().Token
	old.Candidate().SetPriority(elector.NeverLead, false)
	oldClient.SetDown(errDown)
	s.Delete("main")
	awaitTrue(t, "the newcomer wins", func() bool { return e.Term().Token > token })
	oldClient.SetDown(nil)
	awaitLeading(t, e)
	if _, ok := old.Check(); ok {
		t.Fatal("the old leader and the newcomer admit at once")
	}
}

// awaitLeading waits until e admits.
func awaitLeading(t *testing.T, e *elector.Election) {
	t.Helper()
	awaitTrue(t, e.Name()+" admits", func() bool { _, ok := e.Check(); return ok })
}

// awaitTrue waits up to within for cond.
func awaitTrue(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(within); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%s did not happen within %s", what, within)
		}
	}
}

// TestFailsafeRosterConfirmedOnlyOnceStored: a leader whose roster write fails must not
// confirm that roster with its next heartbeat (a winner reading the store would find no
// roster of its term, owe no fence, and admit while it rides an outage on it); it writes
// the roster again, and confirms the one the store took.
func TestFailsafeRosterConfirmedOnlyOnceStored(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		fail func(c *electortest.Client)
	}{
		{"write_refused", func(c *electortest.Client) { c.Fail("AppendHistory", 2, errDown) }},
		{"answer_lost", func(c *electortest.Client) { c.LoseAnswer("AppendHistory", 2, context.DeadlineExceeded) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, f, s, leader, token := failsafeReady(t, 2)
			peer := aPeer(f, leader)
			tc.fail(client(f, peer))
			ctx, cancel := context.WithTimeout(context.Background(), within)
			defer cancel()
			if err := leader.Election.Resign(ctx, time.Hour); err != nil {
				t.Fatalf("resign: %v", err)
			}
			_, tokenP, _ := f.NewLeader(leader, token, within)
			rosterReady(t, f, peer, 2)
			c := s.Client()
			defer c.Close()
			list, err := c.History(ctx, "main/failsafe-roster")
			if err != nil || len(list) == 0 {
				t.Fatalf("read the rosters: %d, %v", len(list), err)
			}
			var last struct{ Token int64 }
			if err := json.Unmarshal(list[len(list)-1], &last); err != nil || last.Token != tokenP {
				t.Fatalf("term %d confirmed a roster the store does not hold; newest stored is term %d (%v)", tokenP, last.Token, err)
			}
		})
	}
}

// A leader alone in its roster rides out no outage: nobody could fence its term, and the
// next process under its id (which asks nobody under its own id) would wait for a fence
// forever. A leader that rides alone keeps admitting with the store gone, and fails the
// first half.
func TestFailsafeLoneLeaderDoesNotRide(t *testing.T) {
	t.Parallel()
	mesh, f, s, leader, token := failsafeReady(t, 1)
	cutFromStore(f)
	f.Await("the lone leader to stop admitting without the store", 3*ttl, func() bool { return !leader.Leading() })
	if st := leader.Election.Failsafe(); st.Active || st.Rounds > 0 {
		t.Fatalf("the lone leader rode a failsafe: %+v", st)
	}
	// Its next process (same id, same failsafe URL) takes over once the lease is gone.
	next, _ := startNewcomer(t, s, mesh, leader.ID, func(c *elector.Config, mesh *electortest.Mesh) {
		c.Failsafe = &elector.FailsafeConfig{URL: electortest.MeshURL(c.ID), Transport: mesh.From(c.ID)}
	})
	nexts := func() []*elector.Election { return []*elector.Election{next} }
	if both := overlapWhile(ttl, leader, nexts); both > 0 {
		t.Fatalf("%d samples with the lone leader and its next process admitting at once", both)
	}
	f.Await("the next process leading", 3*within, func() bool { _, ok := next.Check(); return ok })
	if got := next.Term().Token; got <= token {
		t.Fatalf("the next process leads with token %d, not above %d", got, token)
	}
	if leader.Leading() {
		t.Fatal("the lone leader admits beside its next process")
	}
}
