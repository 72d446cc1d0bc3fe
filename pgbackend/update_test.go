package pgbackend

import (
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/pgtest"
)

// TestHeartbeatsKeepTheMarkKeyOutOfTheStatementLog: on a server that logs every
// modifying statement with its parameters (log_statement = mod, log_parameter_max_length
// at its default: in full), a leader's term puts its mark key in the log with the
// campaign that began it, and never with the heartbeats that follow.
func TestHeartbeatsKeepTheMarkKeyOutOfTheStatementLog(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	const ttl = time.Second
	server := pgtest.StartWith(t, pgtest.Options{Settings: []string{"log_statement = 'mod'"}})
	f := startPGFleet(t, server.Addr(), ttl, "marked", Config{})
	leader, token := f.Leader(5 * time.Second)
	key := leader.Election.Term().Leader.MarkKey
	if key == "" {
		t.Fatal("the leader's record has no mark key")
	}
	heartbeats := func() int {
		return strings.Count(server.Log(t), "UPDATE caddy_leader_elections SET ")
	}
	defer func() {
		if t.Failed() {
			l := server.Log(t)
			t.Log(l[max(0, len(l)-3000):])
		}
	}()
	f.Await("a few heartbeats", 10*time.Second, func() bool { return heartbeats() >= 5 })
	if l, tok := f.Leader(time.Second); l != leader || tok != token {
		t.Fatalf("leadership moved to %s (token %d) meanwhile", l.ID, tok)
	}

	log := server.Log(t)
	// Parameters are logged as text, and bytea as hex.
	n := strings.Count(log, key) + strings.Count(log, hex.EncodeToString([]byte(key)))
	t.Logf("%d heartbeats logged; the mark key appears %d times", heartbeats(), n)
	if n > 1 {
		t.Errorf("the mark key appears %d times in the server's statement log, want at most once (the campaign)", n)
	}
}
