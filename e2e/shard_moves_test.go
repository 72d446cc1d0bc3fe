//go:build unix

package e2e

// TestShardMoves shows how shards move when an instance joins a fleet and when it leaves
// by SIGTERM, with real Caddy processes on etcd, under load in forward mode:
//
//	go test -count=1 -v -run TestShardMoves ./e2e/
//
// A fleet of four runs moveShards shards. A fifth instance joins: exactly the shards that
// placement now gives it move, each to it and each once (its old term's successor, in the
// shard's history, is its new term), about a fifth of them, and no other shard gets a new
// term. Then the fifth leaves by SIGTERM: each of its shards goes back to the owner it had
// before the join. Every request the clients send meanwhile is answered 200, and the
// backend's log passes the safety check shard by shard. The times are logged, not
// asserted; TestBenchShardSigterm (-tags bench) measures SIGTERM over many trials.

import (
	"encoding/json"
	"net/http"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
	"github.com/caddyleader/caddy-leader/internal/testkit/fleet"
	"github.com/caddyleader/caddy-leader/internal/testkit/safety"
)

const (
	// moveShards is the shard set's size.
	moveShards = 128
	// moveRate is the clients' requests per second, cycling through one key per shard.
	moveRate = 128
)

func TestShardMoves(t *testing.T) {
	needCaddy(t)
	etcd := etcdtest.Start(t, 1)
	env := safety.NewEnv[*etcdProcs](t, caddyBin, nil, Config{Follower: "forward", Endpoints: etcd.Endpoints(), Shards: moveShards})
	env.LaunchWithin(t, 4, time.Minute) // 128 shards on a loaded machine take longer than one election
	before := env.Shards

	// An instance joins.
	var joined *Instance
	var placed []fleet.ShardView
	var joinTook time.Duration
	load := shardLoad(t, env, 2*time.Second, func(l *safety.LoadRun) {
		time.Sleep(time.Second)
		joinAt := time.Now()
		joined = StartInstance(t, "c4", env.Cfg)
		l.Add(joined)
		placed = fleet.WaitShardsPlaced(t, append(env.Fleet, joined), 60*time.Second)
		joinTook = time.Since(joinAt)
	})
	var moved []int
	for s, now := range placed {
		switch was := before[s]; {
		case now.Owner != was.Owner && now.Owner != joined.ID:
			t.Errorf("shard %d moved from %s to %s, not to the instance that joined", s, was.Owner, now.Owner)
		case now.Owner != was.Owner:
			moved = append(moved, s)
		case now.Token != was.Token:
			t.Errorf("shard %d stayed at %s but got a new term (token %d, was %d)", s, now.Owner, now.Token, was.Token)
		}
	}
	if frac := float64(len(moved)) / moveShards; frac < 0.1 || frac > 0.3 {
		t.Errorf("%d of %d shards moved to the fifth instance (%.0f%%), want about a fifth", len(moved), moveShards, 100*frac)
	}
	for _, s := range moved {
		if next := successorOf(t, joined, s, before[s].Token); next != placed[s].Token {
			t.Errorf("shard %d: the term after %d was %d, not the joined instance's %d: it moved more than once", s, before[s].Token, next, placed[s].Token)
		}
	}
	checkShardLoad(t, "join", load)
	t.Logf("join: %d of %d shards moved to %s, each once, in %v; %d requests, %s",
		len(moved), moveShards, joined, joinTook.Round(time.Millisecond), len(load.Results), safety.FmtStatuses(safety.Summarize(load.Results), true))

	// It leaves by SIGTERM: its shards go back where they were.
	var took time.Duration
	load = shardLoad(t, env, 2*time.Second, func(l *safety.LoadRun) {
		time.Sleep(time.Second)
		l.MarkDown(joined) // the load balancer's health check
		took = sigtermTakeover(t, joined, env.Fleet, moved, fleet.PollInterval)
	})
	back := fleet.WaitShardsPlaced(t, env.Fleet, safety.RecoverTimeout)
	for s := range back {
		if back[s].Owner != before[s].Owner {
			t.Errorf("shard %d: owned by %s after the fifth instance left, by %s before it joined", s, back[s].Owner, before[s].Owner)
		}
	}
	checkShardLoad(t, "sigterm", load)
	t.Logf("SIGTERM of %s owning %d shards: the last of them led elsewhere %v after the signal; %d requests, %s",
		joined, len(moved), took.Round(time.Millisecond), len(load.Results), safety.FmtStatuses(safety.Summarize(load.Results), true))
}

