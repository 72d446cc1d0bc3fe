package kubernetes

// TestSafetyShards is the root's e2e TestSafetyShards on this store: one fleet of three
// instances with a shard set, follower forward, through a transfer storm (every shard
// transferred at once) and a SIGKILL, checked shard by shard (safety.CheckShards): 0
// double admissions in every shard.
//
//	cd kubernetes && go test -count=1 -v -run TestSafetyShards .
//
// The set has 8 shards, and failed requests are counted, not failed: each shard's Lease is
// renewed on its own, and at 32 shards the instances' heartbeats miss their deadlines
// behind the client's rate limit (no leader is agreed on within 15s); at 8, a few still do,
// and forwarded requests fail meanwhile (503). Raise both once heartbeats no longer grow
// with the shards.

import (
	"net/http"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/fleet"
	"github.com/caddyleader/caddy-leader/internal/testkit/safety"
	"github.com/caddyleader/caddy-leader/kubernetes/internal/kubetest"
)

func TestSafetyShards(t *testing.T) {
	needCaddy(t)
	const instances, shards, rate = 3, 8, 96
	started := time.Now()
	srv := kubetest.Start(t, kubetest.Options{})
	var reports []safety.Report
	defer func() {
		t.Logf("RESULTS (ttl %v, %d instances, %d shards, forward, kube-apiserver, %d req/s; %v in all):%s", safetyTTL, instances, shards, rate, time.Since(started).Round(time.Second), safety.Table(reports))
	}()
	env := startKubeEnvN(t, srv, "forward", "shards", instances, func(c *fleet.Config) { c.Shards = shards })
	for _, sc := range []kubeScenario{
		// A transfer may time out (504): its target's heartbeats queue behind the rate limit.
		{Name: "kubernetes_shards_transfer_storm", Load: 6 * time.Second, Change: safety.MustChange, Fault: safety.TransferStormAllowing[*kubetest.Server](http.StatusGatewayTimeout)},
		{Name: "kubernetes_sigkill_shard_owner", Load: 6 * time.Second, Change: safety.MustChange, Fault: func(s *kubeRun) {
			s.Survivors = fleet.Others(s.Fleet, s.Leader)
			s.Leader.Kill()
		}},
	} {
		sc.Warmup, sc.Rate = time.Second, rate
		if !t.Run(sc.Name, func(t *testing.T) {
			env.T = t
			reports = append(reports, safety.RunOn(t, env, sc))
		}) {
			return
		}
	}
}
