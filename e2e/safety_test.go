//go:build unix

package e2e

// TestSafety proves, fault by fault, that two instances never act as leader at once:
//
//	go test -count=1 -v -run TestSafety ./e2e/
//
// Every scenario starts a 3-member etcd cluster of real processes (cmd/etcd-local), three
// Caddy processes, each reaching every etcd member through a fault proxy of its own, and
// the recording backend behind /gated (follower forward, so that every request a client
// sends anywhere is served by the leader). Clients send 150 POST/s round-robin to the
// instances, the fault strikes, and checkSafety reads the backend's and the clients' logs
// (see safety_check_test.go and the README's "Safety model" for the rule). The test prints
// the results table at the end.

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/faultproxy"
)

const (
	// safetyInstances is the size of every scenario's fleet.
	safetyInstances = 3
	// safetyRate is the clients' requests per second over the whole fleet.
	safetyRate = 150
	// safetyWarmup is how long the clients send before the fault.
	safetyWarmup = 1500 * time.Millisecond
	// safetyClientTimeout bounds one client request; a frozen instance answers only after
	// SIGCONT.
	safetyClientTimeout = 10 * time.Second
	// recoverTimeout bounds the fleet agreeing on a leader again after a fault.
	recoverTimeout = 30 * time.Second
)

// safetyEnv is one scenario's world: etcd, fault proxies, backend and fleet.
type safetyEnv struct {
	t       *testing.T
	etcd    *etcdProcs
	links   map[string][]*faultproxy.Proxy // instance id -> its link to each etcd member
	backend *recordingBackend
	cfg     Config
	fleet   []*Instance
	leader  *Instance
	token   int64
	client  *http.Client
}

// startSafetyEnv starts a scenario's world with change applied to the fleet's config, and
// waits for a leader.
func startSafetyEnv(t *testing.T, change func(*Config)) *safetyEnv {
	t.Helper()
	return startSafetyEnvN(t, safetyInstances, change)
}

// startSafetyEnvN is startSafetyEnv with a fleet of n.
func startSafetyEnvN(t *testing.T, n int, change func(*Config)) *safetyEnv {
	t.Helper()
	etcd := startEtcdProcs(t, 3)
	env := &safetyEnv{t: t, etcd: etcd, backend: startBackend(t), links: map[string][]*faultproxy.Proxy{}}
	env.cfg = Config{Follower: "forward", Backend: env.backend.srv.URL, InstanceEndpoints: map[string][]string{}}
	for i := range n {
		id := fmt.Sprintf("c%d", i) // StartFleet's ids
		for m := range etcd.members {
			p, err := faultproxy.New(etcd.Addr(m))
			if err != nil {
				t.Fatalf("fault proxy %s -> etcd m%d: %v", id, m, err)
			}
			t.Cleanup(func() { p.Close() })
			env.links[id] = append(env.links[id], p)
			env.cfg.InstanceEndpoints[id] = append(env.cfg.InstanceEndpoints[id], p.URL())
		}
	}
	if change != nil {
		change(&env.cfg)
	}
	env.launch(t, n)
	return env
}

// launch starts a fleet of n with env.cfg, waits for its leader, and makes the clients'
// HTTP client.
func (env *safetyEnv) launch(t *testing.T, n int) {
	t.Helper()
	env.fleet = StartFleet(t, n, env.cfg)
	env.leader, env.token = WaitStableLeader(t, env.fleet, electTimeout)
	transport := &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 64}
	t.Cleanup(transport.CloseIdleConnections)
	env.client = &http.Client{Transport: transport, Timeout: safetyClientTimeout}
}

// cut blackholes every link of in to etcd; heal undoes cut and delay.
func (env *safetyEnv) cut(in *Instance) {
	for _, p := range env.links[in.ID] {
		p.Blackhole()
	}
}

func (env *safetyEnv) heal(in *Instance) {
	for _, p := range env.links[in.ID] {
		p.Heal()
	}
}

// delay makes every link of in to etcd deliver each chunk d late, in both directions.
func (env *safetyEnv) delay(in *Instance, d time.Duration) {
	for _, p := range env.links[in.ID] {
		p.Delay(d)
	}
}

// post sends one gated POST to in, with the request id the backend records.
func (env *safetyEnv) post(in *Instance, path, id string) outcome {
	return env.postMarked(in, path, id, "")
}

