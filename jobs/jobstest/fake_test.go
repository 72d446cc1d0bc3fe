package jobstest

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/elector/electortest"
)

// TestFakeConformance runs the suite on the in-memory store the elector's and the
// runner's unit tests use.
func TestFakeConformance(t *testing.T) {
	t.Parallel()
	var n atomic.Int64
	Run(t, func(t *testing.T) electortest.Harness {
		s := electortest.NewStore()
		return electortest.Harness{
			NewClient: func(*testing.T) elector.Backend { return s.Client() },
			TTL:       10 * time.Second,
			Advance:   s.Advance,
			Election:  func() string { return fmt.Sprintf("e%d", n.Add(1)) },
		}
	})
}
