//go:build unix

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/caddyleader/caddy-leader/internal/testkit/fleet"
	"github.com/caddyleader/caddy-leader/internal/testkit/safety"
)

// Environment variables of TestSafetySoak.
const (
	// soakDurationEnv sets how long faults are injected, a Go duration. Default: 60s.
	soakDurationEnv = "CADDY_LEADER_SOAK"
	// soakSeedEnv replays a run: the seed its log gave. Default: a new seed every run.
	soakSeedEnv = "CADDY_LEADER_SOAK_SEED"
	// soakFaultsEnv narrows the faults to a comma-separated list of kinds (see
	// soakFaults), to tell one fault's findings from another's. Default: every kind.
	soakFaultsEnv = "CADDY_LEADER_SOAK_FAULTS"
)

const (
	// soakRate is the clients' requests per second over the whole fleet.
	soakRate = 100
	// soakMaxDown is how many instances may be under a process fault (killed, frozen,
	// stopping) at once, so that the fleet goes on electing leaders between faults.
	soakMaxDown = 2
	// soakSettle is how long the load goes on after the fleet has a leader again.
	soakSettle = 2 * time.Second
)

// TestSafetySoak injects random, overlapping faults into a fleet under steady load, and
// then checks the whole run for double admission, by time of admission and by token:
//
//	CADDY_LEADER_SOAK=5m CADDY_LEADER_SOAK_SEED=42 go test -count=1 -v -run TestSafetySoak ./e2e/
//
// The faults: SIGKILL and restart, SIGSTOP past the ttl and SIGCONT, a cut or slow link to
// etcd, SIGTERM and restart, an etcd member's SIGKILL and restart, the election key deleted
// and the leader's lease revoked by hand, and an operator's transfer and resign through an
// instance's admin API. A seeded RNG picks each fault, its target (often
// the leader) and its duration; a new fault starts every 0.4-1.6s, so they overlap. The
// instances run one follower mode each (the seed assigns them), so every mode is exercised.
// Once the faults stop and are repaired, the fleet must agree on a leader that serves.
func TestSafetySoak(t *testing.T) { runSoak(t, 60*time.Second, false) }

// TestSafetySoakFailsafe is a shorter soak of a fleet with failsafe on: the same faults,
// the same rule.
func TestSafetySoakFailsafe(t *testing.T) { runSoak(t, 20*time.Second, true) }

