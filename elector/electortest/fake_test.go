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
	harness := func(t *testing.T) Harness {
		s := NewStore()
		return Harness{
			NewClient: func(*testing.T) elector.Backend { return s.Client() },
			TTL:       10 * time.Second,
			Advance:   s.Advance,
			Election:  func() string { return fmt.Sprintf("e%d", n.Add(1)) },
			NamesPrev: true,
		}
	}
	Run(t, harness)
	// The fake store's Client does not batch: this checks elector.Batched's one call per
	// election; its BatchingClient batches.
	RunBatch(t, harness)
	t.Run("batching", func(t *testing.T) {
		RunBatch(t, func(t *testing.T) Harness {
			h := harness(t)
			s := NewStore()
			h.NewClient, h.Advance = func(*testing.T) elector.Backend { return s.BatchingClient() }, s.Advance
			return h
		})
	})
}
