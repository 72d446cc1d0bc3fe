package pgbackend

import (
	"fmt"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/elector/electortest"
	"github.com/caddyleader/caddy-leader/internal/pgtest"
)

// BenchmarkStoreLoad measures what a fleet of idle candidates (one election, a settled
// leader) costs the database: statements per second per candidate, counted by
// pg_stat_statements over a few ttls, and the connections each holds. Run it with
// -benchtime=1x.
//
//	go test -run '^$' -bench BenchmarkStoreLoad -benchtime=1x ./pgbackend/
func BenchmarkStoreLoad(b *testing.B) {
	for _, n := range []int{3, 20} {
		for _, ttl := range []time.Duration{3 * time.Second} {
			b.Run(fmt.Sprintf("candidates=%d/ttl=%s", n, ttl), func(b *testing.B) {
				server := pgtest.StartWith(b, pgtest.Options{Settings: []string{"max_connections = 400"}})
				server.Exec(b, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
				measureLoad(b, server, n, ttl)
			})
		}
	}
}

func measureLoad(b *testing.B, server *pgtest.Server, n int, ttl time.Duration) {
	fleet := electortest.StartFleet(b, electortest.FleetOptions{
		Size: n,
		TTL:  ttl,
		Backend: func(t testing.TB, i int) elector.Backend {
			return newBackend(t, Config{DSN: server.DSN()})
		},
	})
	fleet.Leader(ttl + 10*time.Second)
	time.Sleep(ttl) // let every watch settle into its idle rhythm
	const count = `SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements
		WHERE query ILIKE '%caddy_leader%' AND query NOT ILIKE '%pg_stat_statements%'`
	before := server.QueryInt(b, count)
	window := 3 * ttl
	time.Sleep(window)
	calls := server.QueryInt(b, count) - before
	conns := server.QueryInt(b, `SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'`) - 1
	b.ReportMetric(float64(conns)/float64(n), "connections/candidate")
	perSec := float64(calls) / window.Seconds()
	b.ReportMetric(perSec, "statements/s")
	b.ReportMetric(perSec/float64(n), "statements/s/candidate")
}
