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

	"github.com/caddyleader/caddy-leader/internal/faultproxy"
	"github.com/caddyleader/caddy-leader/internal/freeport"
	"github.com/caddyleader/caddy-leader/internal/pgtest"
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
	s.t.Helper()
	var status struct {
		Elections []struct {
			Failsafe struct {
				Roster []string `json:"roster"`
			} `json:"failsafe"`
		} `json:"elections"`
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		resp, err := s.leader.admin(http.MethodGet, "/leader/", nil)
		if err == nil && json.Unmarshal([]byte(resp.Body), &status) == nil &&
			len(status.Elections) == 1 && len(status.Elections[0].Failsafe.Roster) == len(s.fleet) {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("%s lists no failsafe roster of the fleet: %v %+v", s.leader.ID, err, status)
		}
	}
}

// killEtcd kills every etcd member at once, once the leader can ride it out if the fleet
// runs with failsafe.
func killEtcd(s *scenarioRun) {
	if s.cfg.FailsafePorts != nil {
		waitRoster(s)
	}
	var wg sync.WaitGroup
	for i := range s.etcd.members {
		wg.Add(1)
		go func() { defer wg.Done(); s.etcd.kill(i) }()
	}
	wg.Wait()
	s.mark("etcd down")
}

// restartEtcd brings every member back.
func restartEtcd(s *scenarioRun) {
	s.mark("restart")
	s.etcd.Restart(0, 1, 2)
	s.mark("restarted")
}

// countOutage notes how many requests the backend admitted while etcd was down (from one
// ttl after the fault until the restart), and how many of the clients' requests failed in
// all.
func countOutage(s *scenarioRun, rep *safetyReport) (admitted, failed int) {
	admitted = admittedBetween(s, s.faultAt.Add(ttl), s.marks["restart"])
	for _, o := range s.load.results {
		if o.Status != http.StatusOK {
			failed++
		}
	}
	rep.Notes = fmt.Sprintf("etcd down %s: %d admitted meanwhile, %d failed in all", fmtDur(s.marks["restarted"].Sub(s.faultAt)), admitted, failed)
	if len(s.notes) > 0 {
		rep.Notes += "; " + fmt.Sprint(s.notes)
	}
	return admitted, failed
}

