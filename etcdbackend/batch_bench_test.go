package etcdbackend

import (
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector/electortest"
	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
)

// BenchmarkClaimShards claims and releases a shard set's 4,096 elections on a real
// single-member etcd, one request per election against batchElections to a request
// (electortest.BenchClaims).
//
//	go test -run '^$' -bench ClaimShards -benchtime 3x -count 3 ./etcdbackend/
func BenchmarkClaimShards(b *testing.B) {
	cluster := etcdtest.Start(b, 1)
	backend, err := New(Config{Endpoints: cluster.Endpoints(), Prefix: testPrefix, DialTimeout: 2 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { backend.Close() })
	backend.GroupHeartbeats("bench")
	electortest.BenchClaims(b, backend, "bench", 4096)
}
