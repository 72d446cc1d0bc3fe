package etcdbackend

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/elector/electortest"
	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
	"github.com/caddyleader/caddy-leader/jobs/jobstest"
)

// TestConformance runs the store-neutral suites (the elector's, and the job records') against
// a real single-member etcd, with elections on their own and grouped (a shard set's, whose
// heartbeats share a beacon).
func TestConformance(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	cluster := etcdtest.Start(t, 1)
	var n atomic.Int64
	harness := func(group string) func(t *testing.T) electortest.Harness {
		return func(t *testing.T) electortest.Harness {
			return electortest.Harness{
				NewClient: func(t *testing.T) elector.Backend {
					b, err := New(Config{Endpoints: cluster.Endpoints(), Prefix: testPrefix, DialTimeout: 2 * time.Second})
					if err != nil {
						t.Fatal(err)
					}
					if group != "" {
						b.GroupHeartbeats(group)
					}
					return b
				},
				TTL:       2 * time.Second,
				Advance:   time.Sleep,
				NamesPrev: true,
				Election: func() string {
					if group != "" {
						return fmt.Sprintf("%s.%d", group, n.Add(1))
					}
					return fmt.Sprintf("conformance-%d", n.Add(1))
				},
			}
		}
	}
	t.Run("alone", func(t *testing.T) {
		electortest.Run(t, harness(""))
		electortest.RunBatch(t, harness(""))
		jobstest.Run(t, harness(""))
	})
	t.Run("grouped", func(t *testing.T) {
		electortest.Run(t, harness("grouped"))
		electortest.RunGrouped(t, harness("grouped"))
		electortest.RunGroupIntents(t, harness("grouped"))
		electortest.RunBatch(t, harness("grouped"))
		jobstest.Run(t, harness("grouped"))
	})
}
