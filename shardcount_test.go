package caddyleader

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap/zaptest"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/elector/electortest"
	"github.com/caddyleader/caddy-leader/etcdbackend"
	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
	"github.com/caddyleader/caddy-leader/internal/testkit/fleet"
	"github.com/caddyleader/caddy-leader/internal/testkit/freeport"
)

// TestFleetShardCountFirstWriterWins: the first count published for a set is the fleet's,
// for every instance, whatever count it asks for later, and a set's count is its own.
func TestFleetShardCountFirstWriterWins(t *testing.T) {
	store := electortest.NewStore()
	start := func(id string) *elector.Candidate {
		c, _ := fleet.StartCandidate(t, elector.Config{ID: id, TTL: 3 * time.Second, Backend: store.Client(), Logger: zaptest.NewLogger(t)})
		return c
	}
	a, b := start("a"), start("b")
	for _, step := range []struct {
		name  string
		c     *elector.Candidate
		set   string
		count int
		want  int
	}{
		{"first_writer_publishes", a, "rooms", 256, 256},
		{"another_count_gets_the_fleets", b, "rooms", 128, 256},
		{"the_first_writer_again", a, "rooms", 256, 256},
		{"another_set_has_its_own", b, "users", 8, 8},
	} {
		t.Run(step.name, func(t *testing.T) {
			got, err := step.c.FleetShardCount(t.Context(), step.set, step.count)
			if err != nil || got != step.want {
				t.Fatalf("FleetShardCount(%s, %d) = %d, %v; want %d", step.set, step.count, got, err, step.want)
			}
		})
	}
}

// TestShardCountMismatchStaysOut: a Caddy in this process with `shards rooms 2` joins, on
// a real etcd, a fleet (a candidate in the test) that published 4 and owns every shard:
// the Caddy campaigns in none of its shards, admits none of its keys, logs an ERROR naming
// both counts and reports it; the fleet keeps its shards.
func TestShardCountMismatchStaysOut(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and Caddy")
	}
	cluster := etcdtest.Start(t, 1)
	const prefix = "/shard-count-test/"
	peer, peerSet := startShardPeer(t, cluster, prefix, "fleet", 4)
	if n, err := peer.FleetShardCount(t.Context(), "rooms", 4); n != 4 || err != nil {
		t.Fatalf("the fleet published %d, %v", n, err)
	}
	fleetLeadsAll := func() bool {
		for _, e := range peerSet {
			if _, leading := e.Check(); !leading {
				return false
			}
		}
		return true
	}
	waitUntil(t, "the fleet owns its 4 shards", fleetLeadsAll)

	logFile := filepath.Join(t.TempDir(), "errors.log")
	port := freeport.MustPick(t, 1)[0]
	config := shardCaddyConfig(logFile, cluster.Endpoint(0), prefix, "joined", port, 2)
	if err := caddy.Load([]byte(config), true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	waitUntil(t, "the Caddy finds the fleet's count", func() bool { return shardCountProblem("rooms") != "" })

	for s, e := range runningApp(t).shardSets["rooms"].elections {
		if term, leading := e.Check(); leading || term.Reason != "starting" {
			t.Errorf("shard %d: the instance of another count campaigned (leading %v, %s)", s, leading, term.Reason)
		}
	}
	for _, key := range []string{"a", "b", "c", "d", "e", "f"} {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/rooms/%s", port, key))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("key %s: %d from the instance of another count, want 503", key, resp.StatusCode)
		}
	}
	logged, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(logged), `"shards":2,"fleet_shards":4`) || !strings.Contains(string(logged), `"level":"error"`) {
		t.Errorf("no ERROR naming both counts; logged:\n%s", logged)
	}
	// What GET /leader/ and `caddy leader status` show.
	var table strings.Builder
	if err := printShardSetsTable(&table, listShardSets(t.Context(), time.Now())); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), `ERROR: shard set rooms: this instance has 2 shards in set "rooms" but the fleet has 4`) {
		t.Errorf("caddy leader status does not name both counts:\n%s", table.String())
	}
	if !fleetLeadsAll() {
		t.Error("the fleet lost a shard when an instance of another count joined")
	}
}

// shardCaddyConfig is the JSON config of a Caddy that logs its errors to logFile, runs
// instance id in shard set rooms of count shards on etcd at endpoint under prefix, and
// gates every request on port by its first path segment.
func shardCaddyConfig(logFile, endpoint, prefix, id string, port, count int) string {
	return fmt.Sprintf(`{
		"admin": {"disabled": true},
		"logging": {"logs": {"default": {"level": "ERROR", "writer": {"output": "file", "filename": %q}}}},
		"apps": {
			"leader": {"endpoints": [%q], "prefix": %q, "ttl": "2s", "instance_id": %q,
				"advertise": "http://127.0.0.1:%d", "shard_sets": {"rooms": {"shards": %d}}},
			"http": {"servers": {"s": {"listen": ["127.0.0.1:%d"], "automatic_https": {"disable": true}, "routes": [
				{"handle": [{"handler": "leader_gate", "shard_set": "rooms", "shard_key": "{http.request.uri.path.1}", "hold": 0},
					{"handler": "static_response", "body": "admitted"}]}]}}}
		}}`, logFile, endpoint, prefix, id, port, count, port)
}

// TestShardCountCannotChangeWithAReload: a reload that changes the count of a set this
// process runs is refused, and the running config keeps the set and its shards. Its
// elections are shared with the new config, which would route keys by the new count
// while they still own the shards placed by the old one.
func TestShardCountCannotChangeWithAReload(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and Caddy")
	}
	cluster := etcdtest.Start(t, 1)
	logFile := filepath.Join(t.TempDir(), "errors.log")
	port := freeport.MustPick(t, 1)[0]
	const prefix = "/shard-reload-test/"
	if err := caddy.Load([]byte(shardCaddyConfig(logFile, cluster.Endpoint(0), prefix, "only", port, 4)), true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	leadsAll := func() bool {
		for _, e := range runningApp(t).shardSets["rooms"].elections {
			if _, leading := e.Check(); !leading {
				return false
			}
		}
		return true
	}
	waitUntil(t, "the only instance owns its 4 shards", leadsAll)

	err := caddy.Load([]byte(shardCaddyConfig(logFile, cluster.Endpoint(0), prefix, "only", port, 2)), true)
	if err == nil || !strings.Contains(err.Error(), "shards: 2, but this process runs the set with 4") {
		t.Fatalf("a reload from 4 shards to 2 = %v, want it refused naming both counts", err)
	}
	if n := len(runningApp(t).shardSets["rooms"].elections); n != 4 || !leadsAll() {
		t.Fatalf("after the refused reload the running set has %d shards (leading all: %v), want its 4", n, leadsAll())
	}
}

// startShardPeer starts candidate id, outside Caddy, in shard set rooms of count shards on
// cluster under prefix, with a ttl of 2s: a peer of the Caddy a test runs.
func startShardPeer(t *testing.T, cluster *etcdtest.Cluster, prefix, id string, count int) (*elector.Candidate, []*elector.Election) {
	t.Helper()
	backend, err := etcdbackend.New(etcdbackend.Config{Endpoints: cluster.Endpoints(), Prefix: prefix, DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return fleet.StartShardCandidate(t, elector.Config{
		ID: id, URL: "http://" + id + ".test:8080", TTL: 2 * time.Second, DrainTimeout: time.Second,
		Backend: backend, Logger: zaptest.NewLogger(t).Named(id),
	}, "rooms", count, DefaultMaxMoves)
}
