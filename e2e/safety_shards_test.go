//go:build unix

package e2e

// TestSafetyShards is the safety checker applied to every shard of a shard set, on etcd
// and on PostgreSQL:
//
//	go test -count=1 -v -run TestSafetyShards ./e2e/
//
// Each store runs one fleet of three instances with a set of safetyShards shards, follower
// forward, the backend recording each request's shard, owner and token; the clients cycle
// through one key per shard, so every shard gets its share of the load. The fleet goes
// through the faults in turn, each striking the instance that leads the default election at
// that moment (it owns about a third of the shards): those that leave it running first,
// SIGKILL last. safety.CheckShards applies the rule to each shard's own terms; 0 double
// admissions in every shard is the assertion, and after each fault every shard must be back
// at its preferred owner, agreed on by the whole fleet.

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/fleet"
	"github.com/caddyleader/caddy-leader/internal/testkit/pgtest"
	"github.com/caddyleader/caddy-leader/internal/testkit/safety"
)

const (
	// safetyShards is the shard set's size: enough for every instance to own several.
	safetyShards = 32
	// shardSafetyRate is the clients' requests per second: 3 a second to each shard.
	shardSafetyRate = 96
	// shardSafetyWarmup lets every shard see requests of its term before each fault.
	shardSafetyWarmup = time.Second
	// operatorDeletes is how many of the victim's shard keys the operator deletes.
	operatorDeletes = 3
)

func TestSafetyShards(t *testing.T) {
	needCaddy(t)
	started := time.Now()
	var reports []safetyReport
	defer func() {
		t.Logf("RESULTS (ttl %v, %d instances, %d shards, forward, %d req/s; %v in all):%s", ttl, safetyInstances, safetyShards, shardSafetyRate, time.Since(started).Round(time.Second), safety.Table(reports))
	}()
	withShards := func(c *Config) { c.Shards = safetyShards }
	run := func(t *testing.T, env *safetyEnv, scenarios []safetyScenario) {
		for _, sc := range scenarios {
			sc.Warmup, sc.Rate = shardSafetyWarmup, shardSafetyRate
			if !t.Run(sc.Name, func(t *testing.T) {
				env.T = t
				reports = append(reports, safety.RunOn(t, env, sc))
			}) {
				return // the fleet's state is unknown: the next faults would tell nothing
			}
		}
	}

	t.Run("etcd", func(t *testing.T) {
		env := startSafetyEnvN(t, safetyInstances, withShards)
		run(t, env, shardScenarios("etcd",
			func(s *scenarioRun, election string) error {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				resp, err := s.Store.Client().Delete(ctx, "/caddy-leader/"+election)
				if err == nil && resp.Deleted != 1 {
					err = fmt.Errorf("%d keys deleted, want 1", resp.Deleted)
				}
				return err
			},
			func(s *scenarioRun) {
				for i := range s.Store.members {
					s.Store.kill(i)
				}
				time.Sleep(2 * ttl)
				s.Mark("restart")
				s.Store.Restart(s.Store.indexes()...)
			}))
	})

	t.Run("postgres", func(t *testing.T) {
		server := pgtest.Start(t)
		const name = "shards"
		env := startPGEnvN(t, server, safetyInstances, name, "forward", nil, withShards)
		run(t, env, shardScenarios("postgres",
			func(s *scenarioRun, election string) error {
				n := server.QueryInt(s.T, fmt.Sprintf(`WITH d AS (DELETE FROM %selections WHERE name = '%s' RETURNING 1)
					SELECT count(*) FROM d`, pgTablePrefix(name), election))
				if n != 1 {
					return fmt.Errorf("%d rows deleted, want 1", n)
				}
				return nil
			},
			func(s *scenarioRun) {
				server.Stop(s.T)
				time.Sleep(2 * ttl)
				s.Mark("restart")
				server.Start(s.T)
			}))
	})
}

// shardScenarios are the faults a fleet with a shard set goes through, in order, on a
// store that deleteKey deletes a shard's election key (or row) from as an operator would,
// and that storeLoss takes away for 2 ttl (marking "restart" when it brings it back).
func shardScenarios(store string, deleteKey func(s *scenarioRun, election string) error, storeLoss func(s *scenarioRun)) []safetyScenario {
	return []safetyScenario{
		{Name: store + "_shards_steady_state", Load: 3 * time.Second, Change: safety.NoChange, NoErrors: true},
		{Name: store + "_shards_transfer_storm", Load: 6 * time.Second, Change: safety.MustChange, NoErrors: true, Fault: safety.TransferStorm[*etcdProcs]},
		{Name: store + "_shard_keys_deleted_by_an_operator", Load: 6 * time.Second, Change: safety.MustChange, Fault: func(s *scenarioRun) {
			// The owner's links are slow, so that it hears late of the delete (issue 10's
			// set-up), as in safety.OperatorFault.
			victim := s.Leader
			var deleted []fleet.ShardView
			for _, sh := range s.Shards {
				if sh.Owner == victim.ID && len(deleted) < operatorDeletes {
					deleted = append(deleted, sh)
				}
			}
			if len(deleted) == 0 {
				s.T.Fatalf("%s owns no shard", victim)
			}
			s.Delay(victim, safety.OperatorLinkDelay)
			for _, sh := range deleted {
				s.Struck = append(s.Struck, sh.Shard)
			}
			for _, sh := range deleted {
				if err := deleteKey(s, fleet.ShardElection(sh.Shard)); err != nil {
					s.T.Fatalf("delete the key of shard %d: %v", sh.Shard, err)
				}
			}
			time.Sleep(2 * ttl)
			s.Heal(victim)
			after := fleet.WaitShardsPlaced(s.T, s.Fleet, safety.RecoverTimeout)
			for _, sh := range deleted {
				if now := after[sh.Shard]; now.Token <= sh.Token {
					s.T.Errorf("shard %d: after its key was deleted, %s owns it with token %d, not newer than %d", sh.Shard, now.Owner, now.Token, sh.Token)
				}
			}
			s.Notes = append(s.Notes, fmt.Sprintf("%d keys of %s's shards deleted", len(deleted), victim))
		}},
		{Name: store + "_shard_owner_cut_off_from_the_store_2ttl", Load: 7 * time.Second, Change: safety.MustChange, Fault: func(s *scenarioRun) {
			s.Cut(s.Leader)
			time.Sleep(2 * ttl)
			s.Heal(s.Leader)
		}},
		{Name: store + "_sigstop_shard_owner_2ttl_then_sigcont", Load: 8 * time.Second, Frozen: true, Change: safety.MustChange, Fault: safety.SigstopFault[*etcdProcs]},
		{Name: store + "_store_lost_2ttl", Load: 14 * time.Second, Change: safety.MustChange, Fault: storeLoss, Check: func(t *testing.T, s *scenarioRun, rep *safetyReport) {
			// Fail closed: no shard admits from one lease deadline after the outage began
			// until the store is back.
			n := admittedBetween(s, s.FaultAt.Add(ttl), s.Marks["restart"])
			if n > 0 {
				t.Errorf("%d requests were admitted while the store was down (from %v after the fault until the restart)", n, ttl)
			}
			rep.Notes = fmt.Sprintf("%d admitted while it was down", n)
		}},
		{Name: store + "_sigkill_shard_owner", Load: 6 * time.Second, Change: safety.MustChange, Fault: func(s *scenarioRun) {
			s.Survivors = others(s.Fleet, s.Leader)
			s.Leader.Kill()
		}},
	}
}
