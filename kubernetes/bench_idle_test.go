//go:build bench

package kubernetes

// TestBenchIdleLoad is the root's e2e TestBenchIdleStoreLoad on this store: what an idle
// fleet asks of the API server, the same fleet (real Caddy processes, ttl 2s) with one
// election and with shard sets of several sizes, each on an API server of its own, counted
// over a window once every shard is placed and the fleet has settled. The count is the API
// server's own (apiserver_request_total on leases), every verb but WATCH, whose count is
// of watches opened, not of their events. See BENCHMARKS.md.
//
//	cd kubernetes && go test -tags bench -run TestBenchIdleLoad -v -timeout 60m . -bench.idle.shards 256 -bench.instances 5

import (
	"flag"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/fleet"
	"github.com/caddyleader/caddy-leader/kubernetes/internal/kubetest"
)

var (
	benchIdleShards    = flag.String("bench.idle.shards", "256", "TestBenchIdleLoad: shard set sizes to measure besides one election, comma-separated")
	benchIdleWindow    = flag.Duration("bench.idle.window", 20*time.Second, "TestBenchIdleLoad: how long each fleet is measured")
	benchIdleInstances = flag.Int("bench.instances", 5, "TestBenchIdleLoad: instances in the fleet")
	benchIdleSettle    = flag.Duration("bench.idle.settle", 3*time.Minute, "TestBenchIdleLoad: how long a fleet may take to place its shards; one that has not is measured anyway, and said so")
)

func TestBenchIdleLoad(t *testing.T) {
	needCaddy(t)
	sizes := []int{0}
	for _, s := range strings.Split(*benchIdleShards, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			t.Fatalf("-bench.idle.shards: %q is not a positive number", s)
		}
		sizes = append(sizes, n)
	}
	var one float64
	for _, n := range sizes {
		name := "one_election"
		if n > 0 {
			name = fmt.Sprintf("%d_shards", n)
		}
		t.Run(name, func(t *testing.T) {
			total, byVerb, settled := measureIdle(t, n)
			if n == 0 {
				one = total
			}
			var parts []string
			for _, verb := range slices.Sorted(maps.Keys(byVerb)) {
				parts = append(parts, fmt.Sprintf("%s %.1f", verb, byVerb[verb]))
			}
			t.Logf("%s, %d instances, %s for %v: %.1f requests/s (%s); %.2fx one election's",
				name, *benchIdleInstances, settled, *benchIdleWindow, total, strings.Join(parts, ", "), total/one)
		})
	}
}

// measureIdle starts a fleet with a shard set of shards (one election without) on an API
// server of its own, waits for it to settle, and counts the requests on leases (but
// WATCH) over the window, per second. settled says whether the fleet had placed every
// shard: one whose heartbeats outrun its client's rate limit never does, and what it asks
// of the API server then is measured all the same.
func measureIdle(t *testing.T, shards int) (total float64, byVerb map[string]float64, settled string) {
	srv := kubetest.Start(t, kubetest.Options{})
	cfg := fleet.Config{Follower: "forward", TTL: safetyTTL.String(), Shards: shards, InstanceStore: map[string]map[string]any{}}
	for i := range *benchIdleInstances {
		cfg.InstanceStore[fmt.Sprintf("c%d", i)] = map[string]any{"module": "kubernetes", "kubeconfig": srv.Kubeconfig(t, "admin", "default", ""), "lease_prefix": "idle-"}
	}
	instances := fleet.StartInstances(t, caddyBin, *benchIdleInstances, cfg)
	started := time.Now()
	settled = "idle"
	deadline := started.Add(*benchIdleSettle)
	for {
		var why string
		if shards > 0 {
			_, why = fleet.ShardsPlaced(instances)
		} else if _, token, views := fleet.AgreedLeader(instances); token == 0 {
			why = strings.Join(views, "; ")
		}
		if why == "" {
			settled = fmt.Sprintf("idle (placed %.1fs after the instances started)", time.Since(started).Seconds())
			break
		}
		if time.Now().After(deadline) {
			settled = fmt.Sprintf("NOT SETTLED within %v (%.200s)", *benchIdleSettle, why)
			break
		}
		time.Sleep(fleet.PollInterval)
	}
	time.Sleep(5 * time.Second) // the last moves' handovers and announcements
	before := srv.LeaseRequests(t)
	time.Sleep(*benchIdleWindow)
	after := srv.LeaseRequests(t)
	byVerb = map[string]float64{}
	for verb, n := range after {
		if verb == "WATCH" {
			continue
		}
		d := (n - before[verb]) / benchIdleWindow.Seconds()
		if d > 0 {
			byVerb[verb] = d
			total += d
		}
	}
	return total, byVerb, settled
}
