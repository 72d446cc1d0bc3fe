//go:build bench && unix

package e2e

// TestBenchShardSigterm times the SIGTERM of an instance that owns many shards: from the
// signal until the last of its shards is led (admitting) by another instance, over many
// trials, with the clients' load in forward mode. See BENCHMARKS.md.
//
//	go test -tags bench -run TestBenchShardSigterm -v -timeout 60m ./e2e
//	go test -tags bench -run TestBenchShardSigterm -v ./e2e -bench.shards 4096 -bench.instances 5 -bench.trials 20
//
// The fleet runs on a 1-member etcd (-bench.store postgres: one PostgreSQL server) with
// ttl 2s. A trial waits until every shard is at its preferred owner, sends SIGTERM to the
// next instance in turn while the clients cycle through one key per shard (sigtermTakeover polls the others' GET /leader/shards/<set>
// until all its shards are led, and takes the moment each began from the log of the
// instance that took it), then starts the instance again and waits for its shards to come
// back. Every request must be answered 200 and pass the safety check shard by shard.

import (
	"flag"
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
	"github.com/caddyleader/caddy-leader/internal/testkit/fleet"
	"github.com/caddyleader/caddy-leader/internal/testkit/pgtest"
	"github.com/caddyleader/caddy-leader/internal/testkit/safety"
)

var (
	benchShards    = flag.Int("bench.shards", 1024, "TestBenchShardSigterm: shards of the set")
	benchInstances = flag.Int("bench.instances", 4, "TestBenchShardSigterm: instances of the fleet")
)

func TestBenchShardSigterm(t *testing.T) {
	needCaddy(t)
	cfg := benchShardConfig(t)
	env := safety.NewEnv[*etcdProcs](t, caddyBin, nil, cfg)
	launched := time.Now()
	env.LaunchWithin(t, *benchInstances, 10*time.Minute)
	t.Logf("%d instances placed %d shards in %v", *benchInstances, *benchShards, time.Since(launched).Round(time.Millisecond))
	var times []time.Duration
	var owned []int
	for trial := range *benchFlags.Trials {
		victim := env.Fleet[trial%len(env.Fleet)]
		var mine []int
		for _, sh := range env.Shards {
			if sh.Owner == victim.ID {
				mine = append(mine, sh.Shard)
			}
		}
		rest := others(env.Fleet, victim)
		var took time.Duration
		run := shardLoad(t, env, 2*time.Second, func(l *safety.LoadRun) {
			time.Sleep(time.Second)
			l.MarkDown(victim)
			took = sigtermTakeover(t, victim, rest, mine, benchPoll)
		})
		checkShardLoad(t, fmt.Sprintf("sigterm_%d", trial), run)
		times, owned = append(times, took), append(owned, len(mine))
		t.Logf("trial %d: SIGTERM of %s owning %d shards: the last led elsewhere after %v; %d requests, %s", trial, victim, len(mine),
			took.Round(time.Millisecond), len(run.Results), safety.FmtStatuses(safety.Summarize(run.Results), true))

		back := StartInstance(t, victim.ID, env.Cfg)
		env.Fleet = append(rest, back)
		returned := time.Now()
		env.Shards = fleet.WaitShardsPlaced(t, env.Fleet, 10*time.Minute)
		t.Logf("trial %d: %s back, its shards placed again in %v", trial, back, time.Since(returned).Round(time.Millisecond))
	}
	slices.Sort(times)
	pct := func(p float64) time.Duration {
		return times[min(len(times)-1, int(p*float64(len(times))))].Round(time.Millisecond)
	}
	t.Logf("SIGTERM of an instance owning %d–%d of %d shards (%d instances, %s, ttl %v, forward), %d trials: median %v, p99 %v, max %v",
		slices.Min(owned), slices.Max(owned), *benchShards, *benchInstances, *benchStore, ttl, len(times), pct(0.5), pct(0.99), times[len(times)-1].Round(time.Millisecond))
}

