package caddyleader

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/elector/electortest"
)

// TestUpstreamsWithoutLeader asks the leader upstreams of an election, and of a shard set,
// that have no leader yet: they answer no upstream and no error, so that reverse_proxy
// answers 503 (after its tries) without logging an ERROR about static upstreams it has
// none of.
func TestUpstreamsWithoutLeader(t *testing.T) {
	c, err := elector.NewCandidate(elector.Config{ID: "self", TTL: time.Second, Backend: electortest.NewStore().Client()})
	if err != nil {
		t.Fatal(err)
	}
	// Never started: no term, no leader.
	plain := newLeaderUpstreams("main", c.Election("main"), "self", "127.0.0.1:1")
	key, err := parseShardKey("{http.request.uri.path.1}")
	if err != nil {
		t.Fatal(err)
	}
	sharded := &LeaderUpstreams{key: key, shards: []*LeaderUpstreams{
		newLeaderUpstreams("rooms.0", c.Election("rooms.0"), "self", "127.0.0.1:1"),
		newLeaderUpstreams("rooms.1", c.Election("rooms.1"), "self", "127.0.0.1:1"),
	}}
	for _, tc := range []struct {
		name string
		u    *LeaderUpstreams
	}{
		{"an_election_without_leader", plain},
		{"a_shard_without_owner", sharded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ups, err := tc.u.GetUpstreams(httptest.NewRequest("GET", "/rooms/lobby", nil))
			if err != nil || len(ups) != 0 {
				t.Errorf("GetUpstreams = %v, %v; want no upstream and no error", ups, err)
			}
		})
	}
}
