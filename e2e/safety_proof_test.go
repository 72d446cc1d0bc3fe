//go:build unix

package e2e

// TestSafetyOneProof walks the sequences of issue 25 in which a term began admitting
// without proof that every older term had stopped, with real Caddy processes riding a
// failsafe on a 3-member etcd cluster of real processes (each failsafe listener behind a
// fault proxy, as in TestSafetyFailsafe):
//
//	go test -count=1 -v -run TestSafetyOneProof ./e2e/
//
// In every sequence the leader L is cut off from etcd and rides its failsafe while its
// peers confirm it (in 1 and 2 the peers are cut off with it, on L's side of a partition);
// a term won on the store's side meanwhile must not admit while L does:
//
//  1. a process started again under L's instance_id (a new VM with the old hostname);
//  2. a newcomer W without failsafe that cannot reach the roster's members, whose term
//     then ends by an operator's delete, a resign or a restart: what follows inherits
//     what W's term still owed;
//  3. an `end` of L's previous failsafe, captured on the link and replayed to a peer while
//     L rides again, must not cancel its live confirmation: a newcomer's fence still waits.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/caddyleader/caddy-leader/internal/testkit/fleet"
	"github.com/caddyleader/caddy-leader/internal/testkit/freeport"
	"github.com/caddyleader/caddy-leader/internal/testkit/safety"
)

// The sequences run one at a time: their leaders ride the failsafe (see TestSafetyFailsafe).
func TestSafetyOneProof(t *testing.T) {
	needCaddy(t)
	results := startResults(t, fmt.Sprintf("ttl %v, %d instances with failsafe, 3 etcd member processes, %d req/s", ttl, safetyInstances, safety.DefaultRate))
	for _, sc := range oneProofScenarios(t) {
		report := results.row()
		t.Run(sc.Name, func(t *testing.T) {
			report(runScenario(t, sc))
		})
	}
}

// stopGrace is how long a restart waits for SIGTERM to end a process before SIGKILL.
const stopGrace = 3 * ttl

// proofWindow is how long a sequence lets the old leader ride after the new term could
// have begun: long enough for a term that skips the proof to admit beside it.
const proofWindow = 3 * ttl

func oneProofScenarios(t *testing.T) []safetyScenario {
	links := failsafeLinks{}
	const load = 8*ttl + 6*time.Second
	// The old leader rides past its lease deadline on purpose: Renews, and the checks
	// below say it did ride.
	riding := func(name string, fault func(s *scenarioRun)) safetyScenario {
		return safetyScenario{Name: name, Load: load, Change: safety.MustChange, Renews: true,
			Config: withFailsafe(t, links), Fault: func(s *scenarioRun) {
				sequenceFleets.Store(s, s.Fleet)
				done := false
				defer func() {
					if !done { // a fatal error in the sequence: Check will not run
						logElection(s)
					}
				}()
				fault(s)
				done = true
			},
			Check: func(t *testing.T, s *scenarioRun, rep *safetyReport) {
				ridesOut(t, s, "new term")
				logElection(s)
				safety.NoteDouble(rep)
			}}
	}
	// A ttl of 3s leaves room for slowed renewals in case 3 (see replayedEndFault).
	replayed := riding("3_replayed_failsafe_end", replayedEndFault(links))
	replayed.Config = both(replayed.Config, func(c *Config) { c.TTL = "3s" })
	return []safetyScenario{
		riding("1_reused_instance_id_started_on_the_store_side", func(s *scenarioRun) {
			old := cutOffRiding(s)
			twin := startOnStoreSide(s, old.ID, true)
			s.Load.Add(twin)
			waitHolder(s, twin)
			s.Mark("new term")
			s.Notes = append(s.Notes, fmt.Sprintf("a second %s started on etcd's side while %s rode", twin, old))
			time.Sleep(proofWindow)
			// The old VM is gone for good; the peers' last confirmations run out.
			s.Load.MarkDown(old)
			old.Kill()
			healFleet(s)
			s.Survivors = append(others(s.Fleet, old), twin)
		}),
		riding("2a_unproven_winner_key_deleted", inheritedFault(links, func(s *scenarioRun, w *Instance) *Instance {
			if err := deleteElectionKey(s, s.Store.Client()); err != nil {
				s.T.Fatal(err)
			}
			return w
		})),
		riding("2b_unproven_winner_resigns", inheritedFault(links, func(s *scenarioRun, w *Instance) *Instance {
			// A term that owes its proof cannot vouch for its end: the resign must not
			// come back as a release.
			resp, err := fleet.Send(context.Background(), fleet.Client, http.MethodPost,
				fmt.Sprintf("http://127.0.0.1:%d/leader/default/resign?hold_off=1s", w.AdminPort), nil, 2*ttl)
			if err == nil && resp.Status == http.StatusOK {
				s.T.Errorf("%s, whose term cannot prove that the riding leader stopped, resigned: %s", w, resp.Body)
				s.Notes = append(s.Notes, fmt.Sprintf("%s's resign answered 200", w))
			} else {
				s.Notes = append(s.Notes, fmt.Sprintf("%s's resign: %v %d", w, err, resp.Status))
			}
			return w
		})),
		riding("2c_unproven_winner_restarted", inheritedFault(links, func(s *scenarioRun, w *Instance) *Instance {
			// SIGTERM, and SIGKILL after a grace period, as an orchestrator restarts.
			s.Load.MarkDown(w)
			sent := time.Now()
			w.Process().Stop(stopGrace)
			s.Notes = append(s.Notes, fmt.Sprintf("%s exited %s after SIGTERM (%v)", w, safety.FmtDur(time.Since(sent)), w.Process().ExitErr()))
			again := startOnStoreSide(s, w.ID, false)
			s.Load.Add(again)
			return again
		})),
		replayed,
	}
}

