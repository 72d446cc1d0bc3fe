//go:build bench && unix

package e2e

// TestBenchFailover times failovers between real Caddy processes: from the signal to the
// leader (SIGTERM: graceful handover; SIGKILL: crash), or from the admin API request (a
// resign on the leader, a transfer asked of a follower), to the first gated request that
// another instance serves, over many trials and several ttls. See BENCHMARKS.md.
//
//	go test -tags bench -run TestBenchFailover -v -timeout 40m ./e2e
//	go test -tags bench -run 'TestBenchFailover/sigkill_ttl_10s' -v ./e2e -bench.trials 5
//	go test -tags bench -run TestBenchFailover -v ./e2e -bench.store postgres -bench.ttls 2s
//	go test -tags bench -run TestBenchFailover -v ./e2e -bench.ttls 2s -bench.trials 50 -bench.follower forward
//
// Each subtest runs its own 1-member etcd (or, with -bench.store postgres, its own
// PostgreSQL server) and a fleet of three instances. A trial waits
// until the fleet agrees on a leader, then for a random fraction of a renewal interval
// (ttl/3), so that faults land uniformly over the lease's renewal cycle; it starts the
// harness's Poller on the two others, strikes, and waits for the first 200 on /gated with
// a higher token. A signalled instance is then replaced by a new process. The Poller
// pauses 1ms after every non-200 answer, so a takeover is seen up to about 1ms late: the
// times below are upper bounds by that much. With -bench.follower forward, every request
// to a follower is forwarded, and any answer other than 200 counts as a failed request.

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/caddyleader/caddy-leader/internal/etcdtest"
	"github.com/caddyleader/caddy-leader/internal/pgtest"
)

var (
	benchTrials = flag.Int("bench.trials", 20, "failover trials per signal and ttl")
	benchTTLs   = flag.String("bench.ttls", "2s,5s,10s", "comma-separated lease ttls to measure")
	benchStore  = flag.String("bench.store", "etcd", "the store the fleet elects through: etcd or postgres")
	benchFaults = flag.String("bench.faults", "sigterm,sigkill,resign,transfer", "comma-separated handovers to time: sigterm, sigkill, resign, transfer")
	benchMode   = flag.String("bench.follower", "reject", "the gate's follower mode: reject, redirect or forward")
)

// benchFault is one way leadership moves: a signal to the leader, or a request to the
// admin API.
type benchFault struct {
	name string
	// strike moves leadership away from leader; it returns whether leader's process
	// goes away (and must be replaced).
	strike func(t *testing.T, leader *Instance, fleet []*Instance) bool
}

var benchFaultKinds = map[string]benchFault{
	"sigterm": {"SIGTERM", func(t *testing.T, leader *Instance, _ []*Instance) bool {
		leader.signal(syscall.SIGTERM)
		return true
	}},
	"sigkill": {"SIGKILL", func(t *testing.T, leader *Instance, _ []*Instance) bool {
		leader.signal(syscall.SIGKILL)
		return true
	}},
	"resign": {"resign", func(t *testing.T, leader *Instance, _ []*Instance) bool {
		adminPost(t, leader, "/leader/default/resign?hold_off="+resignHoldOff.String())
		return false
	}},
	"transfer": {"transfer", func(t *testing.T, leader *Instance, fleet []*Instance) bool {
		rest := others(fleet, leader)
		adminPost(t, rest[0], "/leader/default/transfer?timeout=10s&to="+rest[1].ID)
		return false
	}},
}

// resignHoldOff is how long a resigning leader of the benchmark stays out of the election.
const resignHoldOff = time.Second

// adminPost sends a request to in's admin API in the background: the time counted is from
// its sending, and the answer comes only once the handover is done.
func adminPost(t *testing.T, in *Instance, path string) {
	go func() {
		if resp, err := in.admin(http.MethodPost, path, nil); err != nil || resp.Status != http.StatusOK {
			t.Errorf("POST %s to %s: %v %d %s", path, in, err, resp.Status, resp.Body)
		}
	}()
}

func TestBenchFailover(t *testing.T) {
	needCaddy(t)
	var ttls []time.Duration
	for _, s := range strings.Split(*benchTTLs, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil {
			t.Fatalf("-bench.ttls: %v", err)
		}
		ttls = append(ttls, d)
	}
	for _, kind := range strings.Split(*benchFaults, ",") {
		f, ok := benchFaultKinds[strings.TrimSpace(kind)]
		if !ok {
			t.Fatalf("-bench.faults: unknown %q", kind)
		}
		for _, ttl := range ttls {
			name := fmt.Sprintf("%s_ttl_%v", strings.TrimSpace(kind), ttl)
			t.Run(name, func(t *testing.T) { benchFailover(t, f, ttl, *benchTrials) })
		}
	}
}

