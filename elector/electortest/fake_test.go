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
	Run(t, func(t *testing.T) Harness {
		s := NewStore()
		return Harness{
			NewClient: func(*testing.T) elector.Backend { return s.Client() },
			TTL:       10 * time.Second,
			Advance:   s.Advance,
			Election:  func() string { return fmt.Sprintf("e%d", n.Add(1)) },
			NamesPrev: true,
		}
	})
}
