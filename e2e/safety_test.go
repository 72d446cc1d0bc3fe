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
// instances, the fault strikes, and safety.Check reads the backend's and the clients' logs
// (see internal/testkit/safety and the README's "Safety model" for the rule). The test prints the
// results table at the end.

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/faultproxy"
	"github.com/caddyleader/caddy-leader/internal/testkit/safety"
)

// safetyInstances is the size of every scenario's fleet.
const safetyInstances = 3

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
	env := safety.NewEnv(t, caddyBin, etcd, Config{Follower: "forward", InstanceEndpoints: map[string][]string{}})
	for i := range n {
		id := fmt.Sprintf("c%d", i) // StartFleet's ids
		for m := range etcd.members {
			p, err := faultproxy.New(etcd.Addr(m))
			if err != nil {
				t.Fatalf("fault proxy %s -> etcd m%d: %v", id, m, err)
			}
			t.Cleanup(func() { p.Close() })
			env.Links[id] = append(env.Links[id], p)
			env.Cfg.InstanceEndpoints[id] = append(env.Cfg.InstanceEndpoints[id], p.URL())
		}
	}
	if change != nil {
		change(&env.Cfg)
	}
	env.Launch(t, n)
	return env
}

// Every scenario starts a world of its own (etcd processes, fleet, fault proxies, ports),
// so they run side by side, as many at once as -parallel allows (GOMAXPROCS by default):
// most of a scenario's time is spent waiting for a fault's ttls to pass.
func TestSafety(t *testing.T) {
	needCaddy(t)
	results := startResults(t, fmt.Sprintf("ttl %v, %d instances, 3 etcd member processes, %d req/s", ttl, safetyInstances, safety.DefaultRate))
	for _, sc := range safetyScenarios() {
		report := results.row()
		t.Run(sc.Name, func(t *testing.T) {
			t.Parallel()
			report(runScenario(t, sc))
		})
	}
	for _, tc := range []struct {
		name string
		run  func(t *testing.T) safetyReport
	}{
		{"drain_on_graceful_handover", testDrain},
		{"drain_timeout_bounds_the_handover", testDrainTimeout},
		{"cancel_on_loss_aborts_the_deposed_leaders_upstream_call", testCancelOnLoss},
	} {
		report := results.row()
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			report(tc.run(t))
		})
	}
}

func safetyScenarios() []safetyScenario {
	return []safetyScenario{
		{Name: "1_steady_state", Load: 4 * time.Second, Change: safety.NoChange, NoErrors: true},
		{Name: "2_sigkill_leader", Load: 7 * time.Second, Change: safety.MustChange, Fault: func(s *scenarioRun) {
			s.Survivors = others(s.Fleet, s.Leader)
			s.Leader.Kill()
		}},
		{Name: "3_sigterm_leader", Load: 5 * time.Second, Change: safety.MustChange, NoErrors: true, Fault: func(s *scenarioRun) {
			s.Survivors = others(s.Fleet, s.Leader)
			s.Load.MarkDown(s.Leader) // the load balancer's health check
			s.Leader.Term()
		}},
		{Name: "4_sigstop_leader_2ttl_then_sigcont", Load: 9 * time.Second, Frozen: true, Change: safety.MustChange, Fault: safety.SigstopFault[*etcdProcs]},
		{Name: "5_leader_cut_off_from_etcd_2ttl", Load: 9 * time.Second, Change: safety.MustChange, Fault: func(s *scenarioRun) {
			s.Cut(s.Leader)
			time.Sleep(2 * ttl)
			s.Heal(s.Leader)
		}},
		{Name: "6a_leader_etcd_links_delayed_400ms_each_way", Load: 10 * time.Second, Change: safety.MayChange, Renews: true, Fault: safety.DelayFault[*etcdProcs](400 * time.Millisecond)},
		{Name: "6b_leader_etcd_links_delayed_800ms_each_way", Load: 10 * time.Second, Change: safety.MayChange, Renews: true, Fault: safety.DelayFault[*etcdProcs](800 * time.Millisecond)},
		{Name: "7a_etcd_raft_leader_sigkill", Load: 8 * time.Second, Change: safety.MayChange, Fault: func(s *scenarioRun) {
			victim := s.Store.LeaderIndex()
			s.Mark("etcd fault")
			s.Store.Kill(victim)
			s.Notes = append(s.Notes, fmt.Sprintf("killed raft leader m%d", victim))
		}},
		{Name: "7b_etcd_member_sigkill_then_restart_after_2ttl", Load: 9 * time.Second, Change: safety.MayChange, Fault: func(s *scenarioRun) {
			victim := (s.Store.LeaderIndex() + 1) % 3
			s.Store.Kill(victim)
			time.Sleep(2 * ttl)
			s.Store.Restart(victim)
			s.Notes = append(s.Notes, fmt.Sprintf("m%d (a follower) killed, back after %s", victim, safety.FmtDur(time.Since(s.FaultAt))))
		}},
		{Name: "8_all_etcd_members_sigkill_2ttl_then_restart", Load: 16 * time.Second, Change: safety.MustChange, Fault: func(s *scenarioRun) {
			var wg sync.WaitGroup
			for i := range s.Store.members {
				wg.Add(1)
				go func() { defer wg.Done(); s.Store.kill(i) }()
			}
			wg.Wait()
			time.Sleep(2 * ttl)
			s.Mark("restart")
			s.Store.Restart(0, 1, 2)
			s.Mark("restarted")
		}, Check: func(t *testing.T, s *scenarioRun, rep *safetyReport) {
			// Fail closed: nobody admits from one lease deadline after the outage began
			// until etcd is back.
			n := admittedBetween(s, s.FaultAt.Add(ttl), s.Marks["restart"])
			if n > 0 {
				t.Errorf("%d requests were admitted while etcd was down (from %v after the fault until the restart)", n, ttl)
			}
			rep.Notes = fmt.Sprintf("etcd back %s after the fault; %d admitted while it was down", safety.FmtDur(s.Marks["restarted"].Sub(s.FaultAt)), n)
		}},
		{Name: "9_twenty_reloads_of_the_leader", Load: 5 * time.Second, Change: safety.NoChange, Fault: func(s *scenarioRun) {
			cfg := s.Cfg
			for i := range 20 {
				cfg.Variant = fmt.Sprintf("v%d", 1+i%2) // a different config every time
				s.Leader.Reload(cfg)
				time.Sleep(100 * time.Millisecond)
			}
		}},
		{Name: "10_election_key_deleted_by_hand", Load: 5 * time.Second, Change: safety.MustChange, Fault: func(s *scenarioRun) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			resp, err := s.Store.Client().Delete(ctx, "/caddy-leader/default")
			if err != nil || resp.Deleted != 1 {
				s.T.Fatalf("delete the election key: %v (deleted %v)", err, resp)
			}
		}},
	}
}

