//go:build bench

package bench

// TestScale puts many candidates (default 200) in one election against a 3-member etcd, all
// in this process, and measures what the fleet costs etcd in steady state, how long an
// election takes after the leader dies, whether leadership stays put, and the memory per
// candidate; then it puts every candidate in 20 elections and measures again. See
// BENCHMARKS.md.
//
//	go test -tags bench -run TestScale -v -timeout 30m ./bench
//
// Every candidate has its own etcdbackend.Backend, hence its own etcd client and gRPC
// connections, as separate Caddy processes would. A "crash" closes the leader's etcd
// client: it can no longer renew or revoke its lease, so its key stays until etcd expires
// the lease, exactly as after a SIGKILL.

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/etcdbackend"
	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
	fleetpkg "github.com/caddyleader/caddy-leader/internal/testkit/fleet"
)

var (
	scaleCandidates = flag.Int("scale.candidates", 200, "candidates in the election")
	scaleTTL        = flag.Duration("scale.ttl", 10*time.Second, "lease ttl of every candidate (the plugin's default is 10s)")
	scaleStable     = flag.Duration("scale.stable", 3*time.Minute, "steady-state window with one election: metrics and leadership changes")
	scaleCrashes    = flag.Int("scale.crashes", 3, "leader crashes to time")
	scaleElections  = flag.Int("scale.elections", 20, "elections every candidate stands in, for the second phase")
	scaleWindow     = flag.Duration("scale.window", time.Minute, "steady-state window with all elections")
	scaleHeap       = flag.String("scale.heapprofile", "", "write a heap profile here after the first phase has settled")
)

// candidate is one simulated Caddy instance.
type candidate struct {
	id        string
	cand      *elector.Candidate
	backend   *etcdbackend.Backend
	elections map[string]*elector.Election
	dead      bool // its etcd client was closed
}