// TestBenchShardJoin times an instance joining a placed fleet: from its launch until every
// shard that placement gives it is led by it (the moment its log says it began to lead the
// last of them), with the clients' load in forward mode on the fleet that was there. Each
// shard must move at most once, straight to the instance that joined, and every request
// must be answered 200 and pass the safety check shard by shard. The instance that joined
// then leaves (SIGTERM) and the fleet is placed again before the next trial.
//
//	go test -tags bench -run TestBenchShardJoin -v ./e2e -bench.shards 4096 -bench.instances 5 -bench.trials 3
func TestBenchShardJoin(t *testing.T) {
	needCaddy(t)
	env := safety.NewEnv[*etcdProcs](t, caddyBin, nil, benchShardConfig(t))
	env.LaunchWithin(t, *benchInstances, 10*time.Minute)
	var times []time.Duration
	for trial := range *benchFlags.Trials {
		before := env.Shards
		var joined *Instance
		var placed []fleet.ShardView
		var joinedAt time.Time
		run := shardLoad(t, env, 2*time.Second, func(l *safety.LoadRun) {
			time.Sleep(time.Second)
			joinedAt = time.Now()
			joined = StartInstance(t, fmt.Sprintf("j%d", trial), env.Cfg)
			placed = waitPlacedQuietly(t, append(slices.Clone(env.Fleet), joined))
		})
		checkShardLoad(t, fmt.Sprintf("join_%d", trial), run)
		var moved []int
		for s, now := range placed {
			switch was := before[s]; {
			case now.Owner != was.Owner && now.Owner != joined.ID:
				t.Errorf("trial %d: shard %d moved from %s to %s, not to the instance that joined", trial, s, was.Owner, now.Owner)
			case now.Owner != was.Owner:
				moved = append(moved, s)
			}
		}
		led := joined.ShardsLedSince(joinedAt, moved)
		var last time.Time
		for _, s := range moved {
			at, ok := led[s]
			if !ok {
				t.Fatalf("trial %d: %s owns shard %d, its log says it never began to lead it", trial, joined, s)
			}
			if at.After(last) {
				last = at
			}
		}
		twice := 0
		for _, in := range env.Fleet {
			twice += len(in.ShardsLedSince(joinedAt, moved)) // a moved shard led again by an old owner
		}
		took := last.Sub(joinedAt)
		times = append(times, took)
		t.Logf("trial %d: %s joined %d instances: %d of %d shards moved to it (%.1f%%; 1/%d is %.1f%%), %d of them led by another instance meanwhile; the last led by it %v after its launch; %d requests, %s",
			trial, joined, len(env.Fleet), len(moved), *benchShards, 100*float64(len(moved))/float64(*benchShards), len(env.Fleet)+1,
			100/float64(len(env.Fleet)+1), twice, took.Round(time.Millisecond), len(run.Results), safety.FmtStatuses(safety.Summarize(run.Results), true))
		if twice > 0 {
			t.Errorf("trial %d: %d moved shards were led by another instance after the join began: they moved more than once", trial, twice)
		}
		joined.Signal(syscall.SIGTERM)
		joined.WaitExit()
		env.Shards = waitPlacedQuietly(t, env.Fleet)
	}
	slices.Sort(times)
	t.Logf("a %s instance joining %d (%d shards, %s, ttl %v, forward), %d trials: its shards led by it after %v (min) to %v (max)",
		ordinal(len(env.Fleet)+1), len(env.Fleet), *benchShards, *benchStore, ttl, len(times), times[0].Round(time.Millisecond), times[len(times)-1].Round(time.Millisecond))
}

// ordinal is n as "sixth", for the fleet sizes a benchmark uses, or "n-th".
func ordinal(n int) string {
	if names := []string{"first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth"}; n >= 1 && n <= len(names) {
		return names[n-1]
	}
	return fmt.Sprintf("%d-th", n)
}

// TestBenchShardColdStart times a fleet's cold start on a store that has never held the
// set: from the launch of the first instance, and from the moment the last one answered
// (they are launched one after the other), until every shard is led by its preferred
// owner, by the moment each owner's log says it began to lead the shard.
//
//	go test -tags bench -run TestBenchShardColdStart -v ./e2e -bench.shards 4096 -bench.instances 5 -bench.trials 3 [-bench.store postgres]
func TestBenchShardColdStart(t *testing.T) {
	needCaddy(t)
	for trial := range *benchFlags.Trials {
		t.Run(fmt.Sprint(trial), func(t *testing.T) {
			cfg := benchShardConfig(t)
			launched := time.Now()
			instances := fleet.StartInstances(t, caddyBin, *benchInstances, cfg)
			up := time.Now()
			shards := waitPlacedQuietly(t, instances)
			owned := map[string][]int{}
			for _, sh := range shards {
				owned[sh.Owner] = append(owned[sh.Owner], sh.Shard)
			}
			var placed time.Time
			for _, in := range instances {
				led := in.ShardsLastLedSince(launched, owned[in.ID])
				if len(led) != len(owned[in.ID]) {
					t.Fatalf("%s owns %d shards, its log says it began to lead %d of them", in, len(owned[in.ID]), len(led))
				}
				for _, at := range led {
					if at.After(placed) {
						placed = at
					}
				}
			}
			t.Logf("%d instances, %d shards (%s, ttl %v): launched one after the other in %v; every shard led by its preferred owner %v after the first launch, %v after the last instance answered",
				*benchInstances, *benchShards, *benchStore, ttl, up.Sub(launched).Round(time.Millisecond),
				placed.Sub(launched).Round(time.Millisecond), placed.Sub(up).Round(time.Millisecond))
		})
	}
}

// benchPoll is how often a shard benchmark asks its instances for their shards: its times
// come from the instances' logs, and each answer lists every shard of the set, thousands
// of them, on the machine whose time is measured.
const benchPoll = 250 * time.Millisecond

// benchShardConfig is the configuration of a shard benchmark's fleet: -bench.shards shards
// in forward mode, on a store of -bench.store started for t.
func benchShardConfig(t *testing.T) Config {
	cfg := Config{Follower: "forward", Shards: *benchShards}
	switch *benchStore {
	case "etcd":
		cfg.Endpoints = etcdtest.Start(t, 1).Endpoints()
	case "postgres":
		cfg.Store = map[string]any{"module": "postgres", "dsn": pgtest.Start(t).DSN()}
	default:
		t.Fatalf("-bench.store %q: use etcd or postgres", *benchStore)
	}
	return cfg
}

// waitPlacedQuietly waits until the fleet's shards are placed (as fleet.WaitShardsPlaced
// has it), asking once a second: the times come from the logs, and asking the fleet for
// thousands of shards every few milliseconds would take from it (and from its store, in
// this process) the machine whose time is measured.
func waitPlacedQuietly(t *testing.T, instances []*fleet.Instance) []fleet.ShardView {
	deadline := time.Now().Add(10 * time.Minute)
	for {
		time.Sleep(time.Second)
		shards, why := fleet.ShardsPlaced(instances)
		if why == "" {
			return shards
		}
		if time.Now().After(deadline) {
			t.Fatalf("the shards of %v not placed within 10 minutes: %s", instances, why)
		}
	}
}
