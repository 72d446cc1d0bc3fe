// Package failover times how fast leadership moves between real Caddy processes, from a
// fault to the first gated request another instance serves: the trials behind every
// store's TestBenchFailover (see BENCHMARKS.md).
package failover

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
	"syscall"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/fleet"
)

// Flags are the benchmark's command-line flags that every store shares.
type Flags struct {
	Trials   *int
	TTLs     *string
	Faults   *string
	Follower *string
}

// RegisterFlags defines -bench.trials, -bench.ttls, -bench.faults and -bench.follower on fs.
func RegisterFlags(fs *flag.FlagSet) Flags {
	return Flags{
		Trials:   fs.Int("bench.trials", 20, "failover trials per signal and ttl"),
		TTLs:     fs.String("bench.ttls", "2s,5s,10s", "comma-separated lease ttls to measure"),
		Faults:   fs.String("bench.faults", "sigterm,sigkill,resign,transfer", "comma-separated handovers to time: sigterm, sigkill, resign, transfer"),
		Follower: fs.String("bench.follower", "reject", "the gate's follower mode: reject, redirect or forward"),
	}
}

// Fault is one way leadership moves: a signal to the leader, or a request to the admin API.
type Fault struct {
	Name string
	// Strike moves leadership away from leader; it returns whether leader's process goes
	// away (and must be replaced).
	Strike func(t *testing.T, leader *fleet.Instance, fl []*fleet.Instance) bool
}

// Faults are the faults by their -bench.faults names.
var Faults = map[string]Fault{
	"sigterm": {"SIGTERM", func(t *testing.T, leader *fleet.Instance, _ []*fleet.Instance) bool {
		leader.Signal(syscall.SIGTERM)
		return true
	}},
	"sigkill": {"SIGKILL", func(t *testing.T, leader *fleet.Instance, _ []*fleet.Instance) bool {
		leader.Signal(syscall.SIGKILL)
		return true
	}},
	"resign": {"resign", func(t *testing.T, leader *fleet.Instance, _ []*fleet.Instance) bool {
		adminPost(t, leader, "/leader/default/resign?hold_off="+ResignHoldOff.String())
		return false
	}},
	"transfer": {"transfer", func(t *testing.T, leader *fleet.Instance, fl []*fleet.Instance) bool {
		rest := fleet.Others(fl, leader)
		adminPost(t, rest[0], "/leader/default/transfer?timeout=10s&to="+rest[1].ID)
		return false
	}},
}

// ResignHoldOff is how long a resigning leader of the benchmark stays out of the election.
const ResignHoldOff = time.Second

// adminPost sends a request to in's admin API in the background: the time counted is from
// its sending, and the answer comes only once the handover is done.
func adminPost(t *testing.T, in *fleet.Instance, path string) {
	go func() {
		if resp, err := in.Admin(http.MethodPost, path, nil); err != nil || resp.Status != http.StatusOK {
			t.Errorf("POST %s to %s: %v %d %s", path, in, err, resp.Status, resp.Body)
		}
	}()
}

// Setup is one subtest's world, made by the store's test for a ttl.
type Setup struct {
	// Bin is the Caddy binary; Config the fleet's configuration (TTL, Variant and Follower
	// are set by Run).
	Bin    string
	Config fleet.Config
	// Store names the store in the results.
	Store string
	// WatchDeleted, if set, starts watching the election's record in the store and returns
	// when the store first reported it deleted (zero if not yet); ctx ends the watch.
	WatchDeleted func(ctx context.Context) func() time.Time
}

