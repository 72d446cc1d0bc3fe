package electortest_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/elector/electortest"
)

// One proof on every path: a leader L rides out a store outage on its failsafe, with its
// peer B confirming; both are cut off from the store but reach each other. Whatever the
// store's side does meanwhile, nobody there may admit while L does. Each case is a
// sequence in which a path once skipped the failsafe part of the proof.

// overlapWhile samples, every millisecond for d, whether old admits at the same moment as
// any of others; it returns how many samples saw both.
func overlapWhile(d time.Duration, old *electortest.Member, others func() []*elector.Election) int {
	var both int
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(time.Millisecond) {
		if !old.Leading() {
			continue
		}
		for _, e := range others() {
			if _, ok := e.Check(); ok {
				both++
				break
			}
		}
	}
	return both
}

// ridingFailsafe starts a failsafe fleet of two, cuts it off from the store, and waits
// until its leader's lease has run out in the store, so that the key is free on the store's
// side while the leader still admits.
func ridingFailsafe(t *testing.T) (*electortest.Mesh, *electortest.Fleet, *electortest.Store, *electortest.Member) {
	t.Helper()
	mesh, f, s, leader, _ := failsafeReady(t, 2)
	cutFromStore(f)
	time.Sleep(ttl + ttl/2)
	if !leader.Leading() {
		t.Fatalf("the leader does not ride out the outage: %+v", leader.Election.Failsafe())
	}
	return mesh, f, s, leader
}

// isolated configures a candidate without failsafe mode that fences rosters but reaches no
// member of the riding fleet (cut on the mesh).
func isolated(f *electortest.Fleet) func(*elector.Config, *electortest.Mesh) {
	return func(c *elector.Config, mesh *electortest.Mesh) {
		fenceOnly(c, mesh)
		for _, m := range f.Members {
			mesh.Cut(c.ID, m.ID, true)
		}
	}
}

// TestFailsafeProofIsInherited (issue case 2): W, without failsafe, wins on the store's side
// but cannot fence the riding fleet, so it admits nothing. Then W's term ends in an
// ordinary way. Neither W's next term nor any instance that follows it may admit while L
// rides, and once the mesh heals, the store's side leads again.
func TestFailsafeProofIsInherited(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// end ends the waiting term of w (started as id "w"); it returns the elections
		// that may lead next on the store's side.
		end func(t *testing.T, s *electortest.Store, mesh *electortest.Mesh, f *electortest.Fleet, w *elector.Election) []*elector.Election
	}{
		{"operator_deletes_the_key", func(t *testing.T, s *electortest.Store, _ *electortest.Mesh, _ *electortest.Fleet, w *elector.Election) []*elector.Election {
			s.Delete("main")
			return []*elector.Election{w}
		}},
		{"waiting_winner_resigns", func(t *testing.T, _ *electortest.Store, _ *electortest.Mesh, _ *electortest.Fleet, w *elector.Election) []*elector.Election {
			ctx, cancel := context.WithTimeout(context.Background(), ttl/2)
			defer cancel()
			if err := w.Resign(ctx, 0); !errors.Is(err, elector.ErrUnproven) {
				t.Fatalf("resign of a term that cannot prove its predecessors stopped: %v, want ErrUnproven", err)
			}
			return []*elector.Election{w}
		}},
		{"waiting_winner_restarts", func(t *testing.T, s *electortest.Store, mesh *electortest.Mesh, f *electortest.Fleet, w *elector.Election) []*elector.Election {
			ctx, cancel := context.WithTimeout(context.Background(), ttl/2)
			defer cancel()
			w.Candidate().Release(w)
			_ = w.Candidate().Close(ctx)
			again, _ := startNewcomer(t, s, mesh, "w", isolated(f))
			return []*elector.Election{again}
		}},
		{"another_instance_follows", func(t *testing.T, s *electortest.Store, mesh *electortest.Mesh, f *electortest.Fleet, w *elector.Election) []*elector.Election {
			x, _ := startNewcomer(t, s, mesh, "x", isolated(f))
			s.Delete("main")
			return []*elector.Election{w, x}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			mesh, f, s, leader := ridingFailsafe(t)
			w, _ := startNewcomer(t, s, mesh, "w", isolated(f))
			f.Await("w holding the key, waiting for a fence", within, func() bool {
				tm := w.Term()
				return tm.Holds() && tm.Settling
			})
			// Past the heartbeat deadline of every term before w: only the failsafe
			// fence is still owed.
			time.Sleep(ttl + ttl/2)
			if !w.Term().Settling {
				t.Fatal("w admits without having fenced the riding fleet")
			}
			next := tc.end(t, s, mesh, f, w)
			if both := overlapWhile(2*ttl, leader, func() []*elector.Election { return next }); both > 0 {
				t.Fatalf("%d samples with the failsafe leader and a store-side term admitting at once", both)
			}
			// The mesh heals: a fence reaches B, which stops confirming; L stops, and a
			// term on the store's side leads.
			for _, e := range next {
				for _, m := range f.Members {
					mesh.Cut(e.Term().Self, m.ID, false)
				}
			}
			var winner *elector.Election
			f.Await("a store-side leader once the fleet can be fenced", 3*within, func() bool {
				for _, e := range next {
					if _, ok := e.Check(); ok {
						winner = e
						return true
					}
				}
				return false
			})
			if leader.Leading() {
				t.Fatalf("the failsafe leader still admits beside %s", winner.Term().Self)
			}
		})
	}
}

