//go:build unix

package e2e

// TestSafetyPostgres is TestSafety's checker on the PostgreSQL store, in every follower
// mode:
//
//	go test -count=1 -v -run TestSafetyPostgres ./e2e/
//
// To keep it short, one PostgreSQL server serves all three modes (a table prefix each),
// and each mode runs one fleet of four Caddy processes through the faults in turn, each
// striking the leader of the moment: the faults that leave the victim running come first,
// SIGTERM and SIGKILL last. Each instance reaches the database through a fault proxy of its
// own, under an application_name of its own. Only each fault's own arrivals are checked.

import (
	"context"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/caddyleader/caddy-leader/internal/testkit/pgtest"
	"github.com/caddyleader/caddy-leader/internal/testkit/safety"
)

const (
	// pgSafetyInstances is each mode's fleet: four, so that two are left after SIGTERM
	// and SIGKILL have each taken one.
	pgSafetyInstances = 4
	// pgSafetyRate is the clients' requests per second: lower than TestSafety's, as
	// three modes run one after the other.
	pgSafetyRate = 60
	// pgSafetyWarmup is how long the clients send before each fault.
	pgSafetyWarmup = 700 * time.Millisecond
)

func TestSafetyPostgres(t *testing.T) {
	needCaddy(t)
	server := pgtest.Start(t)
	results := startResults(t, fmt.Sprintf("ttl %v, %d instances, PostgreSQL, %d req/s", ttl, pgSafetyInstances, pgSafetyRate))
	// The modes' fleets share nothing but the server, and no fault here strikes the
	// server: they run side by side (see TestSafety), each through its faults in turn.
	for _, mode := range []string{"reject", "redirect", "forward"} {
		scenarios := pgSafetyScenarios(server, mode)
		report := make([]func(safetyReport), len(scenarios))
		for i := range scenarios {
			report[i] = results.row()
		}
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			env := startPGSafetyEnv(t, server, mode)
			for i, sc := range scenarios {
				sc.Name = mode + "_" + sc.Name
				if !t.Run(sc.Name, func(t *testing.T) {
					env.T = t
					report[i](safety.RunOn(t, env, sc))
				}) {
					return // the fleet's state is unknown: the next faults would tell nothing
				}
			}
		})
	}
}

// startPGSafetyEnv starts mode's fleet on server, each instance through a fault proxy of
// its own, and waits for a leader.
func startPGSafetyEnv(t *testing.T, server *pgtest.Server, mode string) *safetyEnv {
	return startPGEnv(t, server, mode, mode, nil)
}

// startPGEnv starts a fleet of pgSafetyInstances in follower mode on server, its tables
// and application names told apart by name, with extra added to every instance's store
// config (disable_listen, say) and change applied to the fleet's config, and waits for a
// leader.
func startPGEnv(t *testing.T, server *pgtest.Server, name, mode string, extra map[string]any, change ...func(*Config)) *safetyEnv {
	t.Helper()
	return startPGEnvN(t, server, pgSafetyInstances, name, mode, extra, change...)
}

// startPGEnvN is startPGEnv with a fleet of n.
func startPGEnvN(t *testing.T, server *pgtest.Server, n int, name, mode string, extra map[string]any, change ...func(*Config)) *safetyEnv {
	t.Helper()
	env := safety.NewEnv[*etcdProcs](t, caddyBin, nil, Config{Follower: mode})
	for _, c := range change {
		c(&env.Cfg)
	}
	env.LinkEach(n, server.Addr(), func(id, addr string) map[string]any {
		return pgStoreConfig(server, addr, name, id, extra)
	})
	env.Launch(t, n)
	return env
}

// pgStoreConfig is instance id's store config in the fleet called name, reaching the
// server at addr.
func pgStoreConfig(server *pgtest.Server, addr, name, id string, extra map[string]any) map[string]any {
	c := map[string]any{
		"module":       "postgres",
		"dsn":          fmt.Sprintf("postgres://%s@%s/postgres?sslmode=disable&application_name=%s", pgtest.Superuser, addr, pgAppName(name, id)),
		"table_prefix": pgTablePrefix(name),
	}
	maps.Copy(c, extra)
	return c
}

// pgTablePrefix is the table prefix of the fleet called name.
func pgTablePrefix(name string) string { return "safety_" + name + "_" }

// pgAppName is instance id's application_name in the fleet called name.
func pgAppName(name, id string) string { return "safety-" + name + "-" + id }

