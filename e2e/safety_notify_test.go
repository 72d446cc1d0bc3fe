//go:build unix

package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/caddyleader/caddy-leader/internal/testkit/pgtest"
	"github.com/caddyleader/caddy-leader/internal/testkit/safety"
)

// TestSafetyForgedNotify: anyone who can connect to PostgreSQL may NOTIFY on the store's
// channel, and the live fencing token and the row's revision are no secret. A forged
// delete notification naming them must only make the instances look (issue 25, case 5):
//
//	go test -count=1 -v -run TestSafetyForgedNotify ./e2e/
//
// Each sequence runs on a fleet of four of its own, in reject mode:
//   - the forged notification alone: the leader writes no acknowledgement for its live
//     term and gated traffic goes on;
//   - the forged notification, then an operator's delete of the row while the leader's
//     links are slow: the successor must not take the leader's live term for one that
//     acknowledged its end.
func TestSafetyForgedNotify(t *testing.T) {
	needCaddy(t)
	server := pgtest.Start(t)
	results := startResults(t, fmt.Sprintf("ttl %v, %d instances, PostgreSQL, %d req/s", ttl, pgSafetyInstances, pgSafetyRate))
	// The fleets' names, which their tables' prefixes are made of.
	const mode, alone, thenDeleted = "reject", "forged_alone", "forged_then_deleted"
	fleets := []string{alone, thenDeleted}
	scenarios := []safetyScenario{
		{Name: "forged_delete_notification", Load: 3 * ttl, Change: safety.NoChange, Fault: func(s *scenarioRun) {
			prefix := pgTablePrefix(alone)
			token := forgeDeleteNotice(s, server, prefix)
			time.Sleep(ttl)
			if n := server.QueryInt(s.T, fmt.Sprintf(`SELECT count(*) FROM %sreleased WHERE election = 'default' AND token = %d`, prefix, token)); n != 0 {
				s.T.Errorf("the leader acknowledged the end of its live term %d after a forged notification (%d rows)", token, n)
			}
		}, Check: func(t *testing.T, s *scenarioRun, rep *safetyReport) {
			// A notification is a reason to look, not to let go: gated traffic goes on.
			if rep.NoLeader > ttl/2 {
				t.Errorf("no request was served for %s after a forged notification", safety.FmtDur(rep.NoLeader))
			}
		}},
		// Renews: the row goes ttl/4 after the fault began, over a slowed link; a heartbeat
		// the leader sent just before the delete still counts, so its last admission is
		// bounded by that heartbeat (then + ttl), not by ttl after the forged notification.
		{Name: "forged_delete_notification_then_row_deleted_while_the_leader_hears_late", Load: 6 * time.Second, Change: safety.MustChange, Renews: true,
			Fault: func(s *scenarioRun) {
				prefix := pgTablePrefix(thenDeleted)
				forgeDeleteNotice(s, server, prefix)
				time.Sleep(ttl / 4) // the leader has heard it, and may have acted on it
				s.Delay(s.Leader, safety.OperatorLinkDelay)
				n := server.QueryInt(s.T, fmt.Sprintf(`WITH d AS (DELETE FROM %selections WHERE name = 'default' RETURNING 1)
					SELECT count(*) FROM d`, prefix))
				if n != 1 {
					s.T.Fatalf("delete the election row: %d rows deleted, want 1", n)
				}
				time.Sleep(2 * ttl)
				s.Heal(s.Leader)
			}},
	}
	for i, sc := range scenarios {
		sc.Warmup, sc.Rate = pgSafetyWarmup, pgSafetyRate
		fault, check := sc.Fault, sc.Check
		sc.Fault = func(s *scenarioRun) { sequenceFleets.Store(s, s.Fleet); fault(s) }
		sc.Check = func(t *testing.T, s *scenarioRun, rep *safetyReport) {
			logElection(s)
			safety.NoteDouble(rep)
			if check != nil {
				check(t, s, rep)
			}
		}
		report := results.row()
		t.Run(sc.Name, func(t *testing.T) {
			t.Parallel() // a fleet and tables of its own (see TestSafety)
			env := startPGEnv(t, server, fleets[i], mode, nil)
			report(safety.RunOn(t, env, sc))
		})
	}
}

// forgeDeleteNotice sends, as any client of the database may, the notification the store's
// trigger sends when the election row is deleted, naming the live term and its row's last
// write (`<election>/d/<token>/<rev>/<at>`), while the row stays. It returns the token.
func forgeDeleteNotice(s *scenarioRun, server *pgtest.Server, prefix string) int64 {
	s.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, server.DSN())
	if err != nil {
		s.T.Fatal(err)
	}
	defer conn.Close(context.Background())
	var token, rev, at int64
	if err := conn.QueryRow(ctx, fmt.Sprintf(`SELECT token, rev, %[1]snext() FROM %[1]selections WHERE name = 'default'`, prefix)).Scan(&token, &rev, &at); err != nil {
		s.T.Fatalf("read the election row: %v", err)
	}
	payload := fmt.Sprintf("default/d/%d/%d/%d", token, rev, at)
	if _, err := conn.Exec(ctx, `SELECT pg_notify($1, $2)`, prefix+"changes", payload); err != nil {
		s.T.Fatalf("NOTIFY %s: %v", payload, err)
	}
	s.Notes = append(s.Notes, fmt.Sprintf("forged NOTIFY %q", payload))
	return token
}