// postMarked is post with Caddy-Leader-Forwarded-By set to mark, unless it is empty.
func (env *safetyEnv) postMarked(in *Instance, path, id, mark string) outcome {
	req, _ := http.NewRequest(http.MethodPost, in.URL()+path, strings.NewReader(`{"write":"`+id+`"}`))
	req.Header.Set("X-Req-Id", id)
	if mark != "" {
		req.Header.Set("Caddy-Leader-Forwarded-By", mark)
	}
	resp, err := env.client.Do(req)
	if err != nil {
		return outcome{ReqID: id, Target: in.ID, Err: err}
	}
	resp.Body.Close()
	return outcome{ReqID: id, Target: in.ID, Status: resp.StatusCode, RetryAfter: resp.Header.Get("Retry-After")}
}

// waitArrival waits until the backend has logged request id, and returns its record.
func (env *safetyEnv) waitArrival(id string, within time.Duration, done bool) arrival {
	env.t.Helper()
	deadline := time.Now().Add(within)
	for {
		for _, a := range env.backend.log() {
			if a.ReqID == id && (!done || !a.Done.IsZero()) {
				return a
			}
		}
		if time.Now().After(deadline) {
			what := "arrived at"
			if done {
				what = "finished at"
			}
			env.t.Fatalf("request %s not %s the backend within %v", id, what, within)
		}
		time.Sleep(pollInterval)
	}
}

// scenarioRun is one scenario in progress.
type scenarioRun struct {
	*safetyEnv
	load      *loadRun
	faultAt   time.Time
	survivors []*Instance // the instances that must agree on a leader at the end
	extra     []outcome   // client requests sent besides the load
	marks     map[string]time.Time
	notes     []string
}

func (s *scenarioRun) mark(name string) { s.marks[name] = time.Now() }

// change says what a scenario expects of leadership.
type change int

const (
	mayChange  change = iota // safety only: a new term may or may not begin
	mustChange               // a new term must begin after the fault
	noChange                 // the term in place before the fault must be the only one
)

type safetyScenario struct {
	name string
	load time.Duration // how long the clients send, from the warmup before the fault
	// warmup is how long the clients send before the fault; 0 means safetyWarmup.
	warmup time.Duration
	// rate is the clients' requests per second; 0 means safetyRate.
	rate   int
	frozen bool // the old leader is frozen: it may be frozen mid-request
	// renews: the fault slows the leader's links without cutting them, so renewals sent
	// after it can still succeed and move its lease deadline on; its last admission is then
	// not bounded by ttl after the fault (double admission is still checked).
	renews bool
	// noErrors: every client request must be answered 200 (no fault, or a graceful one).
	noErrors bool
	change   change
	config   func(*Config)
	// fault strikes at the end of the warmup and returns when it and its repair are done.
	fault func(s *scenarioRun)
	// check makes the scenario's own checks of the report.
	check func(t *testing.T, s *scenarioRun, rep *safetyReport)
}

func TestSafety(t *testing.T) {
	needCaddy(t)
	started := time.Now()
	var reports []safetyReport
	defer func() {
		t.Logf("RESULTS (ttl %v, %d instances, 3 etcd member processes, %d req/s; %v in all):%s", ttl, safetyInstances, safetyRate, time.Since(started).Round(time.Second), safetyTable(reports))
	}()

	for _, sc := range safetyScenarios() {
		t.Run(sc.name, func(t *testing.T) {
			reports = append(reports, runScenario(t, sc))
		})
	}
	t.Run("drain_on_graceful_handover", func(t *testing.T) {
		reports = append(reports, testDrain(t))
	})
	t.Run("drain_timeout_bounds_the_handover", func(t *testing.T) {
		reports = append(reports, testDrainTimeout(t))
	})
	t.Run("cancel_on_loss_aborts_the_deposed_leaders_upstream_call", func(t *testing.T) {
		reports = append(reports, testCancelOnLoss(t))
	})
}