// admittedBetween counts the requests the backend saw admitted between from and until: by
// the time the admitted request left the gate (X-Admitted-At), which is no earlier than
// its admission. A request that entered a gate during the window but was held there and
// admitted only after it (by a term that began once the store was back) does not count.
func admittedBetween(s *scenarioRun, from, until time.Time) int {
	n := 0
	for _, a := range s.backend.log() {
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
	if n := admittedBetween(s, s.marks[mark].Add(-ttl), s.marks[mark]); n == 0 {
		t.Errorf("nothing admitted in the ttl before %q, %s into the outage", mark, fmtDur(s.marks[mark].Sub(s.faultAt)))
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
	rep := runScenarioOn(t, env, safetyScenario{
		name: "postgres_stopped_10ttl_with_failsafe", load: outage + 6*time.Second, change: mayChange, renews: true,
		fault: func(s *scenarioRun) {
			waitRoster(s)
			server.Stop(t)
			s.mark("store down")
			time.Sleep(outage)
			s.mark("restart")
			server.Start(t)
			s.mark("restarted")
		},
		check: func(t *testing.T, s *scenarioRun, rep *safetyReport) {
			if admitted, _ := countOutage(s, rep); admitted == 0 {
				t.Error("nothing was admitted while PostgreSQL was down")
			}
			ridesOut(t, s, "restart")
		},
	})
	t.Logf("RESULTS (ttl %v, %d instances with failsafe, PostgreSQL):%s", ttl, pgSafetyInstances, safetyTable([]safetyReport{rep}))
}

func TestSafetyFailsafe(t *testing.T) {
	needCaddy(t)
	started := time.Now()
	var reports []safetyReport
	defer func() {
		t.Logf("RESULTS (ttl %v, %d instances with failsafe, 3 etcd member processes, %d req/s; %v in all):%s", ttl, safetyInstances, safetyRate, time.Since(started).Round(time.Second), safetyTable(reports))
	}()
	for _, sc := range failsafeScenarios(t) {
		t.Run(sc.name, func(t *testing.T) {
			reports = append(reports, runScenario(t, sc))
		})
	}
}

func failsafeScenarios(t *testing.T) []safetyScenario {
	const outage = 10 * ttl
	links := failsafeLinks{}
	return []safetyScenario{
		{name: "F1_all_etcd_members_sigkill_10ttl_with_failsafe", load: outage + 6*time.Second, change: mayChange, noErrors: true, renews: true,
			config: withFailsafe(t, links),
			fault:  etcdOutage(outage), check: func(t *testing.T, s *scenarioRun, rep *safetyReport) {
				if admitted, _ := countOutage(s, rep); admitted == 0 {
					t.Error("nothing was admitted while etcd was down")
				}
			}},
		outageInMode("F1b_all_etcd_members_sigkill_10ttl_with_failsafe_reject", "reject", withFailsafe(t, links), outage),
		outageInMode("F1c_all_etcd_members_sigkill_10ttl_with_failsafe_redirect", "redirect", withFailsafe(t, links), outage),
		// After the outage a successor that cannot prove the old term over (no heartbeat
		// seen since) waits a ttl: the load goes on long enough to see the new term.
		{name: "F2_all_etcd_members_sigkill_10ttl_without_failsafe", load: outage + 10*time.Second, change: mustChange,
			fault: etcdOutage(outage), check: func(t *testing.T, s *scenarioRun, rep *safetyReport) {
				if admitted, _ := countOutage(s, rep); admitted != 0 {
					t.Errorf("%d requests were admitted while etcd was down, without failsafe", admitted)
				}
			}},
		{name: "F3_leader_cut_off_from_etcd_and_one_peer", load: 4*ttl + 6*time.Second, change: mustChange,
			config: withFailsafe(t, links),
			fault: func(s *scenarioRun) {
				peer := others(s.fleet, s.leader)[0]
				waitRoster(s)
				s.cut(s.leader)
				links[peer.ID].Blackhole()
				time.Sleep(4 * ttl)
				links[peer.ID].Heal()
				s.heal(s.leader)
				s.notes = append(s.notes, fmt.Sprintf("%s cut off from etcd and from %s's failsafe listener for %s", s.leader.ID, peer.ID, 4*ttl))
			}},
		{name: "F4_sigstop_leader_2ttl_during_failsafe", load: 6*ttl + 6*time.Second, frozen: true, change: mayChange, renews: true,
			config: withFailsafe(t, links),
			check: func(t *testing.T, s *scenarioRun, rep *safetyReport) {
				ridesOut(t, s, "sigstop")
			},
			fault: func(s *scenarioRun) {
				killEtcd(s)
				time.Sleep(2 * ttl)
				s.mark("sigstop")
				sigstopFault(s)
				time.Sleep(2 * ttl)
				restartEtcd(s)
			}},
		{name: "F5_peer_sigkill_during_failsafe", load: 6*ttl + 6*time.Second, change: mayChange, renews: true,
			config: withFailsafe(t, links),
			fault: func(s *scenarioRun) {
				killEtcd(s)
				time.Sleep(2 * ttl)
				peer := others(s.fleet, s.leader)[0]
				s.survivors = others(s.fleet, peer)
				s.load.markDown(peer)
				peer.Kill()
				s.mark("peer killed")
				time.Sleep(2 * ttl)
				restartEtcd(s)
			}, check: func(t *testing.T, s *scenarioRun, rep *safetyReport) {
				// One peer gone: the leader stops within a round and the window.
				ridesOut(t, s, "peer killed")
				late := admittedBetween(s, s.marks["peer killed"].Add(ttl), s.marks["restart"])
				if late > 0 {
					t.Errorf("%d requests admitted more than a ttl after a peer died, before etcd was back", late)
				}
				rep.Notes = fmt.Sprintf("%d admitted from a ttl after the peer died until etcd was back", late)
			}},
		{name: "F7_new_instance_started_during_failsafe", load: 6*ttl + 6*time.Second, change: mayChange, renews: true,
			config: withFailsafe(t, links),
			fault: func(s *scenarioRun) {
				killEtcd(s)
				time.Sleep(ttl)
				cfg := s.cfg
				cfg.InstanceEndpoints = map[string][]string{"c7": {s.etcd.Addr(0), s.etcd.Addr(1), s.etcd.Addr(2)}}
				newcomer := StartInstance(s.t, "c7", cfg)
				s.load.add(newcomer)
				s.survivors = append(append([]*Instance{}, s.fleet...), newcomer)
				s.mark("newcomer")
				time.Sleep(2 * ttl)
				restartEtcd(s)
				s.notes = append(s.notes, "c7, without failsafe, started 1 ttl into the outage")
			}, check: func(t *testing.T, s *scenarioRun, rep *safetyReport) {
				ridesOut(t, s, "restart")
			}},
		{name: "F6_etcd_back_for_the_followers_only", load: 8*ttl + 6*time.Second, change: mustChange, renews: true,
			config: withFailsafe(t, links),
			fault: func(s *scenarioRun) {
				killEtcd(s)
				time.Sleep(2 * ttl)
				s.cut(s.leader)
				restartEtcd(s)
				time.Sleep(4 * ttl) // the leader's lease runs out in etcd; its peers keep it alive
				s.mark("heal")
				s.heal(s.leader)
			}, check: func(t *testing.T, s *scenarioRun, rep *safetyReport) {
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
	for _, o := range s.load.results {
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
	return safetyScenario{name: name, load: outage + 6*time.Second, change: mayChange, renews: true,
		config: both(failsafe, func(c *Config) { c.Follower = mode }),
		fault:  etcdOutage(outage),
		check: func(t *testing.T, s *scenarioRun, rep *safetyReport) {
			outageServedByLeader(t, s, rep)
		}}
}
