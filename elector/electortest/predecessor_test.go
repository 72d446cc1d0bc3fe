package electortest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/elector/electortest"
)

// TestNoSuccessorTrustsWhatItCannotProve: the leader P is cut off from the store (it admits
// until its own deadline) and an operator deletes the key. Whatever comes next, no instance
// may admit before P has certainly stopped. Each case is a sequence that once let a second
// leader in at once.
func TestNoSuccessorTrustsWhatItCannotProve(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		size int
		// next acts once the key is gone; it returns the members to watch besides the fleet.
		next func(t *testing.T, f *electortest.Fleet, s *electortest.Store, p *electortest.Member) []*electortest.Member
	}{
		{
			// The waiting winner resigns: its acknowledgement must not vouch for P.
			name: "waiting_winner_resigns",
			size: 3,
			next: func(t *testing.T, f *electortest.Fleet, s *electortest.Store, p *electortest.Member) []*electortest.Member {
				w := waitingWinner(t, f, p)
				ctx, cancel := context.WithTimeout(context.Background(), within)
				defer cancel()
				if err := w.Election.Resign(ctx, time.Hour); err != nil {
					t.Fatalf("resign of the waiting winner: %v", err)
				}
				return nil
			},
		},
		{
			// The waiting winner is asked to transfer, as POST /leader/default/transfer does.
			name: "waiting_winner_transfers",
			size: 3,
			next: func(t *testing.T, f *electortest.Fleet, s *electortest.Store, p *electortest.Member) []*electortest.Member {
				w := waitingWinner(t, f, p)
				var to *electortest.Member
				for _, m := range f.Members {
					if m != p && m != w {
						to = m
					}
				}
				if err := w.Election.Transfer(context.Background(), to.ID, within); err != nil {
					t.Fatalf("transfer from the waiting winner to %s: %v", to.ID, err)
				}
				return nil
			},
		},
		{
			// A second delete: the waiting winner's term ends unsettled.
			name: "key_deleted_again",
			size: 3,
			next: func(t *testing.T, f *electortest.Fleet, s *electortest.Store, p *electortest.Member) []*electortest.Member {
				waitingWinner(t, f, p)
				s.Delete("main")
				return nil
			},
		},
		{
			// The only live candidate has just started: it never saw P's term.
			name: "fresh_candidate_alone",
			size: 1,
			next: func(t *testing.T, f *electortest.Fleet, s *electortest.Store, p *electortest.Member) []*electortest.Member {
				return []*electortest.Member{startMember(t, s, "fresh")}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f, s := fakeFleet(t, tc.size)
			p, token := f.Leader(within)
			keepTime(t, s)
			client(f, p).SetDown(errors.New("cut off"))
			s.Delete("main")
			extra := tc.next(t, f, s, p)
			all := append(append([]*electortest.Member{}, f.Members...), extra...)
			// Sample until someone other than P leads under a newer term, and for a
			// while after: P and it must never admit at the same moment.
			var overlaps int
			deadline := time.Now().Add(within)
			var next *electortest.Member
			for next == nil || time.Since(deadline.Add(-within)) < 3*ttl {
				if time.Now().After(deadline) {
					t.Fatal("no new leader")
				}
				var leaders []*electortest.Member
				for _, m := range all {
					if m.Leading() {
						leaders = append(leaders, m)
						if m != p && m.Election.Term().Token > token {
							next = m
						}
					}
				}
				if len(leaders) > 1 {
					overlaps++
				}
				time.Sleep(time.Millisecond)
			}
			if overlaps > 0 {
				t.Fatalf("%d samples with two leaders: a successor admitted while the cut-off leader %s still did", overlaps, p.ID)
			}
		})
	}
}

// waitingWinner waits for a member other than p to hold the key while it still waits for p.
func waitingWinner(t *testing.T, f *electortest.Fleet, p *electortest.Member) *electortest.Member {
	t.Helper()
	var w *electortest.Member
	f.Await("a winner waiting for the cut-off leader", within, func() bool {
		for _, m := range f.Members {
			if tm := m.Election.Term(); m != p && tm.Holds() && tm.Settling {
				w = m
				return true
			}
		}
		return false
	})
	return w
}

