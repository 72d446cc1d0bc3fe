package electortest_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/elector/electortest"
)

// otherTwo is the two members of a fleet of three other than m, in the fleet's order.
func otherTwo(f *electortest.Fleet, m *electortest.Member) (*electortest.Member, *electortest.Member) {
	var others []*electortest.Member
	for _, x := range f.Members {
		if x != m {
			others = append(others, x)
		}
	}
	return others[0], others[1]
}

// registryReads is how many times the members of f read the candidate registry so far.
func registryReads(f *electortest.Fleet) int64 {
	var n int64
	for _, c := range fleetClients(f) {
		n += c.CandidateReads()
	}
	return n
}

// awaitViews waits until every member of f lists all of f's members from its view of the
// registry, without reading it.
func awaitViews(t *testing.T, f *electortest.Fleet) {
	t.Helper()
	f.Await("every member's view of the registry", within, func() bool {
		for _, m := range f.Members {
			before := client(f, m).CandidateReads()
			list, err := m.Election.KnownCandidates(context.Background())
			if err != nil || len(list) != len(f.Members) || client(f, m).CandidateReads() != before {
				return false
			}
		}
		return true
	})
}

// viewingFleet starts a fake fleet of n whose clock runs, and waits until it has a leader
// and every member a view of the registry.
func viewingFleet(t *testing.T, n int) *electortest.Fleet {
	f, s := fakeFleet(t, n)
	keepTime(t, s)
	f.Leader(within)
	awaitViews(t, f)
	return f
}

// TestHandoversUseTheRegistryView: with every member's watch of the registry live, a
// transfer and a leader's shutdown read the registry nowhere in the fleet; a transfer to
// an instance the view does not list reads the store before it refuses; and while the
// watch is broken the registry is read as before.
func TestHandoversUseTheRegistryView(t *testing.T) {
	t.Parallel()
	t.Run("transfer_and_shutdown_read_no_registry", func(t *testing.T) {
		t.Parallel()
		f := viewingFleet(t, 3)
		leader, token := f.Leader(within)
		asker, target := otherTwo(f, leader)
		before := registryReads(f)
		if err := asker.Election.Transfer(context.Background(), target.ID, within); err != nil {
			t.Fatal(err)
		}
		next, token, _ := f.NewLeader(leader, token, within)
		if next != target {
			t.Fatalf("the transfer to %s made %s lead", target.ID, next.ID)
		}
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		if err := target.Candidate.Close(ctx); err != nil {
			t.Fatal(err)
		}
		f.NewLeader(target, token, within)
		if n := registryReads(f) - before; n != 0 {
			t.Fatalf("a transfer and a shutdown read the registry %d times", n)
		}
	})
	t.Run("transfer_to_an_unlisted_instance_reads_before_it_refuses", func(t *testing.T) {
		t.Parallel()
		f := viewingFleet(t, 2)
		m := f.Members[0]
		before := client(f, m).CandidateReads()
		err := m.Election.Transfer(context.Background(), "nobody", within)
		if !errors.Is(err, elector.ErrNotCandidate) {
			t.Fatalf("Transfer to an unknown instance = %v, want ErrNotCandidate", err)
		}
		if n := client(f, m).CandidateReads() - before; n != 1 {
			t.Fatalf("the refused transfer read the registry %d times, want once", n)
		}
	})
	t.Run("a_broken_watch_falls_back_to_reads", func(t *testing.T) {
		t.Parallel()
		f := viewingFleet(t, 2)
		m := f.Members[0]
		c := client(f, m)
		c.SetDown(errors.New("cut off"))
		f.Await("a read of the registry while the watch is broken", within, func() bool {
			before := c.CandidateReads()
			_, _ = m.Election.KnownCandidates(context.Background())
			return c.CandidateReads() == before+1
		})
		c.SetDown(nil)
		awaitViews(t, f)
	})
}

// registryAtRelease is a store client that reads the election's registry as each Release
// is sent: what a candidate that sees the vacancy at once and counts whom to yield to reads.
type registryAtRelease struct {
	*electortest.Client
	mu   sync.Mutex
	seen []elector.CandidateEntry
}