// pgSafetyScenarios are the faults, in the order one fleet goes through them.
func pgSafetyScenarios(server *pgtest.Server, mode string) []safetyScenario {
	base := []safetyScenario{
		{Name: "pg_terminate_backend_of_the_leader", Load: 3 * time.Second, Change: safety.MayChange, Fault: func(s *scenarioRun) {
			n := server.QueryInt(s.T, fmt.Sprintf(`SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
				WHERE application_name = '%s'`, pgAppName(mode, s.Leader.ID)))
			if n == 0 {
				s.T.Fatalf("leader %s had no connection to terminate", s.Leader)
			}
			s.Notes = append(s.Notes, fmt.Sprintf("%d backends terminated", n))
		}},
		{Name: "election_row_deleted_by_hand", Load: 3 * time.Second, Change: safety.MustChange, Fault: func(s *scenarioRun) {
			n := server.QueryInt(s.T, fmt.Sprintf(`WITH d AS (DELETE FROM safety_%s_elections WHERE name = 'default' RETURNING 1)
				SELECT count(*) FROM d`, mode))
			if n != 1 {
				s.T.Fatalf("delete the election row: %d rows deleted, want 1", n)
			}
		}},
		{Name: "leader_cut_off_from_postgres_2ttl", Load: 6 * time.Second, Change: safety.MustChange, Fault: func(s *scenarioRun) {
			s.Cut(s.Leader)
			time.Sleep(2 * ttl)
			s.Heal(s.Leader)
		}},
		{Name: "sigstop_leader_2ttl_then_sigcont", Load: 7 * time.Second, Frozen: true, Change: safety.MustChange, Fault: safety.SigstopFault[*etcdProcs]},
		{Name: "sigterm_leader", Load: 3 * time.Second, Change: safety.MustChange, NoErrors: mode == "forward", Fault: func(s *scenarioRun) {
			s.Survivors = others(s.Fleet, s.Leader)
			s.Load.MarkDown(s.Leader)
			s.Leader.Term()
		}},
		{Name: "sigkill_leader", Load: 5 * time.Second, Change: safety.MustChange, Fault: func(s *scenarioRun) {
			s.Survivors = others(s.Fleet, s.Leader)
			s.Leader.Kill()
		}},
	}
	for i := range base {
		base[i].Warmup, base[i].Rate = pgSafetyWarmup, pgSafetyRate
	}
	return base
}

// TestSafetyPostgresPolling: with watches left to polling (disable_listen, as behind
// PgBouncer), the leader is cut off from PostgreSQL right after a heartbeat and its row is
// deleted at once. The followers' last reads came before that heartbeat and their next
// ones find the row gone, so their watches must report the heartbeat before the vacancy:
// the winner counts the old leader's deadline from it (issue 18, hole 3):
//
//	go test -count=1 -v -run TestSafetyPostgresPolling ./e2e/
//
// The fault is repeated, each time on the leader of the moment.
func TestSafetyPostgresPolling(t *testing.T) {
	needCaddy(t)
	t.Parallel() // a server of its own: it runs beside the other parallel tests (see the package comment)
	const mode, runs = "reject", 3
	started := time.Now()
	server := pgtest.Start(t)
	var reports []safetyReport
	defer func() {
		t.Logf("RESULTS (ttl %v, %d instances, PostgreSQL with disable_listen, %d req/s; %v in all):%s", ttl, pgSafetyInstances, pgSafetyRate, time.Since(started).Round(time.Second), safety.Table(reports))
	}()
	const name = "polling"
	prefix := pgTablePrefix(name)
	env := startPGEnv(t, server, name, mode, map[string]any{"disable_listen": true})
	for i := range runs {
		sc := safetyScenario{
			Name: fmt.Sprintf("cut_off_after_a_heartbeat_and_row_deleted_%d", i+1), Load: 6 * time.Second,
			Warmup: pgSafetyWarmup, Rate: pgSafetyRate, Change: safety.MustChange,
			Fault: func(s *scenarioRun) {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				conn, err := pgx.Connect(ctx, server.DSN())
				if err != nil {
					s.T.Fatal(err)
				}
				defer conn.Close(context.Background())
				if err := afterHeartbeat(ctx, conn, prefix); err != nil {
					s.T.Fatal(err)
				}
				s.FaultAt = time.Now() // the wait for the heartbeat was no fault yet
				s.Cut(s.Leader)
				tag, err := conn.Exec(ctx, fmt.Sprintf(`DELETE FROM %selections WHERE name = 'default'`, prefix))
				if err != nil || tag.RowsAffected() != 1 {
					s.T.Fatalf("delete the election row: %v, %v", tag, err)
				}
				time.Sleep(2 * ttl)
				s.Heal(s.Leader)
			},
		}
		if !t.Run(sc.Name, func(t *testing.T) {
			env.T = t
			reports = append(reports, safety.RunOn(t, env, sc))
		}) {
			return
		}
	}
}

// afterHeartbeat returns as soon as the election row's last write changes: right after a
// heartbeat of its holder.
func afterHeartbeat(ctx context.Context, conn *pgx.Conn, prefix string) error {
	q := fmt.Sprintf(`SELECT rev FROM %selections WHERE name = 'default'`, prefix)
	var first int64
	if err := conn.QueryRow(ctx, q).Scan(&first); err != nil {
		return fmt.Errorf("read the election row: %w", err)
	}
	for {
		var rev int64
		if err := conn.QueryRow(ctx, q).Scan(&rev); err != nil {
			return fmt.Errorf("read the election row: %w", err)
		}
		if rev != first {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no heartbeat: %w", ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
}