// startMember starts one more candidate of election "main" on s, as a process started now.
func startMember(t *testing.T, s *electortest.Store, id string) *electortest.Member {
	t.Helper()
	c, err := elector.NewCandidate(elector.Config{
		ID: id, URL: "http://" + id + ".test:8080", TTL: ttl, DrainTimeout: time.Second,
		Backend: s.Client(), Logger: zaptest.NewLogger(t).Named(id), Now: s.Now,
	})
	if err != nil {
		t.Fatal(err)
	}
	m := &electortest.Member{ID: id, Candidate: c, Election: c.Election("main")}
	c.Start()
	m.Election.Start()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		c.Release(m.Election)
		_ = c.Close(ctx)
	})
	return m
}

// TestHistoryRecordsATermNobodyElseFollowed: a leader that resigns with nobody else to take
// over records its own ended term when it wins again.
func TestHistoryRecordsATermNobodyElseFollowed(t *testing.T) {
	t.Parallel()
	f, _ := fakeFleet(t, 1)
	m, token := f.Leader(within)
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	if err := m.Election.Resign(ctx, 0); err != nil {
		t.Fatal(err)
	}
	f.Await("the same instance leading a new term", within, func() bool {
		return m.Leading() && m.Election.Term().Token > token
	})
	f.Await("the resigned term in the history", within, func() bool {
		h, err := m.Election.History(ctx)
		return err == nil && len(h) == 1 && h[0].Token == token && h[0].Leader == m.ID && h[0].Ended == elector.EndedResigned
	})
}

// TestHistoryRecordsATermBeforeAFleetRestart: every instance stops (each hands over
// cleanly) and a new fleet starts on the same store. The first new leader never saw the last
// term, but the store names it: the history records it, as handed over, under an unknown
// leader, rather than losing it.
func TestHistoryRecordsATermBeforeAFleetRestart(t *testing.T) {
	t.Parallel()
	f, s := fakeFleet(t, 2)
	keepTime(t, s)
	leader, token := f.Leader(within)
	// The follower first, so that nobody takes over from the leader.
	for _, m := range []*electortest.Member{aPeer(f, leader), leader} {
		ctx, cancel := context.WithTimeout(context.Background(), within)
		m.Candidate.Release(m.Election)
		_ = m.Candidate.Close(ctx)
		cancel()
	}
	next := startMember(t, s, "restarted")
	f.Await("the restarted instance leading", within, func() bool { return next.Leading() })
	f.Await("the last term before the restart in the history", within, func() bool {
		h, err := next.Election.History(context.Background())
		if err != nil || len(h) == 0 {
			return false
		}
		last := h[len(h)-1]
		return last.Token == token && last.Ended == elector.EndedHandedOver && last.Successor == "restarted"
	})
}

// TestSuccessorStartsWhenTheLateProofLands: an operator deletes the key of a leader that
// hears of it late (its link to the store is slow). The leader stops and acknowledges as
// soon as it hears; the successor waiting for it starts the moment that acknowledgement
// lands, not at the leader's heartbeat deadline.
func TestSuccessorStartsWhenTheLateProofLands(t *testing.T) {
	t.Parallel()
	f, s := fakeFleet(t, 3)
	keepTime(t, s)
	leader, token := f.Leader(within)
	const late = 300 * time.Millisecond
	client(f, leader).SetDelay(late)
	time.Sleep(ttl / 2) // a heartbeat or two through the slow link
	deleted := time.Now()
	s.Delete("main")
	next, _, _ := f.NewLeader(leader, token, within)
	t.Logf("%s led %s after the delete (the old leader hears %s late)", next.ID, time.Since(deleted).Round(time.Millisecond), late)
	if why := next.Election.Term().Reason; why != "elected" {
		t.Fatalf("the successor began because %q: it waited out the heartbeat deadline rather than take the acknowledgement", why)
	}
}