func TestScale(t *testing.T) {
	n, ttl := *scaleCandidates, *scaleTTL
	cluster := etcdtest.Start(t, scaleMembers)
	members := cluster.Endpoints()

	heap0, gor0 := settledHeap()
	started := time.Now()
	fleet := make([]*candidate, n)
	for i := range fleet {
		c := &candidate{id: fmt.Sprintf("c%03d", i), elections: map[string]*elector.Election{}}
		var err error
		c.backend, err = etcdbackend.New(etcdbackend.Config{Endpoints: members, Prefix: "/scale/", DialTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		c.cand, err = elector.NewCandidate(elector.Config{
			ID: c.id, URL: "http://" + c.id + ".test:8080", TTL: ttl, DrainTimeout: time.Second, Backend: c.backend,
		})
		if err != nil {
			t.Fatal(err)
		}
		c.cand.Start()
		fleet[i] = c
	}
	t.Cleanup(func() { closeAll(fleet) })
	join(fleet, electionName(0))
	leader, token := waitAgreed(t, fleet, electionName(0), time.Minute)
	t.Logf("RESULT %d candidates, ttl %v, 3 etcd members: first leader %s (token %d) agreed on by all %v after the first candidate started",
		n, ttl, leader.id, token, time.Since(started).Round(time.Millisecond))

	// Let the start-up burst (grants, campaigns, watches) pass: one whole renewal cycle.
	time.Sleep(ttl)
	heap1, gor1 := settledHeap()
	t.Logf("RESULT memory: HeapInuse %.1f MiB -> %.1f MiB: %.1f KiB per candidate; goroutines %d -> %d: %.1f per candidate (both sides: the test process also runs the 3 etcd members, whose per-client state is included)",
		mib(heap0), mib(heap1), kib(heap1, heap0)/float64(n), gor0, gor1, float64(gor1-gor0)/float64(n))
	if *scaleHeap != "" {
		writeHeapProfile(t, *scaleHeap)
	}

	// Phase 1: one election, steady state.
	before := scrape(t, members)
	changes := watchStable(t, fleet, []string{electionName(0)}, *scaleStable)
	after := scrape(t, members)
	report(t, fmt.Sprintf("one election, %d candidates, window %v", n, *scaleStable), before, after, *scaleStable, n, 1, ttl)
	if changes > 0 {
		t.Errorf("%d leadership changes in a steady %v", changes, *scaleStable)
	}
	t.Logf("RESULT steady state, one election, %v: %d leadership or term changes seen by any candidate", *scaleStable, changes)

	// Crashes: the leader's etcd client goes away without revoking its lease.
	for i := range *scaleCrashes {
		leader, token = waitAgreed(t, fleet, electionName(0), ttl+10*time.Second)
		crashed := time.Now()
		leader.dead = true
		_ = leader.backend.Close()
		next, elected := waitNewLeader(t, fleet, electionName(0), token, crashed, 2*ttl+10*time.Second)
		if _, ok := leader.elections[electionName(0)].Check(); ok {
			t.Errorf("crash %d: crashed leader %s still admits when %s is elected", i+1, leader.id, next.id)
		}
		_, all := waitAgreed(t, fleet, electionName(0), ttl)
		t.Logf("RESULT crash %d: %s leads %v after %s's etcd client closed (lease not revoked); all %d live candidates agree %v after the crash (token %d -> %d)",
			i+1, next.id, elected.Round(time.Millisecond), leader.id, live(fleet), time.Since(crashed).Round(time.Millisecond), token, all)
	}

	// Phase 2: every live candidate in more elections, on its one lease.
	elections := make([]string, *scaleElections)
	for i := range elections {
		elections[i] = electionName(i)
	}
	joined := time.Now()
	join(fleet, elections[1:]...)
	for _, name := range elections {
		waitAgreed(t, fleet, name, time.Minute)
	}
	t.Logf("RESULT %d elections: all elected and agreed on %v after %d candidates joined %d more each",
		len(elections), time.Since(joined).Round(time.Millisecond), live(fleet), len(elections)-1)
	time.Sleep(ttl)
	heap2, gor2 := settledHeap()
	extra := float64(live(fleet) * (len(elections) - 1))
	t.Logf("RESULT memory: HeapInuse %.1f MiB -> %.1f MiB: %.1f KiB per extra candidate-election; goroutines %d -> %d: %.1f per extra candidate-election",
		mib(heap1), mib(heap2), kib(heap2, heap1)/extra, gor1, gor2, float64(gor2-gor1)/extra)

	before = scrape(t, members)
	changes = watchStable(t, fleet, elections, *scaleWindow)
	after = scrape(t, members)
	report(t, fmt.Sprintf("%d elections, %d live candidates, window %v", len(elections), live(fleet), *scaleWindow), before, after, *scaleWindow, live(fleet), len(elections), ttl)
	if changes > 0 {
		t.Errorf("%d leadership changes in a steady %v", changes, *scaleWindow)
	}
	t.Logf("RESULT steady state, %d elections, %v: %d leadership or term changes seen by any candidate", len(elections), *scaleWindow, changes)
}

func electionName(i int) string { return fmt.Sprintf("e%02d", i) }

func join(fleet []*candidate, names ...string) {
	for _, c := range fleet {
		if c.dead {
			continue
		}
		for _, name := range names {
			e := c.cand.Election(name)
			c.elections[name] = e
			e.Start()
		}
	}
}

func live(fleet []*candidate) int {
	n := 0
	for _, c := range fleet {
		if !c.dead {
			n++
		}
	}
	return n
}

func closeAll(fleet []*candidate) {
	var wg sync.WaitGroup
	for _, c := range fleet {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_ = c.cand.Close(ctx)
		}()
	}
	wg.Wait()
}

// leaders returns the live candidates that may act as leader of election name right now.
func leaders(fleet []*candidate, name string) []*candidate {
	var ls []*candidate
	for _, c := range fleet {
		if e := c.elections[name]; e != nil && !c.dead {
			if _, ok := e.Check(); ok {
				ls = append(ls, c)
			}
		}
	}
	return ls
}

// waitAgreed waits until exactly one live candidate leads election name and every live
// candidate names it with the same token.
func waitAgreed(t *testing.T, fleet []*candidate, name string, within time.Duration) (*candidate, int64) {
	t.Helper()
	var live []*candidate
	var elections []*elector.Election
	for _, c := range fleet {
		if !c.dead {
			live = append(live, c)
			elections = append(elections, c.elections[name])
		}
	}
	i, token := fleetpkg.WaitAgreed(t, within, elections)
	return live[i], token
}

// waitNewLeader polls every live candidate's per-request check each millisecond until one
// leads with a token above old, and returns it and the time since from.
func waitNewLeader(t *testing.T, fleet []*candidate, name string, old int64, from time.Time, within time.Duration) (*candidate, time.Duration) {
	t.Helper()
	deadline := from.Add(within)
	for {
		for _, c := range fleet {
			if c.dead {
				continue
			}
			if term, ok := c.elections[name].Check(); ok && term.Token > old {
				return c, time.Since(from)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("election %s: no new leader within %v of the crash", name, within)
		}
		time.Sleep(time.Millisecond)
	}
}

// watchStable samples every live candidate's view of the elections every 100ms for d. It
// fails the test if ever no candidate or two candidates lead one election, and returns how
// many times any candidate published a new Term (a leadership or term change, or a lost and
// regained view of the leader).
func watchStable(t *testing.T, fleet []*candidate, names []string, d time.Duration) int {
	t.Helper()
	type key struct {
		c    *candidate
		name string
	}
	last := map[key]*elector.Term{}
	changes := 0
	bad := 0
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		for _, name := range names {
			if ls := leaders(fleet, name); len(ls) != 1 {
				bad++
				if bad <= 10 {
					t.Errorf("election %s: %d candidates lead at %s", name, len(ls), time.Now().Format("15:04:05.000"))
				}
			}
			for _, c := range fleet {
				if c.dead {
					continue
				}
				k := key{c, name}
				cur := c.elections[name].Term()
				if prev, ok := last[k]; ok && prev != cur {
					changes++
					if changes <= 10 {
						t.Logf("%s sees election %s change: %s (leader %q token %d -> %q token %d)",
							c.id, name, cur.Reason, prev.Leader.ID, prev.Token, cur.Leader.ID, cur.Token)
					}
				}
				last[k] = cur
			}
		}
	}
	return changes
}

// counts are etcd counters by "metric" or, for gRPC counters, "metric method".
type counts map[string]float64

// counted are the counters scrape reads. The gRPC ones count requests by method on every
// member; renewed_total counts renewals at the raft leader; the mvcc ones count what each
// member applies (a write is applied by all three).
var counted = []string{
	"grpc_server_started_total", "grpc_server_handled_total", "grpc_server_msg_received_total",
	"etcd_debugging_lease_renewed_total", "etcd_debugging_lease_granted_total", "etcd_debugging_lease_revoked_total",
	"etcd_mvcc_range_total", "etcd_mvcc_txn_total", "etcd_mvcc_put_total", "etcd_mvcc_delete_total",
}

// scrape reads each member's Prometheus metrics from its client URL. The members of an
// etcdtest cluster run in this one process and register their counters in its one default
// Prometheus registry, so every member answers with the same, process-wide totals: scrape
// keeps the largest value seen for each counter rather than adding them up (which would
// count everything three times).
func scrape(t *testing.T, endpoints []string) counts {
	t.Helper()
	all := counts{}
	client := &http.Client{Timeout: 5 * time.Second}
	for _, ep := range endpoints {
		resp, err := client.Get(ep + "/metrics")
		if err != nil {
			t.Fatalf("metrics of %s: %v", ep, err)
		}
		member := counts{}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			for _, metric := range counted {
				if !strings.HasPrefix(line, metric+"{") && !strings.HasPrefix(line, metric+" ") {
					continue
				}
				key := metric
				if strings.HasPrefix(metric, "grpc_") {
					key += " " + label(line, "grpc_method")
				}
				f := strings.Fields(line)
				v, err := strconv.ParseFloat(f[len(f)-1], 64)
				if err != nil {
					t.Fatalf("metrics of %s: %q: %v", ep, line, err)
				}
				member[key] += v
			}
		}
		resp.Body.Close()
		if err := sc.Err(); err != nil {
			t.Fatalf("metrics of %s: %v", ep, err)
		}
		for k, v := range member {
			all[k] = max(all[k], v)
		}
	}
	return all
}

