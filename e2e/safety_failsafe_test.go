//go:build unix

package e2e

// TestSafetyFailsafe runs the leader app's failsafe mode through real faults: three Caddy
// processes with failsafe on, each reaching the others' failsafe listeners through a fault
// proxy of its own, a 3-member etcd cluster of real processes, and the recording backend
// behind /gated (follower forward; the outage also in reject and redirect). The safety
// checker's rule is the same as TestSafety's:
//
//	go test -count=1 -v -run TestSafetyFailsafe ./e2e/

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/faultproxy"
	"github.com/caddyleader/caddy-leader/internal/testkit/freeport"
	"github.com/caddyleader/caddy-leader/internal/testkit/pgtest"
	"github.com/caddyleader/caddy-leader/internal/testkit/safety"
)

// failsafeLinks are the fault proxies in front of every instance's failsafe listener, by
// instance id: blackholing one cuts the leader's questions to that instance.
type failsafeLinks map[string]*faultproxy.Proxy

// withFailsafe turns failsafe on for a fleet of safetyInstances, each listener behind a
// fault proxy recorded in links.
func withFailsafe(t *testing.T, links failsafeLinks) func(*Config) {
	return withFailsafeN(t, links, safetyInstances)
}

// withFailsafeN is withFailsafe for a fleet of n.
func withFailsafeN(t *testing.T, links failsafeLinks, n int) func(*Config) {
	return func(c *Config) {
		ports := freeport.MustPick(t, n)
		c.FailsafePorts, c.FailsafeURLs = map[string]int{}, map[string]string{}
		for i, port := range ports {
			id := fmt.Sprintf("c%d", i)
			p, err := faultproxy.New(fmt.Sprintf("127.0.0.1:%d", port))
			if err != nil {
				t.Fatalf("fault proxy to %s's failsafe listener: %v", id, err)
			}
			t.Cleanup(func() { p.Close() })
			links[id] = p
			c.FailsafePorts[id], c.FailsafeURLs[id] = port, p.URL()
		}
	}
}

// waitRoster waits until the leader's GET /leader/ lists a confirmed failsafe roster of
// the whole fleet: from then on it can ride out an outage.
func waitRoster(s *scenarioRun) {
	s.T.Helper()
	var status struct {
		Elections []struct {
			Failsafe struct {
				Roster []string `json:"roster"`
			} `json:"failsafe"`
		} `json:"elections"`
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		resp, err := s.Leader.Admin(http.MethodGet, "/leader/", nil)
		if err == nil && json.Unmarshal([]byte(resp.Body), &status) == nil &&
			len(status.Elections) == 1 && len(status.Elections[0].Failsafe.Roster) == len(s.Fleet) {
			return
		}
		if time.Now().After(deadline) {
			s.T.Fatalf("%s lists no failsafe roster of the fleet: %v %+v", s.Leader.ID, err, status)
		}
	}
}

// killEtcd kills every etcd member at once, once the leader can ride it out if the fleet
// runs with failsafe.
func killEtcd(s *scenarioRun) {
	if s.Cfg.FailsafePorts != nil {
		waitRoster(s)
	}
	var wg sync.WaitGroup
	for i := range s.Store.members {
		wg.Add(1)
		go func() { defer wg.Done(); s.Store.kill(i) }()
	}
	wg.Wait()
	s.Mark("etcd down")
}

// restartEtcd brings every member back.
func restartEtcd(s *scenarioRun) {
	s.Mark("restart")
	s.Store.Restart(0, 1, 2)
	s.Mark("restarted")
}

// countOutage notes how many requests the backend admitted while etcd was down (from one
// ttl after the fault until the restart), and how many of the clients' requests failed in
// all.
func countOutage(s *scenarioRun, rep *safetyReport) (admitted, failed int) {
	admitted = admittedBetween(s, s.FaultAt.Add(ttl), s.Marks["restart"])
	for _, o := range s.Load.Results {
		if o.Status != http.StatusOK {
			failed++
		}
	}
	rep.Notes = fmt.Sprintf("etcd down %s: %d admitted meanwhile, %d failed in all", safety.FmtDur(s.Marks["restarted"].Sub(s.FaultAt)), admitted, failed)
	if len(s.Notes) > 0 {
		rep.Notes += "; " + fmt.Sprint(s.Notes)
	}
	return admitted, failed
}

// admittedBetween counts the requests the backend saw admitted between from and until: by
// the time the admitted request left the gate (X-Admitted-At), which is no earlier than
// its admission. A request that entered a gate during the window but was held there and
// admitted only after it (by a term that began once the store was back) does not count.
func admittedBetween(s *scenarioRun, from, until time.Time) int {
	n := 0
	for _, a := range s.Backend.Log() {
		at := a.Admitted
		if at.IsZero() {
			at = a.Entered
		}
		if a.Entered.After(from) && at.Before(until) {
			n++
		}
	}
	return n
}

