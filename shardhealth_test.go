package caddyleader

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap/zaptest"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/etcdbackend"
	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
	"github.com/caddyleader/caddy-leader/internal/testkit/fleet"
	"github.com/caddyleader/caddy-leader/internal/testkit/freeport"
	"github.com/caddyleader/caddy-leader/shards"
)

// healthShards is the size of TestHealthByKey's shard set: enough that placement gives each
// of its two instances some.
const healthShards = 8

// TestHealthByKey runs leader_health by key in a Caddy started in this process (node-a),
// with a second candidate of the shard set (node-b) in the test, on a real etcd. Once the
// shards are placed, each key is answered 200 on node-a only if node-a owns the key's
// shard, and the standby answer otherwise, by query value and by path segment; when node-b
// leaves, the keys of its shards answer 200 on node-a.
func TestHealthByKey(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and Caddy")
	}
	cluster := etcdtest.Start(t, 1)
	const prefix, ttl = "/health-key-test/", 2 * time.Second
	backend, err := etcdbackend.New(etcdbackend.Config{Endpoints: cluster.Endpoints(), Prefix: prefix, DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	peer, _ := fleet.StartShardCandidate(t, elector.Config{
		ID: "node-b", URL: "http://node-b.test:8080", TTL: ttl, DrainTimeout: time.Second,
		Backend: backend, Logger: zaptest.NewLogger(t).Named("node-b"),
	}, "rooms", healthShards, DefaultMaxMoves)

	port := freeport.MustPick(t, 1)[0]
	config := fmt.Sprintf(`{
		"admin": {"disabled": true},
		"apps": {
			"leader": {"endpoints": [%q], "prefix": %q, "ttl": "2s", "instance_id": "node-a",
				"advertise": "http://127.0.0.1:%d", "shard_sets": {"rooms": {"shards": %d}}},
			"http": {"servers": {"health": {"listen": ["127.0.0.1:%d"], "routes": [
				{"match": [{"path": ["/health/owner"]}], "handle": [{"handler": "leader_health",
					"shard_set": "rooms", "shard_key": "{http.request.uri.query.room}"}]},
				{"match": [{"path": ["/health/rooms/*"]}], "handle": [{"handler": "leader_health",
					"shard_set": "rooms", "shard_key": "{http.request.uri.path.2}", "standby_status": 503}]}
			]}}}
		}}`, cluster.Endpoint(0), prefix, port, healthShards, port)
	if err := caddy.Load([]byte(config), true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	app, err := caddy.ActiveContext().App("leader")
	if err != nil {
		t.Fatal(err)
	}
	set, err := app.(*App).shardSet("rooms")
	if err != nil {
		t.Fatal(err)
	}

	owners := shards.Placement(healthShards, []shards.Candidate{{ID: "node-a", Weight: 1}, {ID: "node-b", Weight: 1}})
	if !strings.Contains(strings.Join(owners, " "), "node-a") || !strings.Contains(strings.Join(owners, " "), "node-b") {
		t.Fatalf("placement %v gives one instance every shard: the test needs both", owners)
	}
	// Waiting for the placement is not a timing assertion: the test asserts what node-a
	// answers once its own elections say every shard is at its preferred owner.
	placed := func(owner func(s int) string) func() bool {
		return func() bool {
			for s, e := range set.elections {
				t, leads := e.Check()
				if want := owner(s); t.Leader.ID != want || leads != (want == "node-a") || want != "node-a" && settling(t) {
					return false
				}
			}
			return true
		}
	}
	waitUntil(t, "every shard is at its preferred owner", placed(func(s int) string { return owners[s] }))

	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	for s, owner := range owners {
		key := keyOfShard(s, healthShards)
		token := set.elections[s].Term().Token
		role, status, pathStatus := HealthRoleStandby, http.StatusTooManyRequests, http.StatusServiceUnavailable
		if owner == "node-a" {
			role, status, pathStatus = HealthRoleLeader, http.StatusOK, http.StatusOK
		}
		for _, ask := range []struct {
			name, path string
			status     int
		}{
			{"query", "/health/owner?room=" + key, status},
			{"path", "/health/rooms/" + key, pathStatus},
		} {
			t.Run(fmt.Sprintf("shard_%d_of_%s_by_%s", s, owner, ask.name), func(t *testing.T) {
				got, rep := getHealth(t, http.MethodGet, base+ask.path)
				if got != ask.status || rep.Role != role {
					t.Errorf("%d %s, want %d %s", got, rep.Role, ask.status, role)
				}
				if rep.Shard == nil || *rep.Shard != s || rep.Election != shardElection("rooms", s) ||
					rep.Leader == nil || *rep.Leader != owner || rep.Token != token || rep.Self != "node-a" {
					t.Errorf("body %+v: want shard %d, election rooms.%d, leader %s, token %d, self node-a", rep, s, s, owner, token)
				}
				if got, _ := getHealth(t, http.MethodHead, base+ask.path); got != ask.status {
					t.Errorf("HEAD: %d, want %d", got, ask.status)
				}
			})
		}
	}

	t.Run("a_request_without_the_key_is_answered_for_the_empty_keys_shard", func(t *testing.T) {
		s := shards.Of("", healthShards)
		_, rep := getHealth(t, http.MethodGet, base+"/health/owner")
		if rep.Shard == nil || *rep.Shard != s || rep.Leader == nil || *rep.Leader != owners[s] {
			t.Errorf("body %+v: want shard %d, owned by %s", rep, s, owners[s])
		}
	})

	t.Run("the_answer_follows_a_shard_when_its_owner_leaves", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := peer.Close(ctx); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, "node-a owns every shard", placed(func(int) string { return "node-a" }))
		for s, owner := range owners {
			if owner != "node-b" {
				continue
			}
			got, rep := getHealth(t, http.MethodGet, base+"/health/owner?room="+keyOfShard(s, healthShards))
			if got != http.StatusOK || rep.Role != HealthRoleLeader || rep.Leader == nil || *rep.Leader != "node-a" {
				t.Errorf("shard %d after node-b left: %d %+v, want 200 from its new owner node-a", s, got, rep)
			}
		}
	})
}

// getHealth asks a leader_health route over HTTP and decodes its report (none for HEAD).
func getHealth(t *testing.T, method, url string) (int, HealthReport) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var rep HealthReport
	if method != http.MethodHead {
		if err := json.Unmarshal(body, &rep); err != nil {
			t.Fatalf("%s %s: body %q is not a health report: %v", method, url, body, err)
		}
	}
	return resp.StatusCode, rep
}

// TestHealthShardOptions: the shard options fail provisioning with the bad field named
// after the module (checkShardRoute's own cases are TestGateShardOptions'), and standby_ok
// does not go with them.
func TestHealthShardOptions(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handler HealthHandler
		want    string
	}{
		{"key_without_set", HealthHandler{ShardKey: "{http.request.uri.query.room}"}, "leader_health: shard_key: needs shard_set"},
		{"set_and_election", HealthHandler{ShardSet: "rooms", ShardKey: "{http.request.uri.query.room}", Election: "main"}, "leader_health: election: one election or one shard set, not both"},
		{"standby_ok", HealthHandler{ShardSet: "rooms", ShardKey: "{http.request.uri.query.room}", StandbyOK: true}, "leader_health: standby_ok: a check by shard"},
		{"without_leader_app", HealthHandler{ShardSet: "rooms", ShardKey: "{http.request.uri.query.room}"}, "leader_health: needs the leader app"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := tc.handler
			err := h.Provision(newProvisionContext(t))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Provision() = %v, want an error with %q", err, tc.want)
			}
		})
	}
}