// cutOffRiding cuts the whole fleet off from etcd once the leader's roster is confirmed,
// the instances still reaching each other, and returns the leader once it leads through a
// failsafe round its peers confirmed. healFleet undoes it.
func cutOffRiding(s *scenarioRun) *Instance {
	old := s.Leader
	waitRoster(s)
	fleet := s.Fleet
	for _, in := range fleet {
		s.Cut(in)
	}
	s.T.Cleanup(func() {
		for _, in := range fleet {
			s.Heal(in)
		}
	})
	waitRiding(s, old, 0)
	return old
}

// healFleet gives every instance of the fleet its links to etcd back.
func healFleet(s *scenarioRun) {
	for _, in := range s.Fleet {
		s.Heal(in)
	}
}

// failsafeStatus is the part of an instance's failsafe state the sequences look at.
type failsafeStatus struct {
	Active     bool  `json:"active"`
	Rounds     int64 `json:"rounds"`
	Refused    int64 `json:"refused"`
	Confirming int64 `json:"confirming"` // the term this instance keeps alive as a peer
}

// failsafeStatusOf reads in's failsafe state from its admin API.
func failsafeStatusOf(in *Instance) (failsafeStatus, error) {
	var status struct {
		Elections []struct {
			Failsafe failsafeStatus `json:"failsafe"`
		} `json:"elections"`
	}
	resp, err := in.Admin(http.MethodGet, "/leader/", nil)
	if err != nil {
		return failsafeStatus{}, err
	}
	if err := json.Unmarshal([]byte(resp.Body), &status); err != nil || len(status.Elections) != 1 {
		return failsafeStatus{}, fmt.Errorf("GET /leader/: %v %s", err, resp.Body)
	}
	return status.Elections[0].Failsafe, nil
}

// failsafeOf reads whether in leads through a failsafe, and how many of its rounds were
// confirmed.
func failsafeOf(in *Instance) (active bool, confirmed int64, err error) {
	f, err := failsafeStatusOf(in)
	return f.Active, f.Rounds - f.Refused, err
}

