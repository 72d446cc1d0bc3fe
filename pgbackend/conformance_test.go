package pgbackend

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/elector/electortest"
	"github.com/caddyleader/caddy-leader/internal/pgtest"
)

// TestConformance runs the store-neutral suite against a real PostgreSQL.
func TestConformance(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	server := pgtest.Start(t)
	var n atomic.Int64
	electortest.Run(t, func(t *testing.T) electortest.Harness {
		return electortest.Harness{
			NewClient: func(t *testing.T) elector.Backend { return newBackend(t, Config{DSN: server.DSN()}) },
			TTL:       2 * time.Second,
			Advance:   time.Sleep,
			Election:  func() string { return fmt.Sprintf("conformance-%d", n.Add(1)) },
		}
	})
}

func newBackend(t testing.TB, cfg Config) *Backend {
	t.Helper()
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}