// TestSuccessorOfAnUnseenTermTakesItsAcknowledgement: c saw a's term, then was cut off from
// the store while a handed over to b and b handed over in turn, so that it wins the key with
// the store naming b's term, which it never saw, as the one before its own (a short term
// between two polls of a PostgreSQL watch does the same). b acknowledged its end, which
// vouches for every term before it: c admits on it at once. The store's clock stands still,
// so a successor that waited out a ttl instead would never admit here.
func TestSuccessorOfAnUnseenTermTakesItsAcknowledgement(t *testing.T) {
	t.Parallel()
	f, _ := fakeFleet(t, 3)
	a, _ := f.Leader(within)
	b, c := otherTwo(f, a)
	f.Await("c sees a lead", within, func() bool { return c.Election.Term().Leader.ID == a.ID })
	client(f, c).SetDown(errors.New("cut off"))
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	if err := a.Election.Resign(ctx, time.Hour); err != nil {
		t.Fatalf("a's resign: %v", err)
	}
	f.Await("b leads", within, b.Leading)
	if err := b.Election.Resign(ctx, time.Hour); err != nil {
		t.Fatalf("b's resign: %v", err)
	}
	client(f, c).SetDown(nil)
	f.Await("c leads on b's acknowledgement", within, c.Leading)
	if why := c.Election.Term().Reason; why != "elected" {
		t.Errorf("c leads for %q, want elected (on its predecessor's acknowledgement)", why)
	}
}

// TestLostCampaignAnswerOwesEveryUnseenTerm: A leads and resigns; B wins and admits; B is
// cut off from the store and an operator deletes its key; then the campaign of C, slow all
// along, lands, but its answer is lost. C's retry finds the key held under its own lease,
// and the store names no term before it: C must not prove its term against A, the last
// one it saw, while B still admits. Once with A's acknowledgement kept (as PostgreSQL and
// this store keep it) and once consumed by B's campaign (as etcd and Kubernetes do: C would
// then wait for A's deadline, earlier than B's).
func TestLostCampaignAnswerOwesEveryUnseenTerm(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		consumeAck bool
	}{
		{name: "acknowledgement_kept"},
		{name: "acknowledgement_consumed", consumeAck: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f, s := fakeFleet(t, 3)
			keepTime(t, s)
			a, tokenA := f.Leader(within)
			leaseA := observe(t, s).Holder.Lease
			var peers []*electortest.Member
			for _, m := range f.Members {
				if m != a {
					peers = append(peers, m)
				}
			}
			c := peers[1]
			// C hears of A's end late and its campaign arrives later still: B wins first.
			client(f, c).SetDelay(ttl / 10)
			client(f, c).LoseAnswer("Campaign", 1, context.DeadlineExceeded)
			ctx, cancel := context.WithTimeout(context.Background(), within)
			defer cancel()
			if err := a.Election.Resign(ctx, time.Hour); err != nil {
				t.Fatalf("resign: %v", err)
			}
			b, tokenB, _ := f.NewLeader(a, tokenA, within)
			if b == c {
				t.Fatal("the slow candidate won first; the sequence needs the other one")
			}
			if tc.consumeAck {
				if _, _, err := s.Client().Released(ctx, "main", tokenA, leaseA); err != nil {
					t.Fatalf("consume A's acknowledgement: %v", err)
				}
			}
			client(f, b).SetDown(errors.New("cut off"))
			s.Delete("main")
			// B admits until its last heartbeat's window runs out, whatever it hears now.
			now := s.Now()
			bEnd := now.Add(b.Election.Term().Remaining(now))
			var cStart time.Time
			f.Await("C leading after its lost answer", within, func() bool {
				cStart = s.Now()
				return c.Leading() && c.Election.Term().Token > tokenB
			})
			if cStart.Before(bEnd) {
				t.Fatalf("C (term %d) admitted %v before B (term %d) stopped", c.Election.Term().Token, bEnd.Sub(cStart), tokenB)
			}
		})
	}
}
