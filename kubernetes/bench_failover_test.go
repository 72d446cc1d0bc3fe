//go:build bench

package kubernetes

// TestBenchFailover is the root's e2e TestBenchFailover (internal/testkit/failover) on this store:
// three real Caddy processes on a real kube-apiserver, timed from the fault (SIGTERM,
// SIGKILL, resign or transfer) to the first gated request the new leader serves. See
// BENCHMARKS.md.
//
//	cd kubernetes && go test -tags bench -run TestBenchFailover -v . -bench.ttls 2s -bench.trials 20
//
// One API server serves every subtest, each under a lease prefix of its own.

import (
	"flag"
	"fmt"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/failover"
	"github.com/caddyleader/caddy-leader/internal/testkit/fleet"
	"github.com/caddyleader/caddy-leader/kubernetes/internal/kubetest"
)

var benchFlags = failover.RegisterFlags(flag.CommandLine)

func TestBenchFailover(t *testing.T) {
	needCaddy(t)
	srv := kubetest.Start(t, kubetest.Options{})
	subtests := 0
	benchFlags.Run(t, func(t *testing.T, ttl time.Duration) failover.Setup {
		subtests++
		return failover.Setup{Bin: caddyBin, Store: "kubernetes", Config: fleet.Config{Store: map[string]any{
			"module":       "kubernetes",
			"kubeconfig":   srv.Kubeconfig(t, "admin", "default", ""),
			"lease_prefix": fmt.Sprintf("bench%d-", subtests),
		}}}
	})
}
