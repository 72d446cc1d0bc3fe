package pgbackend

import (
	"testing"

	"github.com/caddyleader/caddy-leader/elector/electortest"
	"github.com/caddyleader/caddy-leader/internal/testkit/pgtest"
)

// BenchmarkClaimShards claims and releases a shard set's 4,096 elections on a real
// PostgreSQL, one statement and round trip per election against batchElections to a
// round trip (electortest.BenchClaims).
//
//	go test -run '^$' -bench ClaimShards -benchtime 3x -count 3 ./pgbackend/
func BenchmarkClaimShards(b *testing.B) {
	server := pgtest.Start(b)
	backend := newBackend(b, Config{DSN: server.DSN()})
	backend.GroupHeartbeats("bench")
	electortest.BenchClaims(b, backend, "bench", 4096)
}