func safetyScenarios() []safetyScenario {
	return []safetyScenario{
		{name: "1_steady_state", load: 4 * time.Second, change: noChange, noErrors: true},
		{name: "2_sigkill_leader", load: 7 * time.Second, change: mustChange, fault: func(s *scenarioRun) {
			s.survivors = others(s.fleet, s.leader)
			s.leader.Kill()
		}},
		{name: "3_sigterm_leader", load: 5 * time.Second, change: mustChange, noErrors: true, fault: func(s *scenarioRun) {
			s.survivors = others(s.fleet, s.leader)
			s.load.markDown(s.leader) // the load balancer's health check
			s.leader.Term()
		}},
		{name: "4_sigstop_leader_2ttl_then_sigcont", load: 9 * time.Second, frozen: true, change: mustChange, fault: sigstopFault},
		{name: "5_leader_cut_off_from_etcd_2ttl", load: 9 * time.Second, change: mustChange, fault: func(s *scenarioRun) {
			s.cut(s.leader)
			time.Sleep(2 * ttl)
			s.heal(s.leader)
		}},
		{name: "6a_leader_etcd_links_delayed_400ms_each_way", load: 10 * time.Second, change: mayChange, renews: true, fault: delayFault(400 * time.Millisecond)},
		{name: "6b_leader_etcd_links_delayed_800ms_each_way", load: 10 * time.Second, change: mayChange, renews: true, fault: delayFault(800 * time.Millisecond)},
		{name: "7a_etcd_raft_leader_sigkill", load: 8 * time.Second, change: mayChange, fault: func(s *scenarioRun) {
			victim := s.etcd.LeaderIndex()
			s.mark("etcd fault")
			s.etcd.Kill(victim)
			s.notes = append(s.notes, fmt.Sprintf("killed raft leader m%d", victim))
		}},
		{name: "7b_etcd_member_sigkill_then_restart_after_2ttl", load: 9 * time.Second, change: mayChange, fault: func(s *scenarioRun) {
			victim := (s.etcd.LeaderIndex() + 1) % 3
			s.etcd.Kill(victim)
			time.Sleep(2 * ttl)
			s.etcd.Restart(victim)
			s.notes = append(s.notes, fmt.Sprintf("m%d (a follower) killed, back after %s", victim, fmtDur(time.Since(s.faultAt))))
		}},
		{name: "8_all_etcd_members_sigkill_2ttl_then_restart", load: 16 * time.Second, change: mustChange, fault: func(s *scenarioRun) {
			var wg sync.WaitGroup
			for i := range s.etcd.members {
				wg.Add(1)
				go func() { defer wg.Done(); s.etcd.kill(i) }()
			}
			wg.Wait()
			time.Sleep(2 * ttl)
			s.mark("restart")
			s.etcd.Restart(0, 1, 2)
			s.mark("restarted")
		}, check: func(t *testing.T, s *scenarioRun, rep *safetyReport) {
			// Fail closed: nobody admits from one lease deadline after the outage began
			// until etcd is back.
			n := admittedBetween(s, s.faultAt.Add(ttl), s.marks["restart"])
			if n > 0 {
				t.Errorf("%d requests were admitted while etcd was down (from %v after the fault until the restart)", n, ttl)
			}
			rep.Notes = fmt.Sprintf("etcd back %s after the fault; %d admitted while it was down", fmtDur(s.marks["restarted"].Sub(s.faultAt)), n)
		}},
		{name: "9_twenty_reloads_of_the_leader", load: 5 * time.Second, change: noChange, fault: func(s *scenarioRun) {
			cfg := s.cfg
			for i := range 20 {
				cfg.Variant = fmt.Sprintf("v%d", 1+i%2) // a different config every time
				s.leader.Reload(cfg)
				time.Sleep(100 * time.Millisecond)
			}
		}},
		{name: "10_election_key_deleted_by_hand", load: 5 * time.Second, change: mustChange, fault: func(s *scenarioRun) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			resp, err := s.etcd.Client().Delete(ctx, "/caddy-leader/default")
			if err != nil || resp.Deleted != 1 {
				s.t.Fatalf("delete the election key: %v (deleted %v)", err, resp)
			}
		}},
	}
}

// sigstopFault freezes the leader for 2 x ttl, then resumes it while requests are sent to
// it: some were queued in the kernel while it was frozen, so its first requests after
// SIGCONT are among them.
func sigstopFault(s *scenarioRun) {
	old := s.leader
	old.Stop()
	s.t.Cleanup(func() { _ = old.cmd.Process.Signal(syscall.SIGCONT) })
	time.Sleep(2*ttl - 50*time.Millisecond)

	const workers = 4
	var (
		mu  sync.Mutex
		wg  sync.WaitGroup
		out []outcome
	)
	stop := make(chan struct{})
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				o := s.post(old, "/gated/resumed", fmt.Sprintf("s%d-%04d", w, n))
				mu.Lock()
				out = append(out, o)
				mu.Unlock()
			}
		}()
	}
	time.Sleep(50 * time.Millisecond) // the first requests wait in the frozen process's queue
	s.mark("resumed")
	old.Cont()
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	s.extra = append(s.extra, out...)
	s.notes = append(s.notes, fmt.Sprintf("%d requests sent to it around SIGCONT: %s", len(out), fmtStatuses(summarize(out), true)))
}

