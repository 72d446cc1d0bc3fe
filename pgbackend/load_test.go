package pgbackend

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/elector/electortest"
	"github.com/caddyleader/caddy-leader/internal/testkit/pgtest"
)

var loadCandidates = flag.String("pg.candidates", "3,20", "BenchmarkStoreLoad: comma-separated fleet sizes")

// BenchmarkStoreLoad measures what a fleet of idle candidates (one election, a settled
// leader) costs the database: statements per second per candidate, counted by
// pg_stat_statements over a few ttls, the WAL they write, and the connections each holds.
// It logs the statements by calls, so that the leader's own share (its renewal and the
// heartbeat rewrite of its row) shows. Run it with -benchtime=1x.
//
//	go test -run '^$' -bench BenchmarkStoreLoad -benchtime=1x ./pgbackend/
//	go test -run '^$' -bench BenchmarkStoreLoad -benchtime=1x ./pgbackend/ -pg.candidates 200
func BenchmarkStoreLoad(b *testing.B) {
	for _, field := range strings.Split(*loadCandidates, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(field))
		if err != nil || n < 1 {
			b.Fatalf("-pg.candidates: %q is not a fleet size", field)
		}
		for _, ttl := range []time.Duration{3 * time.Second} {
			b.Run(fmt.Sprintf("candidates=%d/ttl=%s", n, ttl), func(b *testing.B) {
				// A candidate holds up to three connections (pool and listener).
				server := pgtest.StartWith(b, pgtest.Options{Settings: []string{fmt.Sprintf("max_connections = %d", 4*n+40)}})
				server.Exec(b, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
				measureLoad(b, server, n, ttl)
			})
		}
	}
}

func measureLoad(b *testing.B, server *pgtest.Server, n int, ttl time.Duration) {
	// The schema is created beforehand (skip_schema), as a large fleet's would be: what is
	// measured is the idle rhythm, and hundreds of candidates that all run the schema's
	// CREATE OR REPLACE statements at once queue on its catalog locks for tens of seconds
	// (see docs/postgres.md).
	ddl, err := Schema("")
	if err != nil {
		b.Fatal(err)
	}
	server.Exec(b, ddl)
	fleet := electortest.StartFleet(b, electortest.FleetOptions{
		Size: n,
		TTL:  ttl,
		Backend: func(t testing.TB, i int) elector.Backend {
			return newBackend(t, Config{DSN: server.DSN(), SkipSchema: true})
		},
	})
	// A mass start opens every candidate's connections at once; give large fleets longer
	// to settle, which is not what is measured.
	fleet.Leader(ttl + 10*time.Second + time.Duration(n)*200*time.Millisecond)
	time.Sleep(ttl) // let every watch settle into its idle rhythm
	const count = `SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements
		WHERE query ILIKE '%caddy_leader%' AND query NOT ILIKE '%pg_stat_statements%'`
	const wal = `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint`
	server.Exec(b, "SELECT pg_stat_statements_reset()")
	before, walBefore := server.QueryInt(b, count), server.QueryInt(b, wal)
	window := 3 * ttl
	time.Sleep(window)
	calls := server.QueryInt(b, count) - before
	walBytes := server.QueryInt(b, wal) - walBefore
	logStatements(b, server, window)
	b.ReportMetric(float64(walBytes)/window.Seconds(), "WAL-bytes/s")
	conns := server.QueryInt(b, `SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'`) - 1
	b.ReportMetric(float64(conns)/float64(n), "connections/candidate")
	perSec := float64(calls) / window.Seconds()
	b.ReportMetric(perSec, "statements/s")
	b.ReportMetric(perSec/float64(n), "statements/s/candidate")
}

// logStatements logs the store's statements by calls per second over window, the busiest
// first, each shortened to its first line.
func logStatements(b *testing.B, server *pgtest.Server, window time.Duration) {
	for _, st := range server.Statements(b, "caddy_leader") {
		b.Logf("%7.2f/s  %s", float64(st.Calls)/window.Seconds(), st.Query)
	}
}
