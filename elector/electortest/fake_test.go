package electortest

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
)

func TestFakeConformance(t *testing.T) {
	t.Parallel()
	var n atomic.Int64
	// harness is the fake store's, its clients made by client (which batches or not).
	harness := func(client func(*Store) elector.Backend) func(t *testing.T) Harness {
		return func(t *testing.T) Harness {
			s := NewStore()
			return Harness{
				NewClient: func(*testing.T) elector.Backend { return client(s) },
				TTL:       10 * time.Second,
				Advance:   s.Advance,
				Election:  func() string { return fmt.Sprintf("e%d", n.Add(1)) },
				NamesPrev: true,
			}
		}
	}
	plain := harness(func(s *Store) elector.Backend { return s.Client() })
	Run(t, plain)
	// The fake store's Client does not batch: this checks elector.Batched's one call per
	// election; its BatchingClient batches.
	RunBatch(t, plain)
	RunGroupIntents(t, plain)
	t.Run("batching", func(t *testing.T) {
		RunBatch(t, harness(func(s *Store) elector.Backend { return s.BatchingClient() }))
	})
}