// delayFault delays every link of the leader to etcd by d each way for 3 x ttl.
func delayFault(d time.Duration) func(s *scenarioRun) {
	return func(s *scenarioRun) {
		s.delay(s.leader, d)
		time.Sleep(3 * ttl)
		s.heal(s.leader)
	}
}

func runScenario(t *testing.T, sc safetyScenario) safetyReport {
	return runScenarioOn(t, startSafetyEnv(t, sc.config), sc)
}

// runScenarioOn runs sc on env, whose fleet may have been through scenarios before: only
// the backend's arrivals from this scenario's load on are checked. It leaves env.leader
// and env.token at the leader the survivors agree on at the end.
func runScenarioOn(t *testing.T, env *safetyEnv, sc safetyScenario) safetyReport {
	warmup, rate := sc.warmup, sc.rate
	if warmup == 0 {
		warmup = safetyWarmup
	}
	if rate == 0 {
		rate = safetyRate
	}
	s := &scenarioRun{safetyEnv: env, survivors: env.fleet, marks: map[string]time.Time{}}
	s.load = newLoadRun(env.fleet, env.client)
	loadStart := time.Now()
	loaded := make(chan struct{})
	go func() {
		defer close(loaded)
		s.load.run(rate, sc.load)
	}()
	time.Sleep(warmup)
	s.faultAt = time.Now()
	if sc.fault != nil {
		sc.fault(s)
	}
	select {
	case <-loaded:
	case <-time.After(time.Until(loadStart.Add(sc.load)) + safetyClientTimeout + 5*time.Second):
		t.Fatalf("the load did not finish")
	}
	loadEnd := loadStart.Add(sc.load)

	results := append(append([]outcome(nil), s.load.results...), s.extra...)
	rep := checkSafety(sc.name, results, env.backend.since(loadStart), env.token, s.faultAt, loadEnd)
	rep.Frozen = sc.frozen
	rep.Renews = sc.renews
	if rep.Notes == "" {
		rep.Notes = strings.Join(s.notes, "; ")
	}
	if sc.check != nil {
		sc.check(t, s, &rep)
	}
	checkReport(t, sc.change, &rep)
	if sc.noErrors {
		checkNoErrors(t, results)
	}

	// Whatever happened, the fleet must end up with one leader that all agree on.
	env.leader, env.token = WaitStableLeader(t, s.survivors, recoverTimeout)
	env.fleet = s.survivors
	return rep
}

// checkReport fails the test for what must never happen, and for what the scenario expects.
func checkReport(t *testing.T, want change, rep *safetyReport) {
	t.Helper()
	t.Logf("%s: %s", rep.Scenario, rep.row())
	for _, p := range rep.Problems {
		t.Log(p)
	}
	if rep.Unstamp > 0 {
		t.Errorf("%d requests reached the backend without a token or gate stamps", rep.Unstamp)
	}
	if rep.Double > 0 {
		t.Errorf("DOUBLE LEADERSHIP: %d requests admitted under an older term after a newer term had admitted", rep.Double)
	}
	if rep.Wrong > 0 {
		t.Errorf("%d requests reached the backend with the token of another instance's term", rep.Wrong)
	}
	if own := rep.Stale - rep.StaleWrong; own > 0 && !rep.Frozen {
		t.Errorf("%d stale arrivals (besides those with a wrong token), and the old leader was not frozen", own)
	}
	switch want {
	case noChange:
		if len(rep.Terms) != 1 {
			t.Errorf("terms %v, want the one term from before", rep.Terms)
		}
	case mustChange:
		if rep.Takeover < 0 {
			t.Errorf("no new term served a request after the fault (terms %v)", rep.Terms)
		}
	}
	// A leader cut off, frozen or without etcd stops admitting by its lease deadline, at
	// most ttl after the fault; only a graceful stop or a reload can keep it longer.
	if rep.Takeover >= 0 && rep.OldLastAdmit > ttl && !rep.Renews {
		t.Errorf("the old leader admitted requests until %v after the fault, later than its lease deadline allows (ttl %v)", rep.OldLastAdmit, ttl)
	}
}

