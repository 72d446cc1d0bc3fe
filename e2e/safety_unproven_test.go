//go:build unix

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/fleet"
	"github.com/caddyleader/caddy-leader/internal/testkit/pgtest"
	"github.com/caddyleader/caddy-leader/internal/testkit/safety"
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
	results := startResults(t, fmt.Sprintf("ttl %v, %d instances", ttl, pgSafetyInstances))
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
	// Every store and mode runs a fleet of its own (on etcd a cluster of its own too; the
	// PostgreSQL fleets share one server, which no sequence strikes, under names of their
	// own): they run side by side (see TestSafety), each through its sequences in turn.
	modes := []string{"reject", "redirect", "forward"}
	sequences := len(unprovenScenarios(unprovenStore{}))
	for _, st := range stores {
		if server == nil && st.name != "etcd" {
			server = pgtest.Start(t) // one server for both PostgreSQL runs
		}
		report := map[string][]func(safetyReport){}
		for _, mode := range modes {
			for range sequences {
				report[mode] = append(report[mode], results.row())
			}
		}
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			for _, mode := range modes {
				t.Run(mode, func(t *testing.T) {
					t.Parallel()
					env, store := st.start(t, mode)
					for i, sc := range unprovenScenarios(store) {
						sc.Name = st.name + "_" + mode + "_" + sc.Name
						sc.Warmup, sc.Rate = pgSafetyWarmup, pgSafetyRate
						if !t.Run(sc.Name, func(t *testing.T) {
							env.T = t
							report[mode][i](safety.RunOn(t, env, sc))
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
			if err := deleteElectionKey(s, s.Store.Client()); err != nil {
				s.T.Fatal(err)
			}
		},
		join: func(id string) Config {
			cfg := env.Cfg
			cfg.InstanceEndpoints = map[string][]string{id: {env.Store.Addr(0), env.Store.Addr(1), env.Store.Addr(2)}}
			return cfg
		},
	}
}

func pgUnproven(t *testing.T, server *pgtest.Server, name, mode string, extra map[string]any) (*safetyEnv, unprovenStore) {
	env := startPGEnv(t, server, name, mode, extra)
	return env, unprovenStore{
		deleteKey: func(s *scenarioRun) {
			n := server.QueryInt(s.T, fmt.Sprintf(`WITH d AS (DELETE FROM %selections WHERE name = 'default' RETURNING 1)
				SELECT count(*) FROM d`, pgTablePrefix(name)))
			if n != 1 {
				s.T.Fatalf("delete the election row: %d rows deleted, want 1", n)
			}
		},
		join: func(id string) Config {
			cfg := env.Cfg
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
		s.Cut(s.Leader)
		s.T.Cleanup(func() { s.Heal(s.Leader) })
		store.deleteKey(s)
		return waitingWinner(s)
	}
	// settleAndHeal lets two ttls pass, heals the old leader's links and notes who leads.
	settleAndHeal := func(s *scenarioRun) {
		time.Sleep(2 * ttl)
		s.Heal(s.Leader)
	}
	// handOver asks the waiting winner, through its admin API, at the path that path
	// makes of the id of another follower.
	handOver := func(path func(to string) string) func(s *scenarioRun) {
		return func(s *scenarioRun) {
			w := cutAndDelete(s)
			to := ""
			for _, in := range s.Fleet {
				if in != w && in != s.Leader {
					to = in.ID
				}
			}
			// The answer comes once the handover is done, which waits for the cut-off
			// leader's deadline.
			resp, err := fleet.Send(context.Background(), fleet.Client, http.MethodPost,
				fmt.Sprintf("http://127.0.0.1:%d%s", w.AdminPort, path(to)), nil, 3*ttl)
			if err != nil || resp.Status != http.StatusOK {
				s.T.Errorf("POST %s to the waiting winner %s: %v %d %s", path(to), w, err, resp.Status, resp.Body)
			}
			s.Notes = append(s.Notes, fmt.Sprintf("%s waited, then handed over", w))
			settleAndHeal(s)
		}
	}
	return []safetyScenario{
		{Name: "waiting_winner_transfers", Load: unprovenLoad, Change: safety.MustChange,
			Fault: handOver(func(to string) string { return "/leader/default/transfer?timeout=10s&to=" + to })},
		{Name: "waiting_winner_resigns", Load: unprovenLoad, Change: safety.MustChange,
			Fault: handOver(func(string) string { return "/leader/default/resign?hold_off=1s" })},
		{Name: "key_deleted_again", Load: unprovenLoad, Change: safety.MustChange, Fault: func(s *scenarioRun) {
			w := cutAndDelete(s)
			store.deleteKey(s)
			s.Notes = append(s.Notes, fmt.Sprintf("%s's key deleted too", w))
			settleAndHeal(s)
		}},
		{Name: "waiting_winner_sigterm", Load: unprovenLoad, Change: safety.MustChange, Fault: func(s *scenarioRun) {
			w := cutAndDelete(s)
			s.Survivors = others(s.Fleet, w)
			s.Load.MarkDown(w)
			w.Term()
			s.Notes = append(s.Notes, fmt.Sprintf("%s sent SIGTERM while waiting", w))
			settleAndHeal(s)
		}},
		{Name: "fresh_candidate_alone", Load: unprovenLoad, Change: safety.MustChange, Fault: func(s *scenarioRun) {
			p := s.Leader
			s.Cut(p)
			s.T.Cleanup(func() { s.Heal(p) })
			for _, in := range others(s.Fleet, p) {
				s.Load.MarkDown(in)
				in.Kill()
			}
			store.deleteKey(s)
			fresh := StartInstance(s.T, "c9", store.join("c9"))
			s.Load.Add(fresh)
			s.Survivors = []*Instance{p, fresh}
			s.Notes = append(s.Notes, fmt.Sprintf("%s started as the only live candidate", fresh))
			settleAndHeal(s)
		}},
	}
}

// waitingWinner waits for the followers of the cut-off leader to name a new leader, and
// returns it.
func waitingWinner(s *scenarioRun) *Instance {
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		for _, in := range others(s.Fleet, s.Leader) {
			w, err := in.Whoami()
			if err != nil || w.Leader == "" || w.Leader == s.Leader.ID {
				continue
			}
			// The winner's own campaign answer can come after a peer saw its key: it is
			// the waiting winner once it names itself too.
			for _, c := range s.Fleet {
				if own, err := c.Whoami(); c.ID == w.Leader && err == nil && own.Leader == c.ID {
					return c
				}
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	s.T.Fatalf("no follower of the cut-off leader %s won the deleted key", s.Leader)
	return nil
}
