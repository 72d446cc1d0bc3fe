//go:build unix

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/fleet"
	"github.com/caddyleader/caddy-leader/internal/pgtest"
)

// TestSafetyUnprovenSuccessor: the leader P is cut off from the store, so it admits until
// its own deadline, and an operator deletes the election key (etcd) or row (PostgreSQL). A
// follower wins at once and must wait for P. Then what comes next must not let anyone
// admit before P has stopped, in every follower mode, on etcd and on PostgreSQL (with
// LISTEN and polling):
//
//	go test -count=1 -v -run TestSafetyUnprovenSuccessor ./e2e/
//
// Each store and mode runs one fleet of four through the sequences in turn, each striking
// the leader of the moment: the waiting winner is asked to transfer, to resign, is
// deleted again, is sent SIGTERM; last, every instance but P is killed and a new one,
// which never saw P's term, is started as the only live candidate.
func TestSafetyUnprovenSuccessor(t *testing.T) {
	needCaddy(t)
	started := time.Now()
	var reports []safetyReport
	defer func() {
		t.Logf("RESULTS (ttl %v, %d instances; %v in all):%s", ttl, pgSafetyInstances, time.Since(started).Round(time.Second), safetyTable(reports))
	}()
	var server *pgtest.Server
	stores := []struct {
		name  string
		start func(t *testing.T, mode string) (*safetyEnv, unprovenStore)
	}{
		{"etcd", func(t *testing.T, mode string) (*safetyEnv, unprovenStore) {
			env := startSafetyEnvN(t, pgSafetyInstances, func(c *Config) { c.Follower = mode })
			return env, etcdUnproven(env)
		}},
		{"postgres", func(t *testing.T, mode string) (*safetyEnv, unprovenStore) {
			return pgUnproven(t, server, "unproven_"+mode, mode, nil)
		}},
		{"postgres_polling", func(t *testing.T, mode string) (*safetyEnv, unprovenStore) {
			return pgUnproven(t, server, "unproven_poll_"+mode, mode, map[string]any{"disable_listen": true})
		}},
	}
	for _, st := range stores {
		if server == nil && st.name != "etcd" {
			server = pgtest.Start(t) // one server for both PostgreSQL runs
		}
		t.Run(st.name, func(t *testing.T) {
			for _, mode := range []string{"reject", "redirect", "forward"} {
				t.Run(mode, func(t *testing.T) {
					env, store := st.start(t, mode)
					for _, sc := range unprovenScenarios(store) {
						sc.name = st.name + "_" + mode + "_" + sc.name
						sc.warmup, sc.rate = pgSafetyWarmup, pgSafetyRate
						if !t.Run(sc.name, func(t *testing.T) {
							env.t = t
							reports = append(reports, runScenarioOn(t, env, sc))
						}) {
							return // the fleet's state is unknown: the next sequences would tell nothing
						}
					}
				})
			}
		})
	}
}

// unprovenStore is what the sequences need of the store under test.
type unprovenStore struct {
	// deleteKey is the operator's delete of the election key (or row).
	deleteKey func(s *scenarioRun)
	// join returns the config under which an instance with a new id reaches the store.
	join func(id string) Config
}

func etcdUnproven(env *safetyEnv) unprovenStore {
	return unprovenStore{
		deleteKey: func(s *scenarioRun) {
			if err := deleteElectionKey(s, s.etcd.Client()); err != nil {
				s.t.Fatal(err)
			}
		},
		join: func(id string) Config {
			cfg := env.cfg
			cfg.InstanceEndpoints = map[string][]string{id: {env.etcd.Addr(0), env.etcd.Addr(1), env.etcd.Addr(2)}}
			return cfg
		},
	}
}

func pgUnproven(t *testing.T, server *pgtest.Server, name, mode string, extra map[string]any) (*safetyEnv, unprovenStore) {
	env := startPGEnv(t, server, name, mode, extra)
	return env, unprovenStore{
		deleteKey: func(s *scenarioRun) {
			n := server.QueryInt(s.t, fmt.Sprintf(`WITH d AS (DELETE FROM %selections WHERE name = 'default' RETURNING 1)
				SELECT count(*) FROM d`, pgTablePrefix(name)))
			if n != 1 {
				s.t.Fatalf("delete the election row: %d rows deleted, want 1", n)
			}
		},
		join: func(id string) Config {
			cfg := env.cfg
			cfg.InstanceStore = map[string]map[string]any{id: pgStoreConfig(server, server.Addr(), name, id, extra)}
			return cfg
		},
	}
}