// TestFailsafeTwinIsFenced (issue case 1): a process started again under the leader's own
// instance_id on the store's side is not the leader: it fences the roster like any
// newcomer, and admits only once the leader has stopped.
func TestFailsafeTwinIsFenced(t *testing.T) {
	t.Parallel()
	mesh, f, s, leader := ridingFailsafe(t)
	twin, _ := startNewcomer(t, s, mesh, leader.ID, func(c *elector.Config, mesh *electortest.Mesh) {
		c.Failsafe = &elector.FailsafeConfig{URL: electortest.MeshURL(c.ID), Transport: mesh.From(c.ID)}
	})
	twins := func() []*elector.Election { return []*elector.Election{twin} }
	if both := overlapWhile(2*ttl, leader, twins); both > 0 {
		t.Fatalf("%d samples with the leader and its twin (same instance_id, another process) admitting at once", both)
	}
	f.Await("the twin leading once the roster is fenced", 3*within, func() bool { _, ok := twin.Check(); return ok })
	if leader.Leading() {
		t.Fatal("the leader still admits beside its twin")
	}
}

// TestFailsafeLateEndIsIgnored (issue case 3): the end of an earlier failsafe, delivered
// again while the leader rides a new one, does not cancel the peer's confirmation, so a
// newcomer's fence still waits it out.
func TestFailsafeLateEndIsIgnored(t *testing.T) {
	t.Parallel()
	mesh, f, s, leader, _ := failsafeReady(t, 2)
	peer := aPeer(f, leader)
	// A first outage, short enough that the leader's lease outlives it in the store:
	// ridden out and ended, and the leader tells the peer so.
	s.SetDown(errDown)
	f.Await("the first failsafe", within, func() bool { return leader.Election.Failsafe().Active })
	s.SetDown(nil)
	var end []byte
	f.Await("the end of the first failsafe reaching the peer", 3*within, func() bool {
		for _, b := range mesh.Sent(peer.ID) {
			var m struct{ Kind string }
			if json.Unmarshal(b, &m) == nil && m.Kind == "end" {
				end = b
				return true
			}
		}
		return false
	})
	// At once a second outage, while the end is fresh enough to pass as genuine. A
	// newcomer on the store's side, which the leader's roster does not list (it starts
	// after the cut), sees the key fall silent and takes it over a ttl later: by then
	// the leader's heartbeats are certainly over, and only the fence stands between
	// them. Meanwhile the old end reaches the peer again.
	cutFromStore(f)
	newcomer, _ := startNewcomer(t, s, mesh, "newcomer", fenceOnly)
	f.Await("the second failsafe, confirmed by the peer", within, func() bool {
		return leader.Election.Failsafe().Active && peer.Election.Failsafe().ConfirmingFor > 0
	})
	peer.Candidate.FailsafeAnswer(context.Background(), end)
	if st := peer.Election.Failsafe(); st.ConfirmingFor <= 0 {
		t.Fatalf("a replayed end cancelled the live confirmation: %+v", st)
	}
	if both := overlapWhile(2*ttl, leader, func() []*elector.Election { return []*elector.Election{newcomer} }); both > 0 {
		t.Fatalf("%d samples with the failsafe leader and the newcomer admitting at once", both)
	}
	f.Await("the newcomer leading", 3*within, func() bool { _, ok := newcomer.Check(); return ok })
}

// TestRosterWithoutFailsafeMemberNeedsNoFence (issue case 6): a roster that lists a member
// without a failsafe endpoint never carried a failsafe (that member refuses every round),
// so a newcomer that cannot reach its members is not stuck on it.
func TestRosterWithoutFailsafeMemberNeedsNoFence(t *testing.T) {
	t.Parallel()
	mesh, f, s, leader, _ := failsafeReady(t, 2)
	startNewcomer(t, s, mesh, "plain", func(c *elector.Config, _ *electortest.Mesh) { c.Priority = elector.NeverLead })
	f.Await("a roster that lists the member without failsafe", within, func() bool {
		return len(leader.Election.Failsafe().Roster) == 3
	})
	cutFromStore(f) // the whole failsafe fleet is gone, as far as the store can tell
	for _, m := range f.Members {
		mesh.Cut(m.ID, "newcomer", true)
	}
	newcomer, _ := startNewcomer(t, s, mesh, "newcomer", fenceOnly)
	f.Await("the newcomer leading without an answer to its fence", 3*within, func() bool {
		_, ok := newcomer.Check()
		return ok
	})
	if leader.Leading() {
		t.Fatal("the old leader admits beside the newcomer")
	}
}