// keyEvents records when the election key was deleted and when it was created again,
// as etcd reports them to a watch from the test process.
type keyEvents struct {
	mu               sync.Mutex
	deleted, created time.Time
}

// watchKey records key's first delete and create from now on. It returns once etcd has
// registered the watch, so that no event after the call is missed.
func watchKey(ctx context.Context, cli *clientv3.Client, key string) *keyEvents {
	ev := &keyEvents{}
	ch := cli.Watch(ctx, key, clientv3.WithCreatedNotify())
	<-ch // the created notification (or the channel closed with ctx)
	go func() {
		for resp := range ch {
			now := time.Now()
			for _, e := range resp.Events {
				ev.mu.Lock()
				switch {
				case e.Type == clientv3.EventTypeDelete && ev.deleted.IsZero():
					ev.deleted = now
				case e.Type == clientv3.EventTypePut && e.IsCreate() && ev.created.IsZero():
					ev.created = now
				}
				ev.mu.Unlock()
			}
		}
	}()
	return ev
}

func benchFailover(t *testing.T, f benchFault, ttl time.Duration, trials int) {
	var cli *clientv3.Client // nil on postgres: the key's deletion is timed on etcd only
	cfg := Config{TTL: ttl.String(), Variant: "v0", Follower: *benchMode}
	switch *benchStore {
	case "etcd":
		etcd := etcdtest.Start(t, 1)
		cli = etcd.Client(t)
		cfg.Endpoints = etcd.Endpoints()
	case "postgres":
		cfg.Store = map[string]any{"module": "postgres", "dsn": pgtest.Start(t).DSN()}
	default:
		t.Fatalf("-bench.store %q: use etcd or postgres", *benchStore)
	}
	fleet := StartFleet(t, 3, cfg)
	spawned := len(fleet)

	var took, deleted, exited []time.Duration
	refused := 0
	steps := map[string][]time.Duration{} // graceful: when the old leader logged each step
	graceful := f.name != "SIGKILL"
	for trial := 1; trial <= trials; trial++ {
		leader, token := WaitStableLeader(t, fleet, electTimeout+2*ttl)
		poller := StartPoller(others(fleet, leader))
		waitPolled(t, poller, others(fleet, leader))
		time.Sleep(rand.N(ttl / 3))

		ctx, cancel := context.WithCancel(context.Background())
		ev := &keyEvents{}
		if cli != nil {
			ev = watchKey(ctx, cli, "/caddy-leader/default")
		}
		fault := time.Now()
		gone := f.strike(t, leader, fleet)
		s := poller.WaitServed(t, ttl+5*time.Second, "with a new term",
			func(s Served) bool { return s.Gated.Token > token })
		exit := time.Duration(0)
		if gone {
			leader.waitExit()
			exit = time.Since(fault) // an upper bound: waitExit returned after s
		}
		poller.Stop()
		cancel()
		for _, in := range others(fleet, leader) {
			refused += poller.Refused(in) + poller.Failed(in)
		}

		d := s.At.Sub(fault)
		took = append(took, d)
		ev.mu.Lock()
		del := ev.deleted.Sub(fault)
		ev.mu.Unlock()
		if cli != nil {
			deleted = append(deleted, del)
		}
		if gone {
			exited = append(exited, exit)
		}
		if graceful {
			for msg, at := range logTimes(leader, fault, shutdownSteps) {
				steps[msg] = append(steps[msg], at)
			}
		}
		if s.SentAt.Before(fault) && *benchMode != "forward" {
			// Forwarded, a request sent before may rightly be held for the new term.
			t.Errorf("trial %d: %s served token %d for a request sent before the fault", trial, s.From, s.Gated.Token)
		}
		deletion := ""
		if cli != nil {
			deletion = fmt.Sprintf("key deleted after %v, ", del.Round(time.Millisecond))
		}
		t.Logf("trial %2d: %s of %s (token %d): %s%s served token %d after %v",
			trial, f.name, leader, token, deletion, s.From, s.Gated.Token, d.Round(time.Millisecond))

		if trial == 1 {
			t.Logf("timeline of trial 1, from the old leader's and the new leader's logs:\n%s",
				timeline(fault, leader, instanceByID(fleet, s.Gated.Self)))
		}
		if f.name == "resign" {
			// The resigner sits out its hold-off: let it end, so that the next trial's
			// leader has two instances to hand over to, as the first had.
			time.Sleep(resignHoldOff)
		}
		if gone {
			// Replace the dead instance, so that every trial starts with three.
			i := slices.Index(fleet, leader)
			fleet[i] = StartInstance(t, fmt.Sprintf("c%d", spawned), cfg)
			spawned++
		}
	}
	t.Logf("RESULT %s ttl %v, %d trials on %s, follower %s: first gated 200 from the new leader after the fault: %s; %d requests to the followers not answered 200",
		f.name, ttl, trials, *benchStore, *benchMode, summary(took), refused)
	if len(deleted) > 0 {
		t.Logf("RESULT %s ttl %v: key deleted in etcd after: %s", f.name, ttl, summary(deleted))
	}
	if len(exited) > 0 && graceful {
		t.Logf("RESULT %s ttl %v: the old process had exited within: %s", f.name, ttl, summary(exited))
	}
	if graceful {
		for _, msg := range shutdownSteps {
			if len(steps[msg]) > 0 {
				t.Logf("RESULT %s ttl %v: old leader logged %q after: %s", f.name, ttl, msg, summary(steps[msg]))
			}
		}
	}
}

