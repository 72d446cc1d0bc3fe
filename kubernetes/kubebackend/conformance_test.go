package kubebackend

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/elector/electortest"
	"github.com/caddyleader/caddy-leader/jobs/jobstest"
	"github.com/caddyleader/caddy-leader/kubernetes/internal/kubetest"
)

// TestConformance runs the store-neutral suites (the elector's, and the job records')
// against a real kube-apiserver, with elections on their own and grouped (a shard set's,
// whose heartbeats share a beacon).
func TestConformance(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kube-apiserver")
	}
	srv := kubetest.Start(t, kubetest.Options{})
	kubeconfig := srv.Kubeconfig(t, "admin", "default", "")
	var n atomic.Int64
	harness := func(group string, ttl time.Duration) func(t *testing.T) electortest.Harness {
		return func(t *testing.T) electortest.Harness {
			return electortest.Harness{
				NewClient: func(t *testing.T) elector.Backend {
					b, err := New(Config{Kubeconfig: kubeconfig, Prefix: "conformance-"})
					if err != nil {
						t.Fatal(err)
					}
					if group != "" {
						b.GroupHeartbeats(group)
					}
					return b
				},
				TTL:     ttl,
				Advance: time.Sleep,
				Election: func() string {
					if group != "" {
						return fmt.Sprintf("%s.%d", group, n.Add(1))
					}
					return fmt.Sprintf("Conformance.%d", n.Add(1))
				},
			}
		}
	}
	t.Run("alone", func(t *testing.T) {
		electortest.Run(t, harness("", 2*time.Second))
		jobstest.Run(t, harness("", 2*time.Second))
	})
	t.Run("grouped", func(t *testing.T) {
		electortest.Run(t, harness("Grouped", 2*time.Second))
		jobstest.Run(t, harness("Grouped", 2*time.Second))
		// Sixteen campaigns, each a few requests, under a lease nobody renews: a longer
		// TTL keeps the lease alive through them on a busy machine.
		electortest.RunGrouped(t, harness("Grouped", 10*time.Second))
		electortest.RunGroupIntents(t, harness("Grouped", 2*time.Second))
		electortest.RunBatch(t, harness("Grouped", 10*time.Second))
	})
}