// Run runs a subtest per fault and ttl of f, each with the world start makes for it.
func (f Flags) Run(t *testing.T, start func(t *testing.T, ttl time.Duration) Setup) {
	var ttls []time.Duration
	for _, s := range strings.Split(*f.TTLs, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil {
			t.Fatalf("-bench.ttls: %v", err)
		}
		ttls = append(ttls, d)
	}
	for _, kind := range strings.Split(*f.Faults, ",") {
		fault, ok := Faults[strings.TrimSpace(kind)]
		if !ok {
			t.Fatalf("-bench.faults: unknown %q", kind)
		}
		for _, ttl := range ttls {
			name := fmt.Sprintf("%s_ttl_%v", strings.TrimSpace(kind), ttl)
			t.Run(name, func(t *testing.T) { f.trials(t, fault, ttl, start(t, ttl)) })
		}
	}
}

// electTimeout bounds a fleet agreeing on a leader, on top of 2 ttl.
const electTimeout = 15 * time.Second

// trials runs f.Trials trials of fault at ttl in a fleet of three. A trial waits until the
// fleet agrees on a leader, then for a random fraction of a renewal interval (ttl/3), so
// that faults land uniformly over the lease's renewal cycle; it starts a Poller on the two
// others, strikes, and waits for the first 200 on /gated with a higher token. A signalled
// instance is then replaced by a new process.
func (f Flags) trials(t *testing.T, fault Fault, ttl time.Duration, s Setup) {
	cfg := s.Config
	cfg.TTL, cfg.Variant, cfg.Follower = ttl.String(), "v0", *f.Follower
	fl := fleet.StartInstances(t, s.Bin, 3, cfg)
	spawned := len(fl)

	var took, deleted, exited []time.Duration
	refused := 0
	steps := map[string][]time.Duration{} // graceful: when the old leader logged each step
	graceful := fault.Name != "SIGKILL"
	for trial := 1; trial <= *f.Trials; trial++ {
		leader, token := fleet.WaitStableLeader(t, fl, electTimeout+2*ttl)
		rest := fleet.Others(fl, leader)
		poller := fleet.StartPoller(rest)
		waitPolled(t, poller, rest)
		time.Sleep(rand.N(ttl / 3))

		ctx, cancel := context.WithCancel(context.Background())
		deletedAt := func() time.Time { return time.Time{} }
		if s.WatchDeleted != nil {
			deletedAt = s.WatchDeleted(ctx)
		}
		at := time.Now()
		gone := fault.Strike(t, leader, fl)
		served := poller.WaitServed(t, ttl+5*time.Second, "with a new term",
			func(s fleet.Served[*fleet.Instance]) bool { return s.Gated.Token > token })
		exit := time.Duration(0)
		if gone {
			leader.WaitExit()
			exit = time.Since(at) // an upper bound: WaitExit returned after served
		}
		poller.Stop()
		cancel()
		for _, in := range rest {
			refused += poller.Refused(in) + poller.Failed(in)
		}

		d := served.At.Sub(at)
		took = append(took, d)
		deletion := ""
		if s.WatchDeleted != nil {
			del := deletedAt().Sub(at)
			deleted = append(deleted, del)
			deletion = fmt.Sprintf("key deleted after %v, ", del.Round(time.Millisecond))
		}
		if gone {
			exited = append(exited, exit)
		}
		if graceful {
			for msg, d := range logTimes(leader, at, shutdownSteps) {
				steps[msg] = append(steps[msg], d)
			}
		}
		if served.SentAt.Before(at) && *f.Follower != "forward" {
			// Forwarded, a request sent before may rightly be held for the new term.
			t.Errorf("trial %d: %s served token %d for a request sent before the fault", trial, served.From, served.Gated.Token)
		}
		t.Logf("trial %2d: %s of %s (token %d): %s%s served token %d after %v",
			trial, fault.Name, leader, token, deletion, served.From, served.Gated.Token, d.Round(time.Millisecond))

		if trial == 1 {
			t.Logf("timeline of trial 1, from the old leader's and the new leader's logs:\n%s",
				timeline(at, leader, instanceByID(fl, served.Gated.Self)))
		} else if median := median(took[:len(took)-1]); d > 3*median && d > 50*time.Millisecond {
			// The tail is what the p99 reports: say where its time went, on every
			// instance (a transfer's requester is neither the old leader nor the new).
			t.Logf("timeline of trial %d, %v against a median of %v so far, from every instance's log:\n%s",
				trial, d.Round(time.Millisecond), median.Round(time.Millisecond), timeline(at, fl...))
		}
		if fault.Name == "resign" {
			// The resigner sits out its hold-off: let it end, so that the next trial's
			// leader has two instances to hand over to, as the first had.
			time.Sleep(ResignHoldOff)
		}
		if gone {
			// Replace the dead instance, so that every trial starts with three.
			i := slices.Index(fl, leader)
			fl[i] = fleet.StartInstance(t, s.Bin, fmt.Sprintf("c%d", spawned), cfg)
			spawned++
		}
	}
	t.Logf("RESULT %s ttl %v, %d trials on %s, follower %s: first gated 200 from the new leader after the fault: %s; %d requests to the followers not answered 200",
		fault.Name, ttl, *f.Trials, s.Store, *f.Follower, Summary(took), refused)
	if len(deleted) > 0 {
		t.Logf("RESULT %s ttl %v: key deleted in the store after: %s", fault.Name, ttl, Summary(deleted))
	}
	if len(exited) > 0 && graceful {
		t.Logf("RESULT %s ttl %v: the old process had exited within: %s", fault.Name, ttl, Summary(exited))
	}
	if graceful {
		for _, msg := range shutdownSteps {
			if len(steps[msg]) > 0 {
				t.Logf("RESULT %s ttl %v: old leader logged %q after: %s", fault.Name, ttl, msg, Summary(steps[msg]))
			}
		}
	}
}