func runScenario(t *testing.T, sc safetyScenario) safetyReport {
	return safety.RunOn(t, startSafetyEnv(t, sc.Config), sc)
}

// testDrain shows the drain of a graceful handover: with every gated request taking 300ms
// at the backend, the new leader's first request arrives only after the old leader's last
// one has finished.
func testDrain(t *testing.T) safetyReport {
	env := startSafetyEnv(t, nil)
	const slow = 300 * time.Millisecond
	env.Backend.SetDelay(slow)
	l := safety.NewLoadRun(env.Fleet, env.Client)
	const d = 5 * time.Second
	loadStart := time.Now()
	loaded := make(chan struct{})
	go func() { defer close(loaded); l.Run(100, d) }()
	time.Sleep(safety.DefaultWarmup)
	termAt := time.Now()
	l.MarkDown(env.Leader)
	env.Leader.Term()
	<-loaded // bounded by the load's duration and the client timeout

	log := env.Backend.Log()
	rep := safety.Check("3b_sigterm_leader_with_300ms_requests_(drain)", l.Results, log, env.Token, termAt, loadStart.Add(d))
	var inFlight, unfinished int
	var lastDone, firstNew time.Time
	for _, a := range log {
		switch {
		case a.Token == env.Token:
			if a.At.Before(termAt) && (a.Done.IsZero() || a.Done.After(termAt)) {
				inFlight++
			}
			if a.Done.IsZero() || a.Cancelled {
				unfinished++
			} else if a.Done.After(lastDone) {
				lastDone = a.Done
			}
		case a.Token > env.Token && (firstNew.IsZero() || a.At.Before(firstNew)):
			firstNew = a.At
		}
	}
	rep.Notes = fmt.Sprintf("%d requests of %s in flight at SIGTERM; ", inFlight, safety.FmtDur(slow))
	if firstNew.IsZero() || lastDone.IsZero() {
		rep.Notes += "no request of a newer term arrived after them" // CheckReport says what is missing
	} else {
		rep.Notes += "its last finished " + safety.FmtDur(firstNew.Sub(lastDone)) + " before the new term's first arrived"
	}
	safety.CheckReport(t, safety.MustChange, &rep, ttl)
	safety.CheckNoErrors(t, l.Results)
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
	WaitStableLeader(t, others(env.Fleet, env.Leader), safety.RecoverTimeout)
	return rep
}