// checkNoErrors fails the test for every client request not answered 200.
func checkNoErrors(t *testing.T, results []outcome) {
	t.Helper()
	for _, o := range results {
		if o.Status != http.StatusOK {
			t.Errorf("request %s to %s: status %d, error %v; want 200", o.ReqID, o.Target, o.Status, o.Err)
		}
	}
}

// testDrain shows the drain of a graceful handover: with every gated request taking 300ms
// at the backend, the new leader's first request arrives only after the old leader's last
// one has finished.
func testDrain(t *testing.T) safetyReport {
	env := startSafetyEnv(t, nil)
	const slow = 300 * time.Millisecond
	env.backend.setDelay(slow)
	l := newLoadRun(env.fleet, env.client)
	const d = 5 * time.Second
	loadStart := time.Now()
	loaded := make(chan struct{})
	go func() { defer close(loaded); l.run(100, d) }()
	time.Sleep(safetyWarmup)
	termAt := time.Now()
	l.markDown(env.leader)
	env.leader.Term()
	<-loaded // bounded by the load's duration and the client timeout

	log := env.backend.log()
	rep := checkSafety("3b_sigterm_leader_with_300ms_requests_(drain)", l.results, log, env.token, termAt, loadStart.Add(d))
	var inFlight, unfinished int
	var lastDone, firstNew time.Time
	for _, a := range log {
		switch {
		case a.Token == env.token:
			if a.At.Before(termAt) && (a.Done.IsZero() || a.Done.After(termAt)) {
				inFlight++
			}
			if a.Done.IsZero() || a.Cancelled {
				unfinished++
			} else if a.Done.After(lastDone) {
				lastDone = a.Done
			}
		case a.Token > env.token && (firstNew.IsZero() || a.At.Before(firstNew)):
			firstNew = a.At
		}
	}
	rep.Notes = fmt.Sprintf("%d requests of %s in flight at SIGTERM; its last finished %s before the new term's first arrived",
		inFlight, fmtDur(slow), fmtDur(firstNew.Sub(lastDone)))
	checkReport(t, mustChange, &rep)
	checkNoErrors(t, l.results)
	if inFlight == 0 {
		t.Errorf("no request was in flight at SIGTERM: the test did not exercise the drain")
	}
	if unfinished > 0 {
		t.Errorf("%d requests of the old term did not finish: the drain cut them off", unfinished)
	}
	if firstNew.IsZero() || !firstNew.After(lastDone) {
		t.Errorf("the new term's first request arrived at %v, the old term's last finished at %v: the successor did not wait for the drain",
			firstNew.Format(time.StampMicro), lastDone.Format(time.StampMicro))
	}
	WaitStableLeader(t, others(env.fleet, env.leader), recoverTimeout)
	return rep
}

// testDrainTimeout shows that drain_timeout bounds the drain: with requests that take 3s
// and drain_timeout 500ms, the successor begins after about 500ms, while the old leader's
// requests are still running.
func testDrainTimeout(t *testing.T) safetyReport {
	const drainTimeout = 500 * time.Millisecond
	env := startSafetyEnv(t, func(c *Config) { c.DrainTimeout = drainTimeout.String() })
	rest := others(env.fleet, env.leader)
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			env.post(env.leader, "/gated/slow?delay=3s", fmt.Sprintf("slow-%d", i))
		}()
	}
	for i := range 3 {
		env.waitArrival(fmt.Sprintf("slow-%d", i), 5*time.Second, false)
	}
	l := newLoadRun(rest, env.client)
	const d = 3 * time.Second
	loadStart := time.Now()
	loaded := make(chan struct{})
	go func() { defer close(loaded); l.run(50, d) }()
	time.Sleep(200 * time.Millisecond)
	termAt := time.Now()
	env.leader.signal(syscall.SIGTERM)
	<-loaded
	env.leader.waitExit()
	wg.Wait()

	log := env.backend.log()
	rep := checkSafety("3c_sigterm_leader_with_3s_requests,_drain_timeout_500ms", l.results, log, env.token, termAt, loadStart.Add(d))
	var firstNew, firstEnd time.Time
	for _, a := range log {
		if strings.HasPrefix(a.ReqID, "slow-") && !a.Done.IsZero() && (firstEnd.IsZero() || a.Done.Before(firstEnd)) {
			firstEnd = a.Done
		}
		if a.Token > env.token && (firstNew.IsZero() || a.At.Before(firstNew)) {
			firstNew = a.At
		}
	}
	rep.Notes = fmt.Sprintf("new term's first request %s after SIGTERM, %s before the old leader's 3s requests ended", fmtDur(firstNew.Sub(termAt)), fmtDur(firstEnd.Sub(firstNew)))
	checkReport(t, mustChange, &rep)
	switch {
	case firstNew.IsZero():
		t.Errorf("no request of a new term arrived")
	case firstNew.Sub(termAt) < drainTimeout:
		t.Errorf("the new term began %v after SIGTERM, before the drain timeout (%v) with requests in flight", firstNew.Sub(termAt), drainTimeout)
	case firstEnd.IsZero() || !firstEnd.After(firstNew):
		t.Errorf("the old leader's slow requests ended (%v) before the new term began (%v): the test did not exercise the drain timeout",
			firstEnd.Format(time.StampMicro), firstNew.Format(time.StampMicro))
	}
	WaitStableLeader(t, rest, recoverTimeout)
	return rep
}