func label(line, name string) string {
	i := strings.Index(line, name+`="`)
	if i < 0 {
		return ""
	}
	rest := line[i+len(name)+2:]
	return rest[:strings.IndexByte(rest, '"')]
}

// scaleMembers is the size of the etcd cluster the fleet uses.
const scaleMembers = 3

// report logs the rate of every counter that moved, and checks that the only requests are
// lease renewals, at about one per candidate per ttl/3, and the leaders' heartbeats: one
// guarded rewrite of each election's key per renewal of its leader's lease.
func report(t *testing.T, what string, before, after counts, window time.Duration, candidates, elections int, ttl time.Duration) {
	t.Helper()
	var keys []string
	for k, v := range after {
		if v != before[k] {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	secs := window.Seconds()
	renewals := float64(candidates) / (ttl / 3).Seconds()
	heartbeats := float64(elections) / (ttl / 3).Seconds()
	t.Logf("RESULT etcd counters per second, whole cluster (%s); expected renewals: %d candidates / (ttl/3) = %.1f/s, heartbeats: %d elections / (ttl/3) = %.1f/s",
		what, candidates, renewals, elections, heartbeats)
	for _, k := range keys {
		t.Logf("RESULT   %-50s %8.2f/s  (%.0f in %v)", k, (after[k]-before[k])/secs, after[k]-before[k], window)
	}
	within := func(k string, expected float64) {
		if rate := (after[k] - before[k]) / secs; rate < 0.8*expected || rate > 1.2*expected {
			t.Errorf("%s: %.1f per second, want about %.1f", k, rate, expected)
		}
	}
	// The elector renews with KeepAliveOnce: one LeaseKeepAlive stream per renewal; each
	// leader rewrites its key in one transaction (a put) with each renewal.
	within("grpc_server_started_total LeaseKeepAlive", renewals)
	within("etcd_debugging_lease_renewed_total", renewals)
	within("grpc_server_started_total Txn", heartbeats)
	within("etcd_mvcc_put_total", heartbeats*scaleMembers) // each member applies each put
	// Nothing else: no reads (a heartbeat's guarded transaction ranges over the key it
	// compares, which etcd_mvcc_range_total counts; no Range request), deletes, grants or
	// revokes while nothing changes.
	for _, k := range keys {
		switch {
		case strings.HasPrefix(k, "grpc_server_started_total ") && k != "grpc_server_started_total LeaseKeepAlive" && k != "grpc_server_started_total Txn",
			k == "etcd_mvcc_delete_total",
			k == "etcd_debugging_lease_granted_total", k == "etcd_debugging_lease_revoked_total":
			t.Errorf("%s went up by %v in a steady window; the fleet should only renew leases and beat", k, after[k]-before[k])
		}
	}
}

func settledHeap() (uint64, int) {
	var ms runtime.MemStats
	for range 2 {
		runtime.GC()
	}
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse, runtime.NumGoroutine()
}

func writeHeapProfile(t *testing.T, path string) {
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	runtime.GC()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		t.Fatal(err)
	}
}

func mib(b uint64) float64             { return float64(b) / (1 << 20) }
func kib(after, before uint64) float64 { return float64(int64(after)-int64(before)) / (1 << 10) }
