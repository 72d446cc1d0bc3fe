//go:build bench

package bench

// TestScaleProcesses spreads many candidates (default 200) over several processes (default
// 4; one process cannot hold 200 PostgreSQL candidates on 2 cores), on PostgreSQL and then
// on etcd, and measures what the idle fleet costs the store, and whether every candidate
// names the same leader, exactly one of them leads, and that stays so. See BENCHMARKS.md.
//
//	go test -tags bench -run TestScaleProcesses -v -timeout 30m ./bench
//	go test -tags bench -run TestScaleProcesses -v ./bench -procs.candidates 40 -procs.window 20s -procs.stores postgres
//
// Each process is this test binary run again as TestScaleChild, told by environment
// variables which candidates to start and where. Every 250ms it prints one line: how many
// of its candidates name each leader and token, and which of them lead. The parent reads
// those lines. PostgreSQL's cost is read from pg_stat_database (transactions: every
// statement of the store is one) and pg_stat_activity (connections); etcd's from its
// members' gRPC metrics.

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/etcdbackend"
	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
	"github.com/caddyleader/caddy-leader/internal/testkit/pgtest"
	"github.com/caddyleader/caddy-leader/pgbackend"
)

var (
	procsCandidates = flag.Int("procs.candidates", 200, "TestScaleProcesses: candidates in all")
	procsCount      = flag.Int("procs.count", 4, "TestScaleProcesses: processes they are spread over")
	procsTTL        = flag.Duration("procs.ttl", 10*time.Second, "TestScaleProcesses: every candidate's ttl")
	procsWindow     = flag.Duration("procs.window", time.Minute, "TestScaleProcesses: the steady-state window measured")
	procsStores     = flag.String("procs.stores", "postgres,etcd", "TestScaleProcesses: the stores to measure, in order")
)

// Environment of a child process (TestScaleChild).
const (
	childStoreEnv = "SCALE_CHILD_STORE" // "postgres DSN" or "etcd endpoint,endpoint"
	childFromEnv  = "SCALE_CHILD_FROM"  // the number of its first candidate
	childCountEnv = "SCALE_CHILD_COUNT"
	childTTLEnv   = "SCALE_CHILD_TTL"
)

// childView is one line of a child: what its candidates see of the election.
type childView struct {
	Names   map[string]int `json:"names"`   // "leader:token" -> candidates naming it
	Leading []string       `json:"leading"` // candidates that would admit now
	Why     map[string]int `json:"why"`     // the reasons of those that name no leader
}

func TestScaleProcesses(t *testing.T) {
	for _, store := range strings.Split(*procsStores, ",") {
		t.Run(store, func(t *testing.T) {
			var spec string
			var cost func() map[string]float64
			switch store {
			case "postgres":
				// Each candidate keeps a pool (at most 4) and a LISTEN connection.
				server := pgtest.StartWith(t, pgtest.Options{Settings: []string{
					fmt.Sprintf("max_connections = %d", 6**procsCandidates+20)}})
				// Hundreds of candidates creating the schema at once queue on catalog
				// locks: it is created once here, and they skip it (skip_schema).
				ddl, err := pgbackend.Schema("")
				if err != nil {
					t.Fatal(err)
				}
				server.Exec(t, ddl)
				spec = "postgres " + server.DSN()
				cost = func() map[string]float64 {
					return map[string]float64{
						"transactions": float64(server.QueryInt(t, `SELECT sum(xact_commit + xact_rollback) FROM pg_stat_database`)),
						"connections":  float64(server.QueryInt(t, `SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'`)),
					}
				}
			case "etcd":
				cluster := etcdtest.Start(t, 1)
				spec = "etcd " + strings.Join(cluster.Endpoints(), ",")
				cost = func() map[string]float64 {
					c := scrape(t, cluster.Endpoints())
					total := 0.0
					for k, v := range c {
						if strings.HasPrefix(k, "grpc_server_started_total") {
							total += v
						}
					}
					return map[string]float64{"requests": total}
				}
			default:
				t.Fatalf("-procs.stores: unknown %q", store)
			}
			measureProcesses(t, store, spec, cost)
		})
	}
}