// ridesOut fails the test unless the leader admitted requests in the last ttl before
// mark, a moment more than a ttl into an outage of etcd: the failsafe carried it on.
func ridesOut(t *testing.T, s *scenarioRun, mark string) {
	t.Helper()
	if n := admittedBetween(s, s.Marks[mark].Add(-ttl), s.Marks[mark]); n == 0 {
		t.Errorf("nothing admitted in the ttl before %q, %s into the outage", mark, safety.FmtDur(s.Marks[mark].Sub(s.FaultAt)))
	}
}

// TestSafetyFailsafePostgres: the PostgreSQL server stopped for 10 ttl under load, with
// failsafe, in forward mode: the leader serves gated requests throughout the outage. When
// the server is back, every lease has expired by its clock (PostgreSQL does not extend them
// on a restart, as etcd does), so a new term follows, and requests wait or fail for the
// length of one election then; the report gives how many.
func TestSafetyFailsafePostgres(t *testing.T) {
	needCaddy(t)
	server := pgtest.Start(t)
	links := failsafeLinks{}
	env := startPGEnv(t, server, "failsafe", "forward", nil, withFailsafeN(t, links, pgSafetyInstances))
	const outage = 10 * ttl
	rep := safety.RunOn(t, env, safetyScenario{
		Name: "postgres_stopped_10ttl_with_failsafe", Load: outage + 6*time.Second, Change: safety.MayChange, Renews: true,
		Fault: func(s *scenarioRun) {
			waitRoster(s)
			server.Stop(t)
			s.Mark("store down")
			time.Sleep(outage)
			s.Mark("restart")
			server.Start(t)
			s.Mark("restarted")
		},
		Check: func(t *testing.T, s *scenarioRun, rep *safetyReport) {
			if admitted, _ := countOutage(s, rep); admitted == 0 {
				t.Error("nothing was admitted while PostgreSQL was down")
			}
			ridesOut(t, s, "restart")
		},
	})
	t.Logf("RESULTS (ttl %v, %d instances with failsafe, PostgreSQL):%s", ttl, pgSafetyInstances, safety.Table([]safetyReport{rep}))
}

// The scenarios run one at a time, unlike TestSafety's: a leader riding its failsafe needs
// every round of questions answered within ttl/4, and two worlds side by side on two busy
// cores starved such rounds (an outage of 10 ttl asks about thirty).
func TestSafetyFailsafe(t *testing.T) {
	needCaddy(t)
	results := startResults(t, fmt.Sprintf("ttl %v, %d instances with failsafe, 3 etcd member processes, %d req/s", ttl, safetyInstances, safety.DefaultRate))
	for _, sc := range failsafeScenarios(t) {
		report := results.row()
		t.Run(sc.Name, func(t *testing.T) {
			report(runScenario(t, sc))
		})
	}
}