// runSoak injects random faults for d (or the duration the environment asks for) into a
// fleet, with failsafe on if failsafe is set.
func runSoak(t *testing.T, d time.Duration, failsafe bool) {
	needCaddy(t)
	if !failsafe {
		// A world of its own: it runs beside the other parallel tests (see the package
		// comment). A failsafe soak runs alone, as TestSafetyFailsafe does.
		t.Parallel()
	}
	if v := os.Getenv(soakDurationEnv); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil || d <= 0 {
			t.Fatalf("%s=%q: want a positive Go duration", soakDurationEnv, v)
		}
	}
	seed := time.Now().UnixNano()
	if v := os.Getenv(soakSeedEnv); v != "" {
		var err error
		if seed, err = strconv.ParseInt(v, 10, 64); err != nil {
			t.Fatalf("%s=%q: want an integer", soakSeedEnv, v)
		}
	}
	kinds, err := soakKinds(os.Getenv(soakFaultsEnv))
	if err != nil {
		t.Fatalf("%s: %v", soakFaultsEnv, err)
	}
	t.Logf("soak: %v of faults, seed %d (replay with %s=%d)", d, seed, soakSeedEnv, seed)

	// A graceful stop drains for drain_timeout at most; keep it short so that restarts
	// after SIGTERM come soon.
	env := startSafetyEnv(t, func(c *Config) {
		c.DrainTimeout = "3s"
		if failsafe {
			withFailsafe(t, failsafeLinks{})(c)
		}
	})
	s := newSoak(t, env, seed, kinds)
	defer func() {
		s.tmu.Lock()
		t.Logf("soak timeline (seed %d, from %s):\n%s", seed, s.start.Format("15:04:05.000"), strings.Join(s.timeline, "\n"))
		s.tmu.Unlock()
		if t.Failed() {
			t.Logf("election log of every process, in soak time:\n%s", s.electionLogs())
		}
	}()

	loadDone := make(chan struct{})
	stopLoad := make(chan struct{})
	go func() { defer close(loadDone); s.runLoad(stopLoad) }()
	time.Sleep(safety.DefaultWarmup)
	s.inject(d)
	s.repairAll()

	leader, token := WaitStableLeader(t, s.current(), safety.RecoverTimeout)
	s.event("fleet agrees: %s leads with token %d", leader, token)
	time.Sleep(soakSettle)
	close(stopLoad)
	<-loadDone
	// A leader frozen by the last fault can find its lease gone only after the fleet
	// agreed on it, and a new term follows: the final request goes to whoever leads now.
	if l, tok := WaitStableLeader(t, s.current(), safety.RecoverTimeout); tok != token {
		s.event("fleet agrees again: %s leads with token %d", l, tok)
		leader, token = l, tok
	}
	if o := env.Post(leader, "/gated/final", "final"); o.Status != http.StatusOK {
		t.Errorf("leader %s after the faults: /gated/final = %d, %v; want 200", leader, o.Status, o.Err)
	} else if a := env.WaitArrival("final", 5*time.Second, false); a.Token != token || a.ServedBy != leader.ID {
		t.Errorf("leader %s (token %d) after the faults: /gated/final arrived from %s with token %d", leader, token, a.ServedBy, a.Token)
	}

	log := env.Backend.Log()
	rep := safety.Check("soak", s.results, log, env.Token, time.Time{}, time.Time{})
	// checkStale judges the stale arrivals, freeze by freeze and request by request; the
	// rest of checkReport's rules apply as they are.
	rep.Frozen = true
	rep.Notes = fmt.Sprintf("seed %d, faults: %s", seed, s.faultSummary())
	safety.CheckReport(t, safety.MayChange, &rep, ttl)
	s.checkStale(log)
	t.Logf("soak: %d requests (%s), %d arrivals over %d terms; %d double admissions (by time, up to %s), %d stale arrivals (by token), %d with a wrong token",
		len(s.results), safety.FmtStatuses(rep.Statuses, true), len(log), len(rep.Terms), rep.Double, safety.FmtDur(rep.DoubleSpan), rep.Stale, rep.Wrong)
	if len(rep.Terms) < 2 {
		t.Errorf("only terms %v served in the whole soak: the faults did not move leadership", rep.Terms)
	}
}

// soak is a soak run in progress. Only the test's goroutine injects and repairs faults;
// the load reads the current instances under mu.
type soak struct {
	*safetyEnv
	rng   *rand.Rand
	kinds []soakFault      // the faults to pick from
	op    *clientv3.Client // the operator's etcd client
	start time.Time
	cfgs  map[string]Config // each instance's config, for restarts
	ids   []string

	mu   sync.Mutex
	inst map[string]*Instance // the current process of each instance id
	runs []*Instance          // every process started, in order
	down map[string]bool      // killed or stopping: out of the load's rotation

	procFault map[string]string // id -> the process fault on it
	linkFault map[string]string // id -> the link fault on it
	etcdDown  int               // the member that is down; -1 for none
	pending   []soakRepair
	frozen    []freezeWindow
	counts    map[string]int // faults injected, by kind

	tmu      sync.Mutex // the timeline is written by the operators' requests too
	timeline []string

	loadMu  sync.Mutex
	results []outcome // the load's outcomes
}

type soakRepair struct {
	due  time.Time
	what string
	do   func()
}

// freezeWindow is when an instance was stopped (SIGSTOP to SIGCONT).
type freezeWindow struct {
	id         string
	from, till time.Time
}