// shutdownSteps are the log messages of a leader's graceful stop, in order: Caddy starts
// shutting down, the elector starts the handover, lets go of the key.
var shutdownSteps = []string{"shutting down apps, then terminating", "handing leadership over", "stepped down", "left all elections"}

// logTimes returns how long after from the instance first logged each of msgs.
func logTimes(in *Instance, from time.Time, msgs []string) map[string]time.Duration {
	b, err := os.ReadFile(in.logPath)
	if err != nil {
		return nil
	}
	found := map[string]time.Duration{}
	for _, line := range strings.Split(string(b), "\n") {
		var entry struct {
			TS  float64 `json:"ts"`
			Msg string  `json:"msg"`
		}
		if json.Unmarshal([]byte(line), &entry) != nil || !slices.Contains(msgs, entry.Msg) {
			continue
		}
		sec, frac := math.Modf(entry.TS)
		at := time.Unix(int64(sec), int64(frac*1e9))
		if _, seen := found[entry.Msg]; !seen && !at.Before(from.Add(-time.Millisecond)) {
			found[entry.Msg] = at.Sub(from)
		}
	}
	return found
}

// waitPolled waits until the poller has had an answer from every one of ins.
func waitPolled(t *testing.T, p *Poller, ins []*Instance) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		ok := true
		for _, in := range ins {
			if p.Answered(in) == 0 {
				ok = false
			}
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the poller got no answer from every instance within 5s")
		}
		time.Sleep(time.Millisecond)
	}
}

// summary is "min / p50 / p99 / max" of ds, nearest-rank percentiles (with 20 samples, p99
// is the largest).
func summary(ds []time.Duration) string {
	s := slices.Clone(ds)
	slices.Sort(s)
	return fmt.Sprintf("min %v / p50 %v / p99 %v / max %v (n=%d)",
		s[0].Round(time.Millisecond), percentile(s, 50).Round(time.Millisecond),
		percentile(s, 99).Round(time.Millisecond), s[len(s)-1].Round(time.Millisecond), len(s))
}

// percentile is the nearest-rank percentile of sorted s.
func percentile(s []time.Duration, p int) time.Duration {
	rank := (p*len(s) + 99) / 100 // ceil(p/100 * n)
	return s[max(rank, 1)-1]
}

// instanceByID returns the instance of fleet with id, or nil.
func instanceByID(fleet []*Instance, id string) *Instance {
	for _, in := range fleet {
		if in.ID == id {
			return in
		}
	}
	return nil
}

// timeline merges what the election logged on each of ins after from (and Caddy's own
// shutdown line), in order, each line with its offset from from.
func timeline(from time.Time, ins ...*Instance) string {
	type line struct {
		at  time.Duration
		txt string
	}
	var lines []line
	for _, in := range ins {
		if in == nil {
			continue
		}
		b, err := os.ReadFile(in.logPath)
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			var entry struct {
				TS     float64 `json:"ts"`
				Logger string  `json:"logger"`
				Msg    string  `json:"msg"`
				Reason string  `json:"reason"`
			}
			if json.Unmarshal([]byte(l), &entry) != nil || (entry.Logger != "leader" && !slices.Contains(shutdownSteps, entry.Msg)) {
				continue
			}
			sec, frac := math.Modf(entry.TS)
			at := time.Unix(int64(sec), int64(frac*1e9)).Sub(from)
			if at < -time.Millisecond || at > 5*time.Second {
				continue
			}
			txt := fmt.Sprintf("%8.1f ms  %s: %s", float64(at.Microseconds())/1000, in.ID, entry.Msg)
			if entry.Reason != "" {
				txt += " (" + entry.Reason + ")"
			}
			lines = append(lines, line{at, txt})
		}
	}
	slices.SortStableFunc(lines, func(a, b line) int { return int(a.at - b.at) })
	var out []string
	for _, l := range lines {
		out = append(out, l.txt)
	}
	return strings.Join(out, "\n")
}