// unprovenLoad is how long the clients send in each sequence: the warmup, the cut-off
// leader's deadline, two ttls of waiting, and the recovery.
const unprovenLoad = pgSafetyWarmup + 3*ttl + time.Second

func unprovenScenarios(store unprovenStore) []safetyScenario {
	// cutAndDelete cuts the leader off, deletes its key at once, and returns the
	// follower that won it and now waits for the cut-off leader.
	cutAndDelete := func(s *scenarioRun) *Instance {
		s.cut(s.leader)
		s.t.Cleanup(func() { s.heal(s.leader) })
		store.deleteKey(s)
		return waitingWinner(s)
	}
	// settleAndHeal lets two ttls pass, heals the old leader's links and notes who leads.
	settleAndHeal := func(s *scenarioRun) {
		time.Sleep(2 * ttl)
		s.heal(s.leader)
	}
	// handOver asks the waiting winner, through its admin API, at the path that path
	// makes of the id of another follower.
	handOver := func(path func(to string) string) func(s *scenarioRun) {
		return func(s *scenarioRun) {
			w := cutAndDelete(s)
			to := ""
			for _, in := range s.fleet {
				if in != w && in != s.leader {
					to = in.ID
				}
			}
			// The answer comes once the handover is done, which waits for the cut-off
			// leader's deadline.
			resp, err := fleet.Send(context.Background(), fleet.Client, http.MethodPost,
				fmt.Sprintf("http://127.0.0.1:%d%s", w.AdminPort, path(to)), nil, 3*ttl)
			if err != nil || resp.Status != http.StatusOK {
				s.t.Errorf("POST %s to the waiting winner %s: %v %d %s", path(to), w, err, resp.Status, resp.Body)
			}
			s.notes = append(s.notes, fmt.Sprintf("%s waited, then handed over", w))
			settleAndHeal(s)
		}
	}
	return []safetyScenario{
		{name: "waiting_winner_transfers", load: unprovenLoad, change: mustChange,
			fault: handOver(func(to string) string { return "/leader/default/transfer?timeout=10s&to=" + to })},
		{name: "waiting_winner_resigns", load: unprovenLoad, change: mustChange,
			fault: handOver(func(string) string { return "/leader/default/resign?hold_off=1s" })},
		{name: "key_deleted_again", load: unprovenLoad, change: mustChange, fault: func(s *scenarioRun) {
			w := cutAndDelete(s)
			store.deleteKey(s)
			s.notes = append(s.notes, fmt.Sprintf("%s's key deleted too", w))
			settleAndHeal(s)
		}},
		{name: "waiting_winner_sigterm", load: unprovenLoad, change: mustChange, fault: func(s *scenarioRun) {
			w := cutAndDelete(s)
			s.survivors = others(s.fleet, w)
			s.load.markDown(w)
			w.Term()
			s.notes = append(s.notes, fmt.Sprintf("%s sent SIGTERM while waiting", w))
			settleAndHeal(s)
		}},
		{name: "fresh_candidate_alone", load: unprovenLoad, change: mustChange, fault: func(s *scenarioRun) {
			p := s.leader
			s.cut(p)
			s.t.Cleanup(func() { s.heal(p) })
			for _, in := range others(s.fleet, p) {
				s.load.markDown(in)
				in.Kill()
			}
			store.deleteKey(s)
			fresh := StartInstance(s.t, "c9", store.join("c9"))
			s.load.add(fresh)
			s.survivors = []*Instance{p, fresh}
			s.notes = append(s.notes, fmt.Sprintf("%s started as the only live candidate", fresh))
			settleAndHeal(s)
		}},
	}
}

// waitingWinner waits for the followers of the cut-off leader to name a new leader, and
// returns it.
func waitingWinner(s *scenarioRun) *Instance {
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		for _, in := range others(s.fleet, s.leader) {
			w, err := in.Whoami()
			if err != nil || w.Leader == "" || w.Leader == s.leader.ID {
				continue
			}
			for _, c := range s.fleet {
				if c.ID == w.Leader {
					return c
				}
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	s.t.Fatalf("no follower of the cut-off leader %s won the deleted key", s.leader)
	return nil
}