func newSoak(t *testing.T, env *safetyEnv, seed int64, kinds []soakFault) *soak {
	s := &soak{
		safetyEnv: env,
		rng:       rand.New(rand.NewSource(seed)),
		kinds:     kinds,
		op:        env.Store.Client(),
		start:     time.Now(),
		cfgs:      map[string]Config{},
		inst:      map[string]*Instance{},
		down:      map[string]bool{},
		procFault: map[string]string{},
		linkFault: map[string]string{},
		etcdDown:  -1,
		counts:    map[string]int{},
	}
	// One follower mode per instance, assigned by the seed. A reload keeps the term.
	modes := []string{"reject", "redirect", "forward"}
	s.rng.Shuffle(len(modes), func(i, j int) { modes[i], modes[j] = modes[j], modes[i] })
	for i, in := range env.Fleet {
		cfg := env.Cfg
		cfg.Follower = modes[i%len(modes)]
		if cfg.Follower != env.Cfg.Follower {
			in.Reload(cfg)
		}
		s.cfgs[in.ID] = cfg
		s.inst[in.ID] = in
		s.runs = append(s.runs, in)
		s.ids = append(s.ids, in.ID)
		s.event("%s runs follower mode %s", in, cfg.Follower)
	}
	s.event("%s leads with token %d", env.Leader, env.Token)
	return s
}

func (s *soak) event(format string, args ...any) {
	s.tmu.Lock()
	defer s.tmu.Unlock()
	s.timeline = append(s.timeline, fmt.Sprintf("%8s  %s", s.at(time.Now()), fmt.Sprintf(format, args...)))
}

// current returns the current process of every instance.
func (s *soak) current() []*Instance {
	s.mu.Lock()
	defer s.mu.Unlock()
	var fleet []*Instance
	for _, id := range s.ids {
		fleet = append(fleet, s.inst[id])
	}
	return fleet
}

// runLoad sends soakRate POSTs per second round-robin over the instances in rotation
// until stop is closed, then waits for every answer.
func (s *soak) runLoad(stop chan struct{}) {
	tick := time.NewTicker(time.Second / soakRate)
	defer tick.Stop()
	var wg sync.WaitGroup
	next := 0
	for n := 0; ; n++ {
		select {
		case <-stop:
			wg.Wait()
			return
		case <-tick.C:
		}
		var target *Instance
		s.mu.Lock()
		for range s.ids {
			next++
			if id := s.ids[next%len(s.ids)]; !s.down[id] {
				target = s.inst[id]
				break
			}
		}
		s.mu.Unlock()
		if target == nil {
			continue
		}
		wg.Add(1)
		go func(id string) {
			defer wg.Done()
			o := s.Post(target, "/gated/soak", id)
			s.loadMu.Lock()
			s.results = append(s.results, o)
			s.loadMu.Unlock()
		}(fmt.Sprintf("k%06d", n))
	}
}

// inject starts a random fault every 0.4-1.6s for d, and repairs each when it is due.
func (s *soak) inject(d time.Duration) {
	end := time.Now().Add(d)
	nextFault := time.Now()
	for {
		now := time.Now()
		s.runDue(now)
		if !now.Before(end) {
			return
		}
		if !now.Before(nextFault) {
			s.strike()
			nextFault = time.Now().Add(s.between(400*time.Millisecond, 1600*time.Millisecond))
		}
		wake := nextFault
		if end.Before(wake) {
			wake = end
		}
		if len(s.pending) > 0 && s.pending[0].due.Before(wake) {
			wake = s.pending[0].due
		}
		time.Sleep(time.Until(wake))
	}
}

// runDue runs the repairs due by now, earliest first.
func (s *soak) runDue(now time.Time) {
	for len(s.pending) > 0 && !s.pending[0].due.After(now) {
		r := s.pending[0]
		s.pending = s.pending[1:]
		r.do()
		s.event("repaired: %s", r.what)
	}
}

// repairAll runs every pending repair at once: the faults stop.
func (s *soak) repairAll() {
	s.event("faults stop")
	for len(s.pending) > 0 {
		s.runDue(s.pending[len(s.pending)-1].due)
	}
}

// after schedules a repair.
func (s *soak) after(d time.Duration, what string, do func()) {
	s.pending = append(s.pending, soakRepair{due: time.Now().Add(d), what: what, do: do})
	slices.SortStableFunc(s.pending, func(a, b soakRepair) int { return a.due.Compare(b.due) })
}

// between returns a random duration in [lo, hi).
func (s *soak) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(s.rng.Int63n(int64(hi-lo)))
}