// testDrainTimeout shows that drain_timeout bounds the drain: with requests that take 3s
// and drain_timeout 500ms, the successor begins after about 500ms, while the old leader's
// requests are still running.
func testDrainTimeout(t *testing.T) safetyReport {
	const drainTimeout = 500 * time.Millisecond
	env := startSafetyEnv(t, func(c *Config) { c.DrainTimeout = drainTimeout.String() })
	rest := others(env.Fleet, env.Leader)
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			env.Post(env.Leader, "/gated/slow?delay=3s", fmt.Sprintf("slow-%d", i))
		}()
	}
	for i := range 3 {
		env.WaitArrival(fmt.Sprintf("slow-%d", i), 5*time.Second, false)
	}
	l := safety.NewLoadRun(rest, env.Client)
	const d = 3 * time.Second
	loadStart := time.Now()
	loaded := make(chan struct{})
	go func() { defer close(loaded); l.Run(50, d) }()
	time.Sleep(200 * time.Millisecond)
	termAt := time.Now()
	env.Leader.Signal(syscall.SIGTERM)
	<-loaded
	env.Leader.WaitExit()
	wg.Wait()

	log := env.Backend.Log()
	rep := safety.Check("3c_sigterm_leader_with_3s_requests,_drain_timeout_500ms", l.Results, log, env.Token, termAt, loadStart.Add(d))
	var firstNew, firstEnd time.Time
	for _, a := range log {
		if strings.HasPrefix(a.ReqID, "slow-") && !a.Done.IsZero() && (firstEnd.IsZero() || a.Done.Before(firstEnd)) {
			firstEnd = a.Done
		}
		if a.Token > env.Token && (firstNew.IsZero() || a.At.Before(firstNew)) {
			firstNew = a.At
		}
	}
	rep.Notes = fmt.Sprintf("new term's first request %s after SIGTERM, %s before the old leader's 3s requests ended", safety.FmtDur(firstNew.Sub(termAt)), safety.FmtDur(firstEnd.Sub(firstNew)))
	safety.CheckReport(t, safety.MustChange, &rep, ttl)
	switch {
	case firstNew.IsZero():
		t.Errorf("no request of a new term arrived")
	case firstNew.Sub(termAt) < drainTimeout:
		t.Errorf("the new term began %v after SIGTERM, before the drain timeout (%v) with requests in flight", firstNew.Sub(termAt), drainTimeout)
	case firstEnd.IsZero() || !firstEnd.After(firstNew):
		t.Errorf("the old leader's slow requests ended (%v) before the new term began (%v): the test did not exercise the drain timeout",
			firstEnd.Format(time.StampMicro), firstNew.Format(time.StampMicro))
	}
	WaitStableLeader(t, rest, safety.RecoverTimeout)
	return rep
}

// testCancelOnLoss cuts a leader off from etcd while one of its gated requests waits on a
// slow backend: without cancel_on_loss the call runs to its end under the old term, after
// the new leader began; with it, the call is aborted once the lease deadline passes.
func testCancelOnLoss(t *testing.T) safetyReport {
	env := startSafetyEnv(t, nil)
	started := time.Now()

	// Control: cancel_on_loss off.
	first := env.Leader
	off := make(chan outcome, 1)
	go func() { off <- env.Post(first, "/gated/slow?delay=5s", "slow-off") }()
	env.WaitArrival("slow-off", 5*time.Second, false)
	env.Cut(first)
	next, _ := WaitStableLeader(t, others(env.Fleet, first), safety.RecoverTimeout)
	if o := env.Post(next, "/gated/probe", "probe-off"); o.Status != http.StatusOK {
		t.Fatalf("new leader %s: /gated/probe = %d, %v", next, o.Status, o.Err)
	}
	probe := env.WaitArrival("probe-off", 5*time.Second, false)
	ranOn := env.WaitArrival("slow-off", 10*time.Second, true)
	<-off
	if ranOn.Cancelled {
		t.Errorf("without cancel_on_loss the deposed leader's upstream call was cancelled")
	}
	env.Heal(first)
	env.Leader, env.Token = WaitStableLeader(t, env.Fleet, safety.RecoverTimeout)

	// cancel_on_loss on, through a reload of every instance (the terms go on).
	env.Cfg.CancelOnLoss = true
	for _, in := range env.Fleet {
		in.Reload(env.Cfg)
	}
	leader, token := WaitStableLeader(t, env.Fleet, safety.RecoverTimeout)
	on := make(chan outcome, 1)
	go func() { on <- env.Post(leader, "/gated/slow?delay=20s", "slow-on") }()
	env.WaitArrival("slow-on", 5*time.Second, false)
	cutAt := time.Now()
	env.Cut(leader)
	aborted := env.WaitArrival("slow-on", ttl+5*time.Second, true)
	answer := <-on
	env.Heal(leader)
	WaitStableLeader(t, env.Fleet, safety.RecoverTimeout)

	rep := safetyReport{Scenario: "cancel_on_loss", Title: "`cancel_on_loss`, leader cut off", Statuses: map[int]int{}, Takeover: -1}
	for _, a := range env.Backend.Log() {
		if a.Entered.IsZero() || a.Admitted.IsZero() || a.Token == 0 {
			rep.Unstamp++
		}
	}
	client := fmt.Sprintf("the client got %d", answer.Status)
	if answer.Err != nil {
		client = fmt.Sprintf("the client got no answer: %v", answer.Err)
	}
	rep.Notes = fmt.Sprintf("off: the cut-off leader's call ran to its end %s after the new leader's first request; on: aborted %s after the cut (%s)",
		safety.FmtDur(ranOn.Done.Sub(probe.At)), safety.FmtDur(aborted.Done.Sub(cutAt)), client)
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