func failsafeScenarios(t *testing.T) []safetyScenario {
	const outage = 10 * ttl
	links := failsafeLinks{}
	return []safetyScenario{
		{Name: "F1_all_etcd_members_sigkill_10ttl_with_failsafe", Load: outage + 6*time.Second, Change: safety.MayChange, NoErrors: true, Renews: true,
			Config: withFailsafe(t, links),
			Fault:  etcdOutage(outage), Check: func(t *testing.T, s *scenarioRun, rep *safetyReport) {
				if admitted, _ := countOutage(s, rep); admitted == 0 {
					t.Error("nothing was admitted while etcd was down")
				}
			}},
		outageInMode("F1b_all_etcd_members_sigkill_10ttl_with_failsafe_reject", "reject", withFailsafe(t, links), outage),
		outageInMode("F1c_all_etcd_members_sigkill_10ttl_with_failsafe_redirect", "redirect", withFailsafe(t, links), outage),
		// After the outage a successor that cannot prove the old term over (no heartbeat
		// seen since) waits a ttl: the load goes on long enough to see the new term.
		{Name: "F2_all_etcd_members_sigkill_10ttl_without_failsafe", Load: outage + 10*time.Second, Change: safety.MustChange,
			Fault: etcdOutage(outage), Check: func(t *testing.T, s *scenarioRun, rep *safetyReport) {
				if admitted, _ := countOutage(s, rep); admitted != 0 {
					t.Errorf("%d requests were admitted while etcd was down, without failsafe", admitted)
				}
			}},
		{Name: "F3_leader_cut_off_from_etcd_and_one_peer", Load: 4*ttl + 6*time.Second, Change: safety.MustChange,
			Config: withFailsafe(t, links),
			Fault: func(s *scenarioRun) {
				peer := others(s.Fleet, s.Leader)[0]
				waitRoster(s)
				s.Cut(s.Leader)
				links[peer.ID].Blackhole()
				time.Sleep(4 * ttl)
				links[peer.ID].Heal()
				s.Heal(s.Leader)
				s.Notes = append(s.Notes, fmt.Sprintf("%s cut off from etcd and from %s's failsafe listener for %s", s.Leader.ID, peer.ID, 4*ttl))
			}},
		{Name: "F4_sigstop_leader_2ttl_during_failsafe", Load: 6*ttl + 6*time.Second, Frozen: true, Change: safety.MayChange, Renews: true,
			Config: withFailsafe(t, links),
			Check: func(t *testing.T, s *scenarioRun, rep *safetyReport) {
				ridesOut(t, s, "sigstop")
			},
			Fault: func(s *scenarioRun) {
				killEtcd(s)
				time.Sleep(2 * ttl)
				s.Mark("sigstop")
				safety.SigstopFault[*etcdProcs](s)
				time.Sleep(2 * ttl)
				restartEtcd(s)
			}},
		{Name: "F5_peer_sigkill_during_failsafe", Load: 6*ttl + 6*time.Second, Change: safety.MayChange, Renews: true,
			Config: withFailsafe(t, links),
			Fault: func(s *scenarioRun) {
				killEtcd(s)
				time.Sleep(2 * ttl)
				peer := others(s.Fleet, s.Leader)[0]
				s.Survivors = others(s.Fleet, peer)
				s.Load.MarkDown(peer)
				peer.Kill()
				s.Mark("peer killed")
				time.Sleep(2 * ttl)
				restartEtcd(s)
			}, Check: func(t *testing.T, s *scenarioRun, rep *safetyReport) {
				// One peer gone: the leader stops within a round and the window.
				ridesOut(t, s, "peer killed")
				late := admittedBetween(s, s.Marks["peer killed"].Add(ttl), s.Marks["restart"])
				if late > 0 {
					t.Errorf("%d requests admitted more than a ttl after a peer died, before etcd was back", late)
				}
				rep.Notes = fmt.Sprintf("%d admitted from a ttl after the peer died until etcd was back", late)
			}},
		{Name: "F7_new_instance_started_during_failsafe", Load: 6*ttl + 6*time.Second, Change: safety.MayChange, Renews: true,
			Config: withFailsafe(t, links),
			Fault: func(s *scenarioRun) {
				killEtcd(s)
				time.Sleep(ttl)
				cfg := s.Cfg
				cfg.InstanceEndpoints = map[string][]string{"c7": {s.Store.Addr(0), s.Store.Addr(1), s.Store.Addr(2)}}
				newcomer := StartInstance(s.T, "c7", cfg)
				s.Load.Add(newcomer)
				s.Survivors = append(append([]*Instance{}, s.Fleet...), newcomer)
				s.Mark("newcomer")
				time.Sleep(2 * ttl)
				restartEtcd(s)
				s.Notes = append(s.Notes, "c7, without failsafe, started 1 ttl into the outage")
			}, Check: func(t *testing.T, s *scenarioRun, rep *safetyReport) {
				ridesOut(t, s, "restart")
			}},
		{Name: "F6_etcd_back_for_the_followers_only", Load: 8*ttl + 6*time.Second, Change: safety.MustChange, Renews: true,
			Config: withFailsafe(t, links),
			Fault: func(s *scenarioRun) {
				killEtcd(s)
				time.Sleep(2 * ttl)
				s.Cut(s.Leader)
				restartEtcd(s)
				time.Sleep(4 * ttl) // the leader's lease runs out in etcd; its peers keep it alive
				s.Mark("heal")
				s.Heal(s.Leader)
			}, Check: func(t *testing.T, s *scenarioRun, rep *safetyReport) {
				ridesOut(t, s, "heal")
			}},
	}
}

// both applies a, then b.
func both(a, b func(*Config)) func(*Config) {
	return func(c *Config) { a(c); b(c) }
}

// outageServedByLeader checks an outage in a mode where followers refuse or redirect: the
// leader admitted requests throughout, and whatever failed was refused by a follower, not
// lost.
func outageServedByLeader(t *testing.T, s *scenarioRun, rep *safetyReport) {
	t.Helper()
	if admitted, _ := countOutage(s, rep); admitted == 0 {
		t.Error("nothing was admitted while etcd was down")
	}
	ridesOut(t, s, "restart")
	for _, o := range s.Load.Results {
		if o.Err != nil {
			t.Errorf("request %s to %s got no answer: %v", o.ReqID, o.Target, o.Err)
		}
	}
}

// etcdOutage kills every etcd member, waits d and brings them back.
func etcdOutage(d time.Duration) func(s *scenarioRun) {
	return func(s *scenarioRun) {
		killEtcd(s)
		time.Sleep(d)
		restartEtcd(s)
	}
}

// outageInMode is F1 with the followers in mode (reject or redirect): the leader serves
// throughout, and the followers answer as configured.
func outageInMode(name, mode string, failsafe func(*Config), outage time.Duration) safetyScenario {
	return safetyScenario{Name: name, Load: outage + 6*time.Second, Change: safety.MayChange, Renews: true,
		Config: both(failsafe, func(c *Config) { c.Follower = mode }),
		Fault:  etcdOutage(outage),
		Check: func(t *testing.T, s *scenarioRun, rep *safetyReport) {
			outageServedByLeader(t, s, rep)
		}}
}
