package etcdbackend

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/elector/electortest"
	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
)

// TestConformance runs the store-neutral suite against a real single-member etcd.
func TestConformance(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	cluster := etcdtest.Start(t, 1)
	var n atomic.Int64
	electortest.Run(t, func(t *testing.T) electortest.Harness {
		return electortest.Harness{
			NewClient: func(t *testing.T) elector.Backend {
				b, err := New(Config{Endpoints: cluster.Endpoints(), Prefix: testPrefix, DialTimeout: 2 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				return b
			},
			TTL:       2 * time.Second,
			Advance:   time.Sleep,
			NamesPrev: true,
			Election:  func() string { return fmt.Sprintf("conformance-%d", n.Add(1)) },
		}
	})
}