// testCancelOnLoss cuts a leader off from etcd while one of its gated requests waits on a
// slow backend: without cancel_on_loss the call runs to its end under the old term, after
// the new leader began; with it, the call is aborted once the lease deadline passes.
func testCancelOnLoss(t *testing.T) safetyReport {
	env := startSafetyEnv(t, nil)
	started := time.Now()

	// Control: cancel_on_loss off.
	first := env.leader
	off := make(chan outcome, 1)
	go func() { off <- env.post(first, "/gated/slow?delay=5s", "slow-off") }()
	env.waitArrival("slow-off", 5*time.Second, false)
	env.cut(first)
	next, _ := WaitStableLeader(t, others(env.fleet, first), recoverTimeout)
	if o := env.post(next, "/gated/probe", "probe-off"); o.Status != http.StatusOK {
		t.Fatalf("new leader %s: /gated/probe = %d, %v", next, o.Status, o.Err)
	}
	probe := env.waitArrival("probe-off", 5*time.Second, false)
	ranOn := env.waitArrival("slow-off", 10*time.Second, true)
	<-off
	if ranOn.Cancelled {
		t.Errorf("without cancel_on_loss the deposed leader's upstream call was cancelled")
	}
	env.heal(first)
	env.leader, env.token = WaitStableLeader(t, env.fleet, recoverTimeout)

	// cancel_on_loss on, through a reload of every instance (the terms go on).
	env.cfg.CancelOnLoss = true
	for _, in := range env.fleet {
		in.Reload(env.cfg)
	}
	leader, token := WaitStableLeader(t, env.fleet, recoverTimeout)
	on := make(chan outcome, 1)
	go func() { on <- env.post(leader, "/gated/slow?delay=20s", "slow-on") }()
	env.waitArrival("slow-on", 5*time.Second, false)
	cutAt := time.Now()
	env.cut(leader)
	aborted := env.waitArrival("slow-on", ttl+5*time.Second, true)
	answer := <-on
	env.heal(leader)
	WaitStableLeader(t, env.fleet, recoverTimeout)

	rep := safetyReport{Scenario: "cancel_on_loss", Title: "`cancel_on_loss`, leader cut off", Statuses: map[int]int{}, Takeover: -1}
	for _, a := range env.backend.log() {
		if a.Entered.IsZero() || a.Admitted.IsZero() || a.Token == 0 {
			rep.Unstamp++
		}
	}
	client := fmt.Sprintf("the client got %d", answer.Status)
	if answer.Err != nil {
		client = fmt.Sprintf("the client got no answer: %v", answer.Err)
	}
	rep.Notes = fmt.Sprintf("off: the cut-off leader's call ran to its end %s after the new leader's first request; on: aborted %s after the cut (%s)",
		fmtDur(ranOn.Done.Sub(probe.At)), fmtDur(aborted.Done.Sub(cutAt)), client)
	t.Logf("cancel_on_loss: %s (leader %s, token %d; %v in all)", rep.Notes, leader, token, time.Since(started).Round(time.Second))
	if !aborted.Cancelled {
		t.Errorf("with cancel_on_loss the cut-off leader's upstream call was not cancelled: it finished %v after the cut", aborted.Done.Sub(cutAt))
	} else if took := aborted.Done.Sub(cutAt); took > ttl+time.Second {
		t.Errorf("with cancel_on_loss the upstream call was cancelled %v after the cut, later than the lease deadline allows (ttl %v)", took, ttl)
	}
	if rep.Unstamp > 0 {
		t.Errorf("%d requests reached the backend without a token or gate stamps", rep.Unstamp)
	}
	return rep
}
