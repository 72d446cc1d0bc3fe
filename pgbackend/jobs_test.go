package pgbackend

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/pgtest"
)

// TestJobRecordWaitsForTheElectionRow puts a job's record while another transaction has
// changed the election's row and not committed yet (a takeover's campaign, a release): the
// put must wait for it and then find the row no longer the term's. Were the put to check
// the row as its snapshot shows it, it would write under a term that was ending.
func TestJobRecordWaitsForTheElectionRow(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	server := pgtest.Start(t)
	b := newBackend(t, Config{DSN: server.DSN()})
	for _, tc := range []struct {
		name, change string
	}{
		{"takeover", `UPDATE caddy_leader_elections SET token = token + 1 WHERE name = $1`},
		{"release", `DELETE FROM caddy_leader_elections WHERE name = $1`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			election := "jobs-" + tc.name
			_, o := win(t, ctx, b, election, "v", time.Minute)
			if ok, err := b.PutJobRecord(ctx, election, "backup", o.Holder.Token, []byte("1")); err != nil || !ok {
				t.Fatalf("PutJobRecord = %v, %v", ok, err)
			}
			tx, err := b.Pool().Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			if _, err := tx.Exec(ctx, tc.change, election); err != nil {
				t.Fatal(err)
			}
			type answer struct {
				ok  bool
				err error
			}
			done := make(chan answer, 1)
			go func() {
				ok, err := b.PutJobRecord(ctx, election, "backup", o.Holder.Token, []byte("late"))
				done <- answer{ok, err}
			}()
			waitForLockWait(t, ctx, b, done)
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if a := <-done; a.err != nil || a.ok {
				t.Fatalf("PutJobRecord after the %s committed = %v, %v; want false", tc.name, a.ok, a.err)
			}
			if got, err := b.JobRecord(ctx, election, "backup"); err != nil || string(got) != "1" {
				t.Fatalf("JobRecord = %q, %v; want the term's own record", got, err)
			}
		})
	}
}

// waitForLockWait returns once a statement waits for a lock; it fails the test if the put
// answers first.
func waitForLockWait[T any](t *testing.T, ctx context.Context, b *Backend, done <-chan T) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case a := <-done:
			t.Fatalf("PutJobRecord answered %+v without waiting for the uncommitted change of the election's row", a)
		case <-ctx.Done():
			t.Fatal("no statement waited for a lock")
		case <-tick.C:
		}
		var waiting int
		err := b.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'`).Scan(&waiting)
		if err != nil {
			t.Fatal(fmt.Errorf("reading pg_stat_activity: %w", err))
		}
		if waiting > 0 {
			return
		}
	}
}

// TestJobRecordNamesAMissingTable: a schema managed by hand (skip_schema) that predates the
// jobs table fails a job's record read and write with the table's name and what to do;
// elections work on.
func TestJobRecordNamesAMissingTable(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	server := pgtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, _, err := newBackend(t, Config{DSN: server.DSN()}).Grant(ctx, time.Minute); err != nil {
		t.Fatal(err) // creates the tables
	}
	server.Exec(t, `DROP TABLE caddy_leader_jobs`)
	b := newBackend(t, Config{DSN: server.DSN(), SkipSchema: true})
	_, o := win(t, ctx, b, "old-schema", "v", time.Minute)
	const want = "table caddy_leader_jobs is missing: run pgbackend.Schema's statements again"
	for _, tc := range []struct {
		name string
		do   func() error
	}{
		{"read", func() error { _, err := b.JobRecord(ctx, "old-schema", "backup"); return err }},
		{"write", func() error {
			_, err := b.PutJobRecord(ctx, "old-schema", "backup", o.Holder.Token, []byte("1"))
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.do(); err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("error %v; want one that says %q", err, want)
			}
		})
	}
}
