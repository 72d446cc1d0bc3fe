package pgbackend

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/internal/testkit/pgtest"
)

// TestDocumentedGrantsSuffice runs the role and grants docs/postgres.md gives, on tables a
// superuser created, and a term as that role: campaign, heartbeat, handover mark, release,
// a job's record written and read, and a campaign after the sequence went back, which moves
// it on (setval).
func TestDocumentedGrantsSuffice(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	doc, err := os.ReadFile("../docs/postgres.md")
	if err != nil {
		t.Fatal(err)
	}
	start := strings.Index(string(doc), "CREATE ROLE caddy_leader")
	if start < 0 {
		t.Fatal("docs/postgres.md has no CREATE ROLE caddy_leader")
	}
	grants, _, _ := strings.Cut(string(doc[start:]), "```")
	grants = strings.Replace(grants, "PASSWORD '...'", "", 1) // the test server trusts 127.0.0.1

	server := pgtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, _, err := newBackend(t, Config{DSN: server.DSN()}).Grant(ctx, time.Minute); err != nil {
		t.Fatal(err) // creates the tables as the superuser
	}
	server.Exec(t, grants)
	role := Config{DSN: "postgres://caddy_leader@" + server.Addr() + "/postgres?sslmode=disable", SkipSchema: true}

	b := newBackend(t, role)
	lease, o := win(t, ctx, b, "grants", "v", time.Minute)
	for _, value := range []string{"v", "handing over"} {
		if ok, err := b.Update(ctx, "grants", o.Holder.Token, []byte(value)); err != nil || !ok {
			t.Fatalf("Update(%q) = %v, %v", value, ok, err)
		}
	}
	if ok, err := b.PutJobRecord(ctx, "grants", "backup", o.Holder.Token, []byte("record")); err != nil || !ok {
		t.Fatalf("PutJobRecord = %v, %v", ok, err)
	}
	if got, err := b.JobRecord(ctx, "grants", "backup"); err != nil || string(got) != "record" {
		t.Fatalf("JobRecord = %q, %v", got, err)
	}
	if err := b.Release(ctx, "grants", o.Holder.Token, lease, elector.EndedResigned); err != nil {
		t.Fatal(err)
	}
	server.Exec(t, `SELECT setval('caddy_leader_seq', 1)`)
	_, next := win(t, ctx, newBackend(t, role), "grants", "w", time.Minute)
	if next.Holder.Token <= o.Holder.Token || next.Prev != o.Holder.Token {
		t.Errorf("after the sequence went back: token %d (want above %d), Prev %d", next.Holder.Token, o.Holder.Token, next.Prev)
	}
}