// waitRiding waits until in leads through a failsafe with more than after rounds
// confirmed, and returns how many are.
func waitRiding(s *scenarioRun, in *Instance, after int64) int64 {
	s.T.Helper()
	deadline := time.Now().Add(5 * ttl)
	for {
		active, confirmed, err := failsafeOf(in)
		if err == nil && active && confirmed > after {
			return confirmed
		}
		if time.Now().After(deadline) {
			s.T.Fatalf("%s does not ride a failsafe (active %v, %d rounds confirmed, %v)", in, active, confirmed, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startOnStoreSide starts instance id reaching every etcd member directly, with a failsafe
// listener of its own (on a port of its own, not behind a proxy) if failsafe is set, and
// the fleet's config changed by change.
func startOnStoreSide(s *scenarioRun, id string, failsafe bool, change ...func(*Config)) *Instance {
	cfg := s.Cfg
	cfg.InstanceEndpoints = map[string][]string{id: {s.Store.Addr(0), s.Store.Addr(1), s.Store.Addr(2)}}
	cfg.FailsafePorts, cfg.FailsafeURLs = maps.Clone(cfg.FailsafePorts), maps.Clone(cfg.FailsafeURLs)
	delete(cfg.FailsafePorts, id)
	delete(cfg.FailsafeURLs, id)
	if failsafe {
		port := freeport.MustPick(s.T, 1)[0]
		cfg.FailsafePorts[id], cfg.FailsafeURLs[id] = port, fmt.Sprintf("http://127.0.0.1:%d", port)
	}
	for _, c := range change {
		c(&cfg)
	}
	in := StartInstance(s.T, id, cfg)
	fl, _ := sequenceFleets.Load(s)
	sequenceFleets.Store(s, append(fl.([]*Instance), in))
	return in
}

// sequenceFleets holds, by run, every instance a sequence ran: its fleet and the instances
// it started, whose logs logElection reads.
var sequenceFleets sync.Map // *scenarioRun -> []*Instance

// waitHolder waits until in names itself the leader: it holds the key, whether or not
// it admits yet.
func waitHolder(s *scenarioRun, in *Instance) {
	s.T.Helper()
	deadline := time.Now().Add(5 * ttl)
	for {
		if w, err := in.Whoami(); err == nil && w.Leader == in.ID && w.Token > s.Token {
			return
		}
		if time.Now().After(deadline) {
			s.T.Fatalf("%s did not win the election while the old leader rode its failsafe", in)
		}
		time.Sleep(pollInterval)
	}
}

// inheritedFault is case 2: while the fleet is cut off from etcd and the leader rides, a
// newcomer W without failsafe wins on etcd's side, but every new connection to the roster members' failsafe listeners is
// dropped (the leader's own, open ones flow), so W cannot fence them and must not admit.
// Then end ends W's term and returns the instance W is now; what follows must still wait
// for the ride to end.
func inheritedFault(links failsafeLinks, end func(s *scenarioRun, w *Instance) *Instance) func(s *scenarioRun) {
	return func(s *scenarioRun) {
		old, roster := cutOffRiding(s), s.Fleet
		for _, in := range roster { // the leader's own listener answers a fence too
			links[in.ID].BlackholeNew()
		}
		heal := func() {
			for _, in := range roster {
				links[in.ID].Heal()
			}
		}
		s.T.Cleanup(heal)
		w := startOnStoreSide(s, "c7", false)
		s.Load.Add(w)
		waitHolder(s, w)
		time.Sleep(2 * ttl) // W's wait for the leader's heartbeat deadline is over: only the ride is left
		w = end(s, w)
		s.Mark("new term")
		time.Sleep(proofWindow)
		heal()
		healFleet(s)
		s.Survivors = append(append([]*Instance{}, s.Fleet...), w)
		s.Notes = append(s.Notes, fmt.Sprintf("%s, without failsafe, won and could not reach %s's roster", w, old))
	}
}

// replayedEndFault is case 3. The leader's links to etcd are slowed, so that each renewal
// comes back late enough for the leader to start a failsafe before it and end it after:
// the `end` it then sends a peer is captured on the peer's link, and the leader is cut off
// at that moment. A newcomer W without failsafe starts then (too late for the leader's
// roster), with a higher priority than the peers. Once the leader rides again, the captured
// end is replayed to that peer (until shortly before its clock would refuse it as too
// old) while an operator deletes the election key: W wins and fences the roster, and must
// wait for the confirmations the peer gave after the end.
func replayedEndFault(links failsafeLinks) func(s *scenarioRun) {
	return func(s *scenarioRun) {
		old := s.Leader
		peer := others(s.Fleet, old)[0]
		port := s.Cfg.FailsafePorts[peer.ID]
		ttl := s.TTL()
		waitRoster(s)
		var (
			mu       sync.Mutex
			end      []byte
			cutAgain = make(chan time.Time, 1)
		)
		links[peer.ID].Tap(func(b []byte) {
			i := bytes.Index(b, []byte(`{"kind":"end"`))
			mu.Lock()
			defer mu.Unlock()
			if i < 0 || end != nil {
				return
			}
			s.Cut(old)
			cutAgain <- time.Now()
			end = append([]byte(nil), b[i:]...)
		})
		s.T.Cleanup(func() { links[peer.ID].Tap(nil) })
		s.T.Cleanup(func() { s.Heal(old) })
		s.Delay(old, ttl*2/15) // a renewal's answer comes ttl*4/15 after it was sent
		var capturedAt time.Time
		select {
		case capturedAt = <-cutAgain:
		case <-time.After(10 * ttl):
			s.T.Fatalf("%s, its links to etcd slowed, sent %s no failsafe end", old, peer)
		}
		newcomer := make(chan *Instance, 1)
		go func() {
			newcomer <- startOnStoreSide(s, "c7", false, func(c *Config) {
				c.Priority = map[string]int{"c7": 2} // the peers, zeroed or not, yield to it
			})
		}()
		time.Sleep(100 * time.Millisecond) // the genuine end reaches the peer first
		mu.Lock()
		replay := end
		mu.Unlock()

		// Replay the captured end every 10ms until shortly before the peer would refuse it
		// as too old. Once a round of the leader's new failsafe reaches the peer, the peer
		// keeps its term alive (its status says so before each replay), and no replay may
		// change that; the operator deletes the key then, once W follows the leader.
		var w *Instance
		deleteAt := capturedAt.Add(ttl * 6 / 10)
		stopAt := capturedAt.Add(ttl * 19 / 20)
		reconfirmed, deleted, accepted, cancelled := false, false, 0, 0
		confirming := func() bool {
			f, err := failsafeStatusOf(peer)
			return err == nil && f.Confirming == s.Token
		}
		for time.Now().Before(stopAt) {
			if !deleted && confirming() {
				reconfirmed = true
			}
			resp, err := fleet.Send(context.Background(), fleet.Client, http.MethodPost,
				fmt.Sprintf("http://127.0.0.1:%d/", port), replay, ttl/4)
			if err == nil && strings.Contains(resp.Body, `"accepted":true`) {
				accepted++
			}
			if reconfirmed && !deleted && !confirming() {
				cancelled++
			}
			if w == nil {
				select {
				case w = <-newcomer:
					s.Load.Add(w)
					s.Survivors = append(append([]*Instance{}, s.Fleet...), w)
				default:
				}
			}
			if !deleted && reconfirmed && w != nil && !time.Now().Before(deleteAt) {
				// The leader's lease may have run out already: then its key is gone, and
				// the key, if any, is a newer term's, which the operator leaves alone.
				deleteIfCreatedAt(s, s.Token)
				deleted = true
				s.Mark("new term")
			}
			time.Sleep(10 * time.Millisecond)
		}
		if !deleted {
			s.T.Fatalf("%s rode again too late, or %s started too late: the captured end was too old to replay", old, w)
		}
		if cancelled > 0 {
			s.T.Errorf("a replayed end cancelled %s's live confirmation of %s's ride %d times", peer, old, cancelled)
		}
		s.Notes = append(s.Notes, fmt.Sprintf("%s's end replayed to %s (accepted %d times, cancelling its confirmation %d times); key deleted %s after the capture",
			old, peer, accepted, cancelled, safety.FmtDur(s.Marks["new term"].Sub(capturedAt))))
		time.Sleep(proofWindow)
		s.Heal(old)
	}
}

// logElection logs, in time order, what every instance of the sequence (sequenceFleets)
// logged about the election from a second before the fault on (its leader and failsafe
// lines): who won which term, why it began admitting, which failsafe rounds were refused.
// A double admission is read from them.
func logElection(s *scenarioRun) {
	fl, _ := sequenceFleets.Load(s)
	ins, _ := fl.([]*Instance)
	from := s.FaultAt.Add(-time.Second)
	type line struct {
		at   time.Time
		text string
	}
	var lines []line
	for _, in := range ins {
		b, err := os.ReadFile(in.LogPath())
		if err != nil {
			continue
		}
		for _, raw := range bytes.Split(b, []byte("\n")) {
			var e struct {
				TS     float64 `json:"ts"`
				Logger string  `json:"logger"`
				Level  string  `json:"level"`
				Msg    string  `json:"msg"`
				Token  int64   `json:"token"`
				Reason string  `json:"reason"`
				Leader string  `json:"leader"`
			}
			if json.Unmarshal(raw, &e) != nil || !strings.HasPrefix(e.Logger, "leader") {
				continue
			}
			at := time.Unix(0, int64(e.TS*1e9))
			if at.Before(from) {
				continue
			}
			lines = append(lines, line{at, fmt.Sprintf("%s %s(%d) %s: %s; leader %s, token %d, %s",
				safety.FmtDur(at.Sub(s.FaultAt)), in.ID, in.Process().Pid(), e.Level, e.Msg, e.Leader, e.Token, e.Reason)})
		}
	}
	sort.SliceStable(lines, func(i, j int) bool { return lines[i].at.Before(lines[j].at) })
	for _, l := range lines {
		s.T.Log(l.text)
	}
}

// deleteIfCreatedAt deletes the election key, as an operator does, if it is still the key
// of term token (created at that revision); it does nothing otherwise.
func deleteIfCreatedAt(s *scenarioRun, token int64) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cli := s.Store.Client()
	_, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(electionKey), "=", token)).
		Then(clientv3.OpDelete(electionKey)).Commit()
	if err != nil {
		s.T.Fatalf("delete the election key: %v", err)
	}
}