// shutdownSteps are the log messages of a leader's graceful stop, in order: Caddy starts
// shutting down, the elector starts the handover, lets go of the key.
var shutdownSteps = []string{"shutting down apps, then terminating", "handing leadership over", "stepped down", "left all elections"}

// logTimes returns how long after from the instance first logged each of msgs.
func logTimes(in *fleet.Instance, from time.Time, msgs []string) map[string]time.Duration {
	b, err := os.ReadFile(in.LogPath())
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
func waitPolled(t *testing.T, p *fleet.Poller[*fleet.Instance], ins []*fleet.Instance) {
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

// Summary is "min / p50 / p99 / max" of ds, nearest-rank percentiles (with 20 samples, p99
// is the largest).
func Summary(ds []time.Duration) string {
	s := slices.Clone(ds)
	slices.Sort(s)
	return fmt.Sprintf("min %v / p50 %v / p99 %v / max %v (n=%d)",
		s[0].Round(time.Millisecond), percentile(s, 50).Round(time.Millisecond),
		percentile(s, 99).Round(time.Millisecond), s[len(s)-1].Round(time.Millisecond), len(s))
}

// median is the median of ds, which it leaves unsorted.
func median(ds []time.Duration) time.Duration {
	return percentile(slices.Sorted(slices.Values(ds)), 50)
}

// percentile is the nearest-rank percentile of sorted s.
func percentile(s []time.Duration, p int) time.Duration {
	rank := (p*len(s) + 99) / 100 // ceil(p/100 * n)
	return s[max(rank, 1)-1]
}

// instanceByID returns the instance of fl with id, or nil.
func instanceByID(fl []*fleet.Instance, id string) *fleet.Instance {
	for _, in := range fl {
		if in.ID == id {
			return in
		}
	}
	return nil
}

// timeline merges what the election logged on each of ins after from (and Caddy's own
// shutdown line), in order, each line with its offset from from.
func timeline(from time.Time, ins ...*fleet.Instance) string {
	type line struct {
		at  time.Duration
		txt string
	}
	var lines []line
	for _, in := range ins {
		if in == nil {
			continue
		}
		b, err := os.ReadFile(in.LogPath())
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