// soakFault is a kind of fault and how often it is picked.
type soakFault struct {
	kind   string
	weight int
}

// soakFaults are the kinds of fault.
var soakFaults = []soakFault{
	{"sigkill", 2}, {"sigstop", 2}, {"cut", 2}, {"slow", 2}, {"sigterm", 2},
	{"etcd_member_sigkill", 1}, {"key_delete", 1}, {"lease_revoke", 1},
	{"transfer", 1}, {"resign", 1},
}

// soakKinds returns the faults a comma-separated list of kinds names; all for "".
func soakKinds(list string) ([]soakFault, error) {
	if list == "" {
		return soakFaults, nil
	}
	var kinds []soakFault
	for _, name := range strings.Split(list, ",") {
		i := slices.IndexFunc(soakFaults, func(f soakFault) bool { return f.kind == strings.TrimSpace(name) })
		if i < 0 {
			return nil, fmt.Errorf("unknown fault %q (known: %v)", name, soakFaults)
		}
		kinds = append(kinds, soakFaults[i])
	}
	return kinds, nil
}

// strike picks a fault and a target and injects it; a fault whose target is taken (or that
// would take more instances down than soakMaxDown) is skipped.
func (s *soak) strike() {
	total := 0
	for _, f := range s.kinds {
		total += f.weight
	}
	pick := s.rng.Intn(total)
	kind := ""
	for _, f := range s.kinds {
		if pick < f.weight {
			kind = f.kind
			break
		}
		pick -= f.weight
	}
	target, role := s.target()
	in := s.inst[target]
	switch kind {
	case "sigkill", "sigstop", "sigterm":
		if s.procFault[target] != "" || len(s.procFault) >= soakMaxDown {
			return
		}
	case "cut", "slow":
		if s.linkFault[target] != "" {
			return
		}
	case "etcd_member_sigkill":
		if s.etcdDown >= 0 {
			return
		}
	}
	s.counts[kind]++
	switch kind {
	case "sigkill":
		s.setDown(target, true)
		in.Kill()
		s.procFault[target] = kind
		s.event("SIGKILL %s (%s)", in, role)
		s.after(s.between(500*time.Millisecond, 3*time.Second), "restart "+target, func() { s.restart(target) })
	case "sigterm":
		s.setDown(target, true) // the load balancer's health check
		in.Signal(syscall.SIGTERM)
		s.procFault[target] = kind
		s.event("SIGTERM %s (%s)", in, role)
		s.after(s.between(time.Second, 3*time.Second), "restart "+target+" once it has exited", func() {
			select {
			case <-in.Process().Exited():
			case <-time.After(exitTimeout):
				s.T.Errorf("instance %s: still running %v after SIGTERM (drain_timeout 3s); killing it", in, exitTimeout)
				in.Kill()
			}
			s.restart(target)
		})
	case "sigstop":
		in.Stop()
		from := time.Now()
		s.procFault[target] = kind
		s.event("SIGSTOP %s (%s)", in, role)
		s.after(ttl+s.between(200*time.Millisecond, 1500*time.Millisecond), "SIGCONT "+target, func() {
			in.Cont()
			s.frozen = append(s.frozen, freezeWindow{id: target, from: from, till: time.Now()})
			delete(s.procFault, target)
		})
	case "cut":
		s.Cut(in)
		s.linkFault[target] = kind
		s.event("cut %s's links to etcd (%s)", in, role)
		s.after(s.between(time.Second, 2*ttl+time.Second), "heal "+target+"'s links", func() {
			s.Heal(in)
			delete(s.linkFault, target)
		})
	case "slow":
		by := s.between(100*time.Millisecond, 800*time.Millisecond)
		s.Delay(in, by)
		s.linkFault[target] = kind
		s.event("slow %s's links to etcd by %s each way (%s)", in, safety.FmtDur(by), role)
		s.after(s.between(time.Second, 3*ttl), "heal "+target+"'s links", func() {
			s.Heal(in)
			delete(s.linkFault, target)
		})
	case "etcd_member_sigkill":
		m := s.rng.Intn(len(s.Store.members))
		s.Store.Kill(m)
		s.etcdDown = m
		s.event("SIGKILL etcd member m%d", m)
		s.after(s.between(time.Second, 2*ttl+time.Second), fmt.Sprintf("restart etcd member m%d", m), func() {
			s.Store.Restart(m)
			s.etcdDown = -1
		})
	case "key_delete":
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		resp, err := s.op.Delete(ctx, electionKey)
		cancel()
		if err != nil {
			s.event("delete the election key: %v", err)
		} else {
			s.event("deleted the election key (%d deleted)", resp.Deleted)
		}
	case "transfer", "resign":
		// An operator's request through the admin API of an instance that runs, to
		// whichever leads (or waits for its predecessor) then. It may be refused or time
		// out; what counts is that it never lets two instances admit at once.
		if s.procFault[target] != "" {
			return
		}
		path := "/leader/default/resign?hold_off=1s"
		if kind == "transfer" {
			to := s.ids[s.rng.Intn(len(s.ids))]
			path = "/leader/default/transfer?timeout=" + (3 * ttl).String() + "&to=" + to
		}
		url := fmt.Sprintf("http://127.0.0.1:%d%s", in.AdminPort, path)
		s.event("POST %s to %s (%s)", path, in, role)
		go func() {
			resp, err := fleet.Send(context.Background(), fleet.Client, http.MethodPost, url, nil, 4*ttl)
			s.event("%s answered %d %v", path, resp.Status, err)
		}()
	case "lease_revoke":
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		kv, err := revokeElectionLease(ctx, s.op)
		cancel()
		if err != nil {
			s.event("revoke the leader's lease: %v", err)
		} else {
			s.event("revoked lease %x of term %d (%s)", kv.Lease, kv.CreateRevision, kv.Value)
		}
	}
}