func (r *registryAtRelease) Release(ctx context.Context, election string, token int64, lease elector.LeaseID, why string) error {
	list, err := r.Client.Candidates(ctx, election)
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.seen = list
	r.mu.Unlock()
	return r.Client.Release(ctx, election, token, lease, why)
}

// TestRegistryStandsOutBeforeTheKeyGoes: a leader that resigns with a hold-off, or leaves,
// is listed as out of the election by the time its key is vacant. Announced after the
// release, candidates that read the registry at slightly different moments counted it
// differently when they yielded to higher priorities (the etcd TestPriority flake: a
// candidate of priority 1 campaigned as early as one of priority 2). A transfer's release
// needs no such announcement: its target does not yield.
func TestRegistryStandsOutBeforeTheKeyGoes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		resign  func(e *elector.Election) error
		healthy bool
	}{
		{"resign_with_hold_off", func(e *elector.Election) error { return e.Resign(context.Background(), time.Minute) }, false},
		{"resign_without_hold_off", func(e *elector.Election) error { return e.Resign(context.Background(), 0) }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := electortest.NewStore()
			var rs []*registryAtRelease
			f := electortest.StartFleet(t, electortest.FleetOptions{
				Size: 2,
				TTL:  ttl,
				Backend: func(testing.TB, int) elector.Backend {
					r := &registryAtRelease{Client: s.Client()}
					rs = append(rs, r)
					return r
				},
				Now: s.Now,
			})
			keepTime(t, s)
			leader, _ := f.Leader(within)
			if err := tc.resign(leader.Election); err != nil {
				t.Fatal(err)
			}
			var r *registryAtRelease
			for i, m := range f.Members {
				if m == leader {
					r = rs[i]
				}
			}
			r.mu.Lock()
			defer r.mu.Unlock()
			for _, en := range r.seen {
				var info elector.CandidateInfo
				if err := json.Unmarshal(en.Value, &info); err != nil {
					t.Fatal(err)
				}
				if en.ID == leader.ID && info.Healthy != tc.healthy {
					t.Fatalf("as its key went, the registry listed %s with healthy %v, want %v", leader.ID, info.Healthy, tc.healthy)
				}
				if en.ID == leader.ID {
					return
				}
			}
			t.Fatalf("as its key went, the registry did not list %s: %+v", leader.ID, r.seen)
		})
	}
}

// TestYieldOutlastsAStoreFailure: a candidate whose view lists a higher priority still
// yields to it when a store request of its yield fails: the read of the registry (it then
// counts from its view) or the watch of the key (it waits the whole wait). It campaigned
// at once, and won the vacancy from the higher one, whose link is slower.
func TestYieldOutlastsAStoreFailure(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, op string }{
		{"registry_read_fails", "Candidates"},
		{"watch_of_the_key_breaks", "Watch"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f, s := fakeFleet(t, 3)
			keepTime(t, s)
			leader, _ := f.Leader(within)
			high, low := otherTwo(f, leader)
			high.Candidate.SetPriority(3, false)
			low.Candidate.SetPriority(2, false)
			f.Await("low's view lists high's priority", within, func() bool {
				list, err := low.Election.KnownCandidates(context.Background())
				if err != nil {
					return false
				}
				for _, c := range list {
					if c.ID == high.ID {
						return c.Priority == 3 && c.Healthy
					}
				}
				return false
			})
			// low watches the key already: the next watch it starts is its yield's.
			client(f, low).Fail(tc.op, 1, errors.New("injected: request lost"))
			client(f, high).SetDelay(ttl / 20) // a step is ttl/4: high still comes first
			if err := leader.Election.Resign(context.Background(), time.Minute); err != nil {
				t.Fatal(err)
			}
			f.Await("a new leader", within, func() bool { return low.Election.Term().Holds() || high.Election.Term().Holds() })
			if low.Election.Term().Holds() {
				t.Fatalf("%s (priority 2) took the vacancy from %s (priority 3) after its %s failed", low.ID, high.ID, tc.op)
			}
		})
	}
}