// shardLoad sends the clients' load, one key per shard of env's set, to env's fleet for
// while act runs and for tail after it, and returns the clients' outcomes and the backend's
// log once both are done. The load lasts as long as act does, however long a loaded machine
// makes it.
func shardLoad(t *testing.T, env *safetyEnv, tail time.Duration, act func(*safety.LoadRun)) shardRun {
	t.Helper()
	l := safety.NewLoadRun(env.Fleet, env.Client)
	l.Keys = env.Cfg.ShardKeys()
	start := time.Now()
	stop, done := make(chan struct{}), make(chan struct{})
	go func() { defer close(done); l.RunUntil(moveRate, stop) }()
	act(l)
	time.Sleep(tail)
	close(stop)
	<-done
	return shardRun{Results: l.Results, Log: env.Backend.Since(start)}
}

// shardRun is what a shardLoad leaves to check.
type shardRun struct {
	Results []outcome
	Log     []arrival
}

// checkShardLoad fails t for every request not answered 200, and for what the safety
// check forbids in any shard. A move is graceful: the old term may admit as long as it
// holds the shard, so the check knows no fault time.
func checkShardLoad(t *testing.T, name string, run shardRun) {
	t.Helper()
	rep := safety.CheckShards(name, run.Results, run.Log, time.Time{}, time.Time{}, "")
	safety.CheckReport(t, safety.MayChange, &rep, ttl)
	safety.CheckNoErrors(t, run.Results)
}

// successorOf returns the token of the term that followed shard's term token, from the
// shard's history as in reads it; 0 if it has none within a few seconds (a successor
// records its predecessor once it has settled).
func successorOf(t *testing.T, in *Instance, shard int, token int64) int64 {
	t.Helper()
	path := "/leader/" + fleet.ShardElection(shard) + "/history"
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := in.Admin(http.MethodGet, path, nil)
		if err != nil || resp.Status != http.StatusOK {
			t.Fatalf("GET %s: %v %d %s", path, err, resp.Status, resp.Body)
		}
		var h struct{ Terms []elector.PastTerm }
		if err := json.Unmarshal([]byte(resp.Body), &h); err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		for _, term := range h.Terms {
			if term.Token == token {
				return term.SuccessorToken
			}
		}
		if time.Now().After(deadline) {
			return 0
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// sigtermTakeover sends victim SIGTERM and returns how long after it the last of shards
// was led (admitting) by one of survivors. Their admin APIs (GET /leader/shards/<set>,
// polled every poll) tell when every shard is led; the moment each began, as exact as
// the survivor's clock, comes from its log (a poll sees it up to a poll late, and
// polling without pause would take from the machine the time being measured: a set of
// thousands of shards wants a poll of a few hundred milliseconds). It returns once
// victim has exited.
func sigtermTakeover(t *testing.T, victim *Instance, survivors []*Instance, shards []int, poll time.Duration) time.Duration {
	t.Helper()
	var (
		mu   sync.Mutex
		led  = map[int]time.Time{}
		wg   sync.WaitGroup
		stop = make(chan struct{})
		all  = make(chan struct{})
	)
	for _, in := range survivors {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				case <-time.After(poll):
				}
				views, err := in.ShardViews()
				at := time.Now()
				if err != nil {
					continue
				}
				mu.Lock()
				for _, s := range shards {
					if _, seen := led[s]; !seen && s < len(views) && views[s].Role == "leader" {
						led[s] = at
					}
				}
				if len(led) == len(shards) {
					select {
					case <-all:
					default:
						close(all)
					}
				}
				mu.Unlock()
			}
		}()
	}
	signalled := time.Now()
	victim.Signal(syscall.SIGTERM)
	select {
	case <-all:
	case <-time.After(safety.RecoverTimeout):
	}
	close(stop)
	wg.Wait()
	victim.WaitExit()
	if len(led) < len(shards) {
		t.Fatalf("%d of %s's %d shards not led by another instance within %v of its SIGTERM", len(shards)-len(led), victim, len(shards), safety.RecoverTimeout)
	}
	for _, in := range survivors {
		for s, at := range in.ShardsLedSince(signalled, shards) {
			if at.Before(led[s]) {
				led[s] = at
			}
		}
	}
	var last time.Time
	for _, at := range led {
		if at.After(last) {
			last = at
		}
	}
	return last.Sub(signalled)
}