// target picks the instance a fault strikes: the leader (as a running instance sees it)
// two times in three, else any instance. It returns the id and "leader" or "follower".
func (s *soak) target() (string, string) {
	leader := ""
	if s.rng.Intn(3) < 2 {
		for _, i := range s.rng.Perm(len(s.ids)) {
			id := s.ids[i]
			if s.procFault[id] != "" {
				continue
			}
			if w, err := s.inst[id].Whoami(); err == nil && w.Leader != "" {
				leader = w.Leader
				break
			}
		}
	}
	if slices.Contains(s.ids, leader) {
		return leader, "leader"
	}
	return s.ids[s.rng.Intn(len(s.ids))], "random pick"
}

func (s *soak) setDown(id string, down bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down[id] = down
}

// restart starts instance id again with its config (on new ports) and puts it back in the
// load's rotation.
func (s *soak) restart(id string) {
	in := StartInstance(s.T, id, s.cfgs[id])
	s.mu.Lock()
	s.inst[id] = in
	s.runs = append(s.runs, in)
	s.down[id] = false
	s.mu.Unlock()
	delete(s.procFault, id)
}

// checkStale judges every stale arrival (a request whose token is lower than one that had
// already arrived): the check by token. A stale arrival is explained, and only counted,
// when
//   - the instance that served it was stopped (SIGSTOP) at some time between its gate
//     entry and its arrival: it may have been admitted before the freeze; or
//   - it was sent on (X-Admitted-At) before any newer term had sent a request on, and only
//     its way to the backend was slow: it was in flight, as after a freeze (a starved
//     process pauses much as a frozen one does; with E2E_CADDY_RACE=1 on a busy machine
//     this happens). The backend's own token check is what stops those.
//
// Any other fails the test: its term sent it on after a newer term had sent one on.
func (s *soak) checkStale(log []arrival) {
	firstSent := map[int64]time.Time{} // each term's earliest X-Admitted-At
	for _, a := range log {
		if first, ok := firstSent[a.Token]; !a.Admitted.IsZero() && (!ok || a.Admitted.Before(first)) {
			firstSent[a.Token] = a.Admitted
		}
	}
	tokens := slices.Sorted(maps.Keys(firstSent))
	sentAbove := map[int64]time.Time{} // the earliest first send of a newer term
	var earliest time.Time
	for i := len(tokens) - 1; i >= 0; i-- {
		sentAbove[tokens[i]] = earliest
		if first := firstSent[tokens[i]]; earliest.IsZero() || first.Before(earliest) {
			earliest = first
		}
	}

	var highest int64
	var frozen, inFlight, unexplained int
	var transit time.Duration // the longest way to the backend of a request in flight
	for _, a := range log {
		if a.Token == 0 {
			continue
		}
		if a.Token < highest {
			newer := sentAbove[a.Token]
			switch {
			case s.frozenBetween(a.ServedBy, a.Entered, a.At):
				frozen++
			case !a.Admitted.IsZero() && !newer.IsZero() && a.Admitted.Before(newer):
				inFlight++
				transit = max(transit, a.At.Sub(a.Admitted))
			default:
				if unexplained++; unexplained <= 10 {
					s.T.Errorf("STALE ARRIVAL: request %s served by %s with token %d after token %d had arrived, sent on %s after a newer term had sent one on, and %s was not frozen in between; soak time: gate entered %s, sent on %s (a newer term's first at %s), arrived %s",
						a.ReqID, a.ServedBy, a.Token, highest, safety.FmtDur(a.Admitted.Sub(newer)), a.ServedBy, s.at(a.Entered), s.at(a.Admitted), s.at(newer), s.at(a.At))
				}
			}
		}
		highest = max(highest, a.Token)
	}
	if unexplained > 10 {
		s.T.Errorf("STALE ARRIVALS: %d in all that neither a freeze nor a slow way explains", unexplained)
	}
	s.T.Logf("soak: stale arrivals: %d of requests admitted before their instance was frozen, %d in flight (sent on before any newer term sent one, up to %s on the way), %d unexplained",
		frozen, inFlight, safety.FmtDur(transit), unexplained)
}

