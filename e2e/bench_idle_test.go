//go:build bench && unix

package e2e

// TestBenchIdleStoreLoad measures what an idle fleet asks of its store: the same fleet
// (same instances, ttl 2s) with one election and with shard sets of several sizes, each on
// a store of its own, counted over a window once every shard is placed and the fleet has
// settled.
//
// On etcd (-bench.store etcd, the default) a store write is one revision (a transaction, a
// put, a lease's keys going); the keys written count each key a write changed (the watch's
// events). Lease renewals (keepalives) write no revision and are counted apart, from
// etcd's own metrics.
//
// On PostgreSQL (-bench.store postgres) every request is a statement, reads included (a
// watch polls), so the statements are what is counted: pg_stat_statements' calls of the
// statements on the store's tables, which the server counts as each one ends. The
// transactions (pg_stat_database's commits and rollbacks) are logged beside them; a
// backend reports those only when it has been idle for a while, so they lag by up to
// seconds at either end of the window. See BENCHMARKS.md.
//
//	go test -tags bench -run TestBenchIdleStoreLoad -v -timeout 60m ./e2e -bench.idle.shards 256,1024 -bench.instances 5
//	go test -tags bench -run TestBenchIdleStoreLoad -v -timeout 60m ./e2e -bench.store postgres -bench.instances 5

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
	"github.com/caddyleader/caddy-leader/internal/testkit/pgtest"
	"github.com/caddyleader/caddy-leader/internal/testkit/safety"
)

var (
	benchIdleShards = flag.String("bench.idle.shards", "256", "TestBenchIdleStoreLoad: shard set sizes to measure besides one election, comma-separated")
	benchIdleWindow = flag.Duration("bench.idle.window", 20*time.Second, "TestBenchIdleStoreLoad: how long each fleet is measured")
)

// idleLoad is what a fleet wrote to etcd per second.
type idleLoad struct {
	writes, keys, keepalives float64
	costs                    []instanceCost
}

// requests is the store requests that change something: writes and lease renewals.
func (l idleLoad) requests() float64 { return l.writes + l.keepalives }

// idleSQLLoad is what a fleet asked of PostgreSQL per second.
type idleSQLLoad struct {
	statements, transactions float64
	costs                    []instanceCost
}

func TestBenchIdleStoreLoad(t *testing.T) {
	needCaddy(t)
	sizes := []int{0}
	for _, s := range strings.Split(*benchIdleShards, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			t.Fatalf("-bench.idle.shards: %q is not a positive number", s)
		}
		sizes = append(sizes, n)
	}
	switch *benchStore {
	case "etcd":
		eachIdleFleet(t, sizes, measureIdle, func(t *testing.T, name string, got, one idleLoad) {
			t.Logf("%s, %d instances, idle for %v: %.1f writes/s, %.1f keys written/s, %.1f lease keepalives/s, %.1f requests/s (writes and keepalives); %.2fx / %.2fx / %.2fx / %.2fx one election's",
				name, *benchInstances, *benchIdleWindow, got.writes, got.keys, got.keepalives, got.requests(),
				got.writes/one.writes, got.keys/one.keys, got.keepalives/one.keepalives, got.requests()/one.requests())
			logInstanceCosts(t, name, got.costs, one.costs)
		})
	case "postgres":
		eachIdleFleet(t, sizes, measureIdlePostgres, func(t *testing.T, name string, got, one idleSQLLoad) {
			t.Logf("%s, %d instances, postgres, idle for %v: %.1f statements/s, %.1f transactions/s; %.2fx / %.2fx one election's",
				name, *benchInstances, *benchIdleWindow, got.statements, got.transactions,
				got.statements/one.statements, got.transactions/one.transactions)
			logInstanceCosts(t, name, got.costs, one.costs)
		})
	default:
		t.Fatalf("-bench.store %q: use etcd or postgres", *benchStore)
	}
}

// logInstanceCosts logs what each instance of a fleet cost over the window, and per shard
// what it costs beyond the fleet with one election (one).
func logInstanceCosts(t *testing.T, name string, got, one []instanceCost) {
	t.Logf("%s, %s", name, costLine(got))
	shards, err := strconv.Atoi(strings.TrimSuffix(name, "_shards"))
	if err != nil || len(one) == 0 {
		return
	}
	g, _ := meanCost(got)
	o, _ := meanCost(one)
	t.Logf("%s, beyond one election, per shard and instance: %.3f goroutines, %.0f bytes of heap, %.4f %% of a core",
		name, float64(g.goroutines-o.goroutines)/float64(shards), (float64(g.heapBytes)-float64(o.heapBytes))/float64(shards), (g.cpu-o.cpu)/float64(shards))
}

