package caddyleader

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
	"github.com/caddyleader/caddy-leader/shards"
)

// newShardGate is newGate for a gate that routes by key over the given shards' elections.
func newShardGate(t testing.TB, g Gate, elections ...*elector.Election) *Gate {
	t.Helper()
	g.setDefaults()
	if err := g.check(); err != nil {
		t.Fatal(err)
	}
	g.bindShards(&shardSet{name: g.ShardSet, elections: elections})
	return &g
}

// keyOfShard finds a key that falls into shard s of count.
func keyOfShard(s, count int) string {
	for i := 0; ; i++ {
		if k := fmt.Sprintf("key-%d", i); shards.Of(k, count) == s {
			return k
		}
	}
}

func TestGateRoutesByKey(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	cluster := etcdtest.Start(t, 1)
	leader, follower := leaderAndFollower(t, cluster.Endpoints(), "gate", false)
	token := leader.election.Term().Token
	// Seen from one instance: it owns shard 0 (it leads that election) and not shard 1.
	owned, elsewhere := keyOfShard(0, 2), keyOfShard(1, 2)
	gate := Gate{ShardSet: "rooms", ShardKey: "{http.request.uri.path.1}"}

	t.Run("the_owner_admits_under_the_shards_term", func(t *testing.T) {
		g := newShardGate(t, gate, leader.election, follower.election)
		r, repl := gatedRequest(http.MethodPost, "/rooms/"+owned)
		next := &recordingNext{}
		if err := g.ServeHTTP(httptest.NewRecorder(), r, next); err != nil {
			t.Fatal(err)
		}
		if !next.ran {
			t.Fatal("the owner of the key's shard did not admit the request")
		}
		if v, _ := repl.GetString(phShard); v != "0" {
			t.Errorf("{%s} = %q, want 0", phShard, v)
		}
		if next.placeholders[phToken] != fmt.Sprint(token) || next.placeholders[phID] != leader.id {
			t.Errorf("token %s, owner %s; want the shard's term %d of %s", next.placeholders[phToken], next.placeholders[phID], token, leader.id)
		}
	})

	t.Run("another_shard_is_rejected_with_its_own_owner", func(t *testing.T) {
		g := newShardGate(t, gate, leader.election, follower.election)
		r, repl := gatedRequest(http.MethodPost, "/rooms/"+elsewhere)
		next := &recordingNext{}
		assertHandlerError(t, g.ServeHTTP(httptest.NewRecorder(), r, next), http.StatusServiceUnavailable)
		if next.ran {
			t.Fatal("a request of a shard this instance does not own was admitted")
		}
		if v, _ := repl.GetString(phShard); v != "1" {
			t.Errorf("{%s} = %q, want 1", phShard, v)
		}
		if v, _ := repl.GetString(phID); v != leader.id {
			t.Errorf("{%s} = %q, want the shard's owner %s", phID, v, leader.id)
		}
	})

	t.Run("another_shard_is_redirected_to_its_owner", func(t *testing.T) {
		g := newShardGate(t, Gate{ShardSet: "rooms", ShardKey: "{http.request.header.X-Room}", Follower: FollowerRedirect},
			leader.election, follower.election)
		r, _ := gatedRequest(http.MethodPut, "/items?x=1")
		r.Header.Set("X-Room", elsewhere)
		w := httptest.NewRecorder()
		if err := g.ServeHTTP(w, r, &recordingNext{}); err != nil {
			t.Fatal(err)
		}
		if want := "http://" + leader.id + ".test:8080/items?x=1"; w.Code != http.StatusTemporaryRedirect || w.Header().Get("Location") != want {
			t.Fatalf("%d to %q, want 307 to %q", w.Code, w.Header().Get("Location"), want)
		}
	})
}

func TestGateShardOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		gate Gate
		want string
	}{
		{"key_without_set", Gate{ShardKey: "{http.request.uri.path.1}"}, "shard_key: needs shard_set"},
		{"set_without_key", Gate{ShardSet: "rooms"}, `shard_set: "rooms" needs shard_key`},
		{"set_and_election", Gate{ShardSet: "rooms", ShardKey: "{http.request.uri.path.1}", Election: "main"}, "not both"},
		{"key_without_placeholder", Gate{ShardSet: "rooms", ShardKey: "room"}, "has no placeholder"},
		{"set_with_a_dot", Gate{ShardSet: "a.b", ShardKey: "{http.request.uri.path.1}"}, "no white space, slash or dot"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := tc.gate
			g.setDefaults()
			err := g.check()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("check() = %v, want an error with %q", err, tc.want)
			}
		})
	}
}