// at renders t as the time since the soak began.
func (s *soak) at(t time.Time) string { return fmt.Sprintf("%.3fs", t.Sub(s.start).Seconds()) }

func (s *soak) frozenBetween(id string, from, till time.Time) bool {
	for _, w := range s.frozen {
		if w.id == id && w.from.Before(till) && w.till.After(from) {
			return true
		}
	}
	return false
}

// faultSummary renders the faults injected, by kind.
func (s *soak) faultSummary() string {
	var parts []string
	for _, f := range soakFaults {
		if n := s.counts[f.kind]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s×%d", f.kind, n))
		}
	}
	return strings.Join(parts, ", ")
}

// electionLogs returns the lines of the leader app's loggers from every process's log, in
// soak time: the part of the logs that shows who led when, which a failed run's log tails
// may have lost.
func (s *soak) electionLogs() string {
	type logLine struct {
		at   time.Time
		text string
	}
	var lines []logLine
	for _, in := range s.runs {
		raw, err := os.ReadFile(in.LogPath())
		if err != nil {
			lines = append(lines, logLine{text: fmt.Sprintf("%s (%s): no log: %v", in, in.URL(), err)})
			continue
		}
		for _, line := range strings.Split(string(raw), "\n") {
			var entry map[string]any
			if json.Unmarshal([]byte(line), &entry) != nil {
				continue
			}
			if logger, _ := entry["logger"].(string); logger != "leader" && !strings.HasPrefix(logger, "leader.") {
				continue
			}
			ts, _ := entry["ts"].(float64)
			at := time.Unix(0, int64(ts*float64(time.Second)))
			var fields []string
			for _, k := range slices.Sorted(maps.Keys(entry)) {
				switch k {
				case "ts", "level", "logger", "msg", "election":
				default:
					fields = append(fields, fmt.Sprintf("%s=%v", k, entry[k]))
				}
			}
			lines = append(lines, logLine{at: at, text: fmt.Sprintf("%9s  %s:%d %s %s: %s %s",
				s.at(at), in, in.HTTPPort, entry["level"], entry["logger"], entry["msg"], strings.Join(fields, " "))})
		}
	}
	slices.SortStableFunc(lines, func(a, b logLine) int { return a.at.Compare(b.at) })
	var b strings.Builder
	for _, l := range lines {
		b.WriteString(l.text + "\n")
	}
	return b.String()
}