func measureProcesses(t *testing.T, store, spec string, cost func() map[string]float64) {
	n, procs, ttl := *procsCandidates, *procsCount, *procsTTL
	views := make([]childView, procs)
	var mu sync.Mutex
	changed := make(chan struct{}, 1)
	started := time.Now()
	for p := range procs {
		from, count := p*n/procs, (p+1)*n/procs-p*n/procs
		cmd := exec.Command(os.Args[0], "-test.run=^TestScaleChild$")
		cmd.Env = append(os.Environ(), childStoreEnv+"="+spec, childFromEnv+"="+strconv.Itoa(from),
			childCountEnv+"="+strconv.Itoa(count), childTTLEnv+"="+ttl.String())
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			_ = cmd.Wait()
		})
		go func() {
			sc := bufio.NewScanner(out)
			sc.Buffer(make([]byte, 1<<20), 1<<20)
			for sc.Scan() {
				var v childView
				if json.Unmarshal(sc.Bytes(), &v) != nil || v.Names == nil {
					continue // go test's own lines
				}
				mu.Lock()
				views[p] = v
				mu.Unlock()
				select {
				case changed <- struct{}{}:
				default:
				}
			}
		}()
	}
	// agreed returns the one leader:token every candidate names, if there is one and
	// exactly one candidate leads.
	look := func() (map[string]int, []string, map[string]int) {
		mu.Lock()
		defer mu.Unlock()
		names, leading, why := map[string]int{}, []string(nil), map[string]int{}
		for _, v := range views {
			for k, c := range v.Names {
				names[k] += c
			}
			for k, c := range v.Why {
				why[k] += c
			}
			leading = append(leading, v.Leading...)
		}
		return names, leading, why
	}
	agreed := func() (string, bool) {
		names, leading, _ := look()
		for k, c := range names {
			if c == n && len(leading) == 1 {
				return k, true
			}
		}
		return "", false
	}
	var first string
	for deadline := time.Now().Add(2*ttl + time.Minute); ; {
		if k, ok := agreed(); ok {
			first = k
			break
		}
		if time.Now().After(deadline) {
			names, leading, why := look()
			t.Fatalf("%d candidates in %d processes did not agree on one leader: they name %v (leader:token: candidates), %v lead, and those naming none say why: %v",
				n, procs, names, leading, why)
		}
		select {
		case <-changed:
		case <-time.After(time.Second):
		}
	}
	t.Logf("RESULT %s: %d candidates in %d processes, ttl %v: all agree on %s, which alone leads, %v after the first process started",
		store, n, procs, ttl, first, time.Since(started).Round(time.Millisecond))

	time.Sleep(ttl) // the start-up burst passes: one whole renewal cycle
	before, from := cost(), time.Now()
	disagreements := 0
	for end := time.Now().Add(*procsWindow); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		if k, ok := agreed(); !ok || k != first {
			disagreements++
		}
	}
	after, window := cost(), time.Since(from)
	var rates []string
	for _, k := range sortedNames(after) {
		switch k {
		case "connections":
			rates = append(rates, fmt.Sprintf("%.0f connections", after[k]))
		default:
			rates = append(rates, fmt.Sprintf("%.2f %s/s (%.3f per candidate)", (after[k]-before[k])/window.Seconds(), k,
				(after[k]-before[k])/window.Seconds()/float64(n)))
		}
	}
	t.Logf("RESULT %s steady state over %v: %s; %d of %d looks (every 250ms) found another leader, another token or not exactly one leading",
		store, window.Round(time.Second), strings.Join(rates, ", "), disagreements, int(window/(250*time.Millisecond)))
	if disagreements > 0 {
		t.Errorf("%s: the candidates did not stay agreed on one leader", store)
	}
}

func sortedNames(m map[string]float64) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// TestScaleChild is one process of TestScaleProcesses; without its environment it does
// nothing. It runs until it is sent SIGTERM, then closes its candidates.
func TestScaleChild(t *testing.T) {
	spec := os.Getenv(childStoreEnv)
	if spec == "" {
		t.Skip("a child process of TestScaleProcesses")
	}
	from, _ := strconv.Atoi(os.Getenv(childFromEnv))
	count, _ := strconv.Atoi(os.Getenv(childCountEnv))
	ttl, err := time.ParseDuration(os.Getenv(childTTLEnv))
	if err != nil {
		t.Fatal(err)
	}
	kind, where, _ := strings.Cut(spec, " ")
	var elections []*elector.Election
	var cands []*elector.Candidate
	for i := from; i < from+count; i++ {
		var b elector.Backend
		switch kind {
		case "postgres":
			b, err = pgbackend.New(pgbackend.Config{DSN: where, SkipSchema: true, Logger: scaleLogger()})
		default:
			b, err = etcdbackend.New(etcdbackend.Config{Endpoints: strings.Split(where, ","), Prefix: "/scale-procs/", DialTimeout: 5 * time.Second})
		}
		if err != nil {
			t.Fatal(err)
		}
		id := fmt.Sprintf("c%03d", i)
		c, err := elector.NewCandidate(elector.Config{ID: id, URL: "http://" + id + ".test:8080", TTL: ttl, DrainTimeout: time.Second, Backend: b, Logger: scaleLogger()})
		if err != nil {
			t.Fatal(err)
		}
		e := c.Election("scale")
		c.Start()
		e.Start()
		cands, elections = append(cands, c), append(elections, e)
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	enc := json.NewEncoder(os.Stdout)
	for {
		select {
		case <-stop:
			var wg sync.WaitGroup
			for _, c := range cands {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					_ = c.Close(ctx)
				}()
			}
			wg.Wait()
			return
		case <-tick.C:
		}
		v := childView{Names: map[string]int{}, Why: map[string]int{}}
		for _, e := range elections {
			tm, leading := e.Check()
			v.Names[fmt.Sprintf("%s:%d", tm.Leader.ID, tm.Token)]++
			if !tm.LeaderKnown() {
				v.Why[tm.Reason]++
			}
			if leading {
				v.Leading = append(v.Leading, tm.Self)
			}
		}
		_ = enc.Encode(v)
	}
}

// scaleLogger is a child's logger: its warnings and errors (a store request failing, say)
// go to its standard error, which the parent passes on.
func scaleLogger() *zap.Logger {
	cfg := zap.NewProductionConfig()
	cfg.Level = zap.NewAtomicLevelAt(zap.WarnLevel)
	cfg.DisableStacktrace = true
	cfg.Sampling = nil
	l, err := cfg.Build()
	if err != nil {
		return zap.NewNop()
	}
	return l
}
