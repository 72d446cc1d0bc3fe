package electortest_test

import (
	"context"
	"errors"
	"testing"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/elector/electortest"
)

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
		var asker, target *electortest.Member
		for _, m := range f.Members {
			switch {
			case m == leader:
			case asker == nil:
				asker = m
			default:
				target = m
			}
		}
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
