package pgbackend

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/elector/electortest"
	"github.com/caddyleader/caddy-leader/internal/testkit/pgtest"
)

// countingBackend counts the reads of the candidate registry.
type countingBackend struct {
	*Backend
	reads *atomic.Int64
}

func (c countingBackend) Candidates(ctx context.Context, election string) ([]elector.CandidateEntry, error) {
	c.reads.Add(1)
	return c.Backend.Candidates(ctx, election)
}

// TestHandoversReadNoRegistry: on PostgreSQL, once every candidate's watch of the registry
// has reported, a resign and a transfer read the registry nowhere in the fleet (the
// yields and the transfer's check use the view), with LISTEN and with polling alone.
func TestHandoversReadNoRegistry(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	const ttl = 2 * time.Second
	server := pgtest.Start(t)
	for _, cfg := range []Config{{}, {DisableListen: true}} {
		t.Run(fmt.Sprintf("disable_listen=%v", cfg.DisableListen), func(t *testing.T) {
			var reads atomic.Int64
			f := electortest.StartFleet(t, electortest.FleetOptions{Size: 3, TTL: ttl, Election: fmt.Sprintf("views-%v", cfg.DisableListen),
				Backend: func(tb testing.TB, _ int) elector.Backend {
					c := cfg
					c.DSN = server.DSN()
					b, err := New(c)
					if err != nil {
						tb.Fatal(err)
					}
					return countingBackend{b, &reads}
				}})
			leader, token := f.Leader(ttl + 10*time.Second)
			f.Await("every candidate's view of the registry", 10*time.Second, func() bool {
				for _, m := range f.Members {
					before := reads.Load()
					list, err := m.Election.KnownCandidates(context.Background())
					if err != nil || len(list) != len(f.Members) || reads.Load() != before {
						return false
					}
				}
				return true
			})
			before := reads.Load()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := leader.Election.Resign(ctx, time.Hour); err != nil {
				t.Fatal(err)
			}
			next, token, _ := f.NewLeader(leader, token, 10*time.Second)
			var target *electortest.Member
			for _, m := range f.Members {
				if m != leader && m != next {
					target = m
				}
			}
			if err := leader.Election.Transfer(ctx, target.ID, 10*time.Second); err != nil {
				t.Fatal(err)
			}
			f.NewLeader(next, token, 10*time.Second)
			if n := reads.Load() - before; n != 0 {
				t.Fatalf("a resign and a transfer read the registry %d times", n)
			}
		})
	}
}
