package kubernetes

import (
	"sort"
	"syscall"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/fleet"
	"github.com/caddyleader/caddy-leader/kubernetes/internal/kubetest"
)

// TestProcesses runs three real Caddy processes (cmd/caddy, with this store) on a real
// kube-apiserver: a SIGTERM'd leader hands over at once, a SIGKILL'd one is replaced once
// its lease expires, and the instances agree on one leader throughout.
func TestProcesses(t *testing.T) {
	needCaddy(t)
	srv := kubetest.Start(t, kubetest.Options{})
	const ttl = 2 * time.Second
	cfg := fleet.Config{
		TTL:   ttl.String(),
		Store: map[string]any{"module": "kubernetes", "kubeconfig": srv.Kubeconfig(t, "admin", "default", ""), "lease_prefix": "proc-"},
	}
	var handovers, failovers []time.Duration
	for round := range 3 {
		instances := fleet.StartInstances(t, caddyBin, 3, cfg)
		leader, token := fleet.WaitStableLeader(t, instances, 3*ttl+10*time.Second)

		start := time.Now()
		leader.Signal(syscall.SIGTERM)
		rest := fleet.Others(instances, leader)
		next, token2 := fleet.WaitStableLeader(t, rest, 2*ttl)
		handovers = append(handovers, time.Since(start))
		leader.WaitExit()
		if token2 <= token {
			t.Fatalf("round %d: token %d after SIGTERM, %d before", round, token2, token)
		}

		start = time.Now()
		next.Kill()
		last, token3 := fleet.WaitStableLeader(t, fleet.Others(rest, next), 3*ttl+5*time.Second)
		failovers = append(failovers, time.Since(start))
		if token3 <= token2 {
			t.Fatalf("round %d: token %d after SIGKILL, %d before", round, token3, token2)
		}
		last.Kill() // the next round's fleet stands in the same election
	}
	t.Logf("measured SIGTERM handover: %s; SIGKILL failover (ttl %s): %s", spread(handovers), ttl, spread(failovers))
}

// spread is the fastest, median and slowest of ds.
func spread(ds []time.Duration) string {
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	r := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	return r(ds[0]).String() + " / " + r(ds[len(ds)/2]).String() + " / " + r(ds[len(ds)-1]).String()
}
