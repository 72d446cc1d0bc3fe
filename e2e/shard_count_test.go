//go:build unix

package e2e

// TestShardCountMismatch: an instance started with another shard count than the fleet's
// joins a placed fleet of real Caddy processes on etcd, under load in forward mode:
//
//	go test -count=1 -v -run TestShardCountMismatch ./e2e/
//
// It logs an ERROR naming both counts, owns no shard (no shard of the fleet gets a new
// term), answers every key with 503 instead of admitting or forwarding it by its own
// modulus, and the fleet answers every request 200 meanwhile; every request the backend
// got was admitted in the shard that FNV-1a of its key modulo the fleet's count gives.

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
	"github.com/caddyleader/caddy-leader/internal/testkit/safety"
	"github.com/caddyleader/caddy-leader/shards"
)

// countShards is the fleet's count; the instance that joins has half as many.
const countShards = 16

func TestShardCountMismatch(t *testing.T) {
	needCaddy(t)
	etcd := etcdtest.Start(t, 1)
	env := safety.NewEnv[*etcdProcs](t, caddyBin, nil, Config{Follower: "forward", Endpoints: etcd.Endpoints(), Shards: countShards})
	env.LaunchWithin(t, 3, time.Minute)
	before := env.Shards

	var joined *Instance
	load := shardLoad(t, env, 2*time.Second, func(*safety.LoadRun) {
		time.Sleep(time.Second)
		cfg := env.Cfg
		cfg.Shards = countShards / 2
		joined = StartInstance(t, "c3", cfg)
		const mismatch = `"shards":8,"fleet_shards":16`
		for deadline := time.Now().Add(electTimeout); !strings.Contains(joined.Tail(), mismatch); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s did not log %s within %s", joined, mismatch, electTimeout)
			}
		}
		// It knows no owner of any shard: each request waits out the gate's hold for one
		// (2s), then gets 503.
		client := &http.Client{Timeout: 10 * time.Second}
		var wg sync.WaitGroup
		for _, key := range env.Cfg.ShardKeys() {
			wg.Go(func() {
				resp, err := client.Get(joined.URL() + "/gated/" + key)
				if err != nil {
					t.Errorf("key %s on %s: %v", key, joined, err)
					return
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusServiceUnavailable {
					t.Errorf("key %s on %s: %d, want 503", key, joined, resp.StatusCode)
				}
			})
		}
		wg.Wait()
	})
	checkShardLoad(t, "join with another count", load)
	if !strings.Contains(joined.Tail(), `"level":"error"`) {
		t.Errorf("%s logged the mismatch below ERROR", joined)
	}
	for _, a := range load.Log {
		key := strings.TrimPrefix(a.URI, "/gated/")
		if a.ServedBy == joined.ID || a.Shard != shards.Of(key, countShards) {
			t.Errorf("request %s for key %s admitted by %s in shard %d; the fleet's shard is %d", a.ReqID, key, a.ServedBy, a.Shard, shards.Of(key, countShards))
		}
	}
	now, err := env.Fleet[0].ShardViews()
	if err != nil {
		t.Fatal(err)
	}
	for s, v := range now {
		if v.Owner != before[s].Owner || v.Token != before[s].Token {
			t.Errorf("shard %d went from %s (token %d) to %s (token %d) when an instance of another count joined", s, before[s].Owner, before[s].Token, v.Owner, v.Token)
		}
	}
	t.Logf("%d requests while %s joined with %d shards: %s", len(load.Results), joined, countShards/2, safety.FmtStatuses(safety.Summarize(load.Results), true))
}