// eachIdleFleet measures a fleet of each size (0: one election) in a subtest, and reports
// each load with the first's (one election's).
func eachIdleFleet[L any](t *testing.T, sizes []int, measure func(t *testing.T, shards int) L, report func(t *testing.T, name string, got, one L)) {
	var one L
	for i, n := range sizes {
		name := "one_election"
		if n > 0 {
			name = fmt.Sprintf("%d_shards", n)
		}
		t.Run(name, func(t *testing.T) {
			got := measure(t, n)
			if i == 0 {
				one = got
			}
			report(t, name, got, one)
		})
	}
}

// idleStatements counts the calls of the statements on the store's tables (whose names
// begin with the default prefix), the count's own excluded.
const idleStatements = `SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements
	WHERE query ILIKE '%caddy_leader%' AND query NOT ILIKE '%pg_stat_statements%'`

// measureIdlePostgres is measureIdle on a PostgreSQL server of its own.
func measureIdlePostgres(t *testing.T, shards int) idleSQLLoad {
	server := pgtest.Start(t)
	server.Exec(t, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
	env := safety.NewEnv[*etcdProcs](t, caddyBin, nil, Config{Follower: "forward", Shards: shards,
		Store: map[string]any{"module": "postgres", "dsn": server.DSN()}})
	env.LaunchWithin(t, *benchInstances, 10*time.Minute)
	time.Sleep(5 * time.Second) // the last moves' handovers and announcements
	const transactions = `SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database WHERE datname = current_database()`
	server.Exec(t, "SELECT pg_stat_statements_reset()")
	x0 := server.QueryInt(t, transactions)
	costs := measureInstances(t, env.Fleet, func() { time.Sleep(*benchIdleWindow) })
	statements, x1 := server.QueryInt(t, idleStatements), server.QueryInt(t, transactions)
	for i, st := range server.Statements(t, "caddy_leader") {
		if i < 8 {
			t.Logf("%8.1f/s  %s", float64(st.Calls)/benchIdleWindow.Seconds(), st.Query)
		}
	}
	secs := benchIdleWindow.Seconds()
	return idleSQLLoad{statements: float64(statements) / secs, transactions: float64(x1-x0) / secs, costs: costs}
}

// measureIdle starts a fleet with a shard set of shards (one election without), waits for
// it to settle, and counts what it writes over the window.
func measureIdle(t *testing.T, shards int) idleLoad {
	etcd := etcdtest.Start(t, 1)
	env := safety.NewEnv[*etcdProcs](t, caddyBin, nil, Config{Follower: "forward", Endpoints: etcd.Endpoints(), Shards: shards})
	env.LaunchWithin(t, *benchInstances, 10*time.Minute)
	time.Sleep(5 * time.Second) // the last moves' handovers and announcements
	cli := etcd.Client(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first, err := cli.Get(ctx, "\x00", clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	keys := 0
	events := cli.Watch(ctx, "\x00", clientv3.WithFromKey(), clientv3.WithRev(first.Header.Revision+1))
	keepalives := func() float64 { return etcdMetric(t, etcd.Endpoint(0), "etcd_debugging_lease_renewed_total") }
	k0 := keepalives()
	timer := time.NewTimer(*benchIdleWindow)
	defer timer.Stop()
	costs := measureInstances(t, env.Fleet, func() {
		for done := false; !done; {
			select {
			case resp := <-events:
				keys += len(resp.Events)
			case <-timer.C:
				done = true
			}
		}
	})
	last, err := cli.Get(ctx, "\x00", clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	secs := benchIdleWindow.Seconds()
	return idleLoad{
		writes:     float64(last.Header.Revision-first.Header.Revision) / secs,
		keys:       float64(keys) / secs,
		keepalives: (keepalives() - k0) / secs,
		costs:      costs,
	}
}

// etcdMetric reads one counter from an etcd member's /metrics (0 if it has none).
func etcdMetric(t *testing.T, endpoint, name string) float64 {
	resp, err := http.Get(endpoint + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		if f := strings.Fields(line); len(f) == 2 {
			v, _ := strconv.ParseFloat(f[1], 64)
			sum += v
		}
	}
	return sum
}
