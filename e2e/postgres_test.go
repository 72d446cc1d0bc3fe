//go:build unix

package e2e

import (
	"syscall"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/pgtest"
)

// TestPostgresStore runs real Caddy processes that elect through PostgreSQL
// (`"store": {"module": "postgres"}`) through the same faults as on etcd.
func TestPostgresStore(t *testing.T) {
	needCaddy(t)
	server := pgtest.Start(t)
	store := map[string]any{"module": "postgres", "dsn": server.DSN()}

	for _, tc := range []struct {
		name string
		stop func(*Instance)
		// within bounds the takeover: after SIGKILL the lease, renewed at most ttl/3
		// before, expires ttl after that and followers read again right after
		// expires_at; after SIGTERM the leader releases the key on its way out.
		within time.Duration
	}{
		{"sigkill_leader_successor_serves_within_ttl_plus_1s_with_higher_token", (*Instance).Kill, ttl + time.Second},
		{"sigterm_leader_resigns_and_successor_serves_within_one_ttl", (*Instance).Term, ttl},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fleet := StartFleet(t, 3, Config{Store: store, Variant: "v0"})
			leader, token := WaitStableLeader(t, fleet, electTimeout)
			poller := StartPoller(others(fleet, leader))
			defer poller.Stop()

			stopped := time.Now()
			tc.stop(leader)
			s := poller.WaitServed(t, tc.within, "other than the stopped leader", func(Served) bool { return true })
			t.Logf("MEASURED takeover on postgres: %v (%s, token %d -> %d)", s.At.Sub(stopped), s.From, token, s.Gated.Token)
			if s.Gated.Token <= token {
				t.Errorf("successor %s serves with token %d, want above the old leader's %d", s.From, s.Gated.Token, token)
			}
			if s.SentAt.Before(stopped) {
				t.Errorf("%s served /gated (token %d) before leader %s stopped: two leaders", s.From, s.Gated.Token, leader)
			}
		})
	}

	t.Run("sigstopped_leader_past_its_lease_serves_nothing_after_sigcont", func(t *testing.T) {
		fleet := StartFleet(t, 3, Config{Store: store, Variant: "v0"})
		old, oldToken := WaitStableLeader(t, fleet, electTimeout)
		old.Stop()
		t.Cleanup(func() { _ = old.Process().Signal(syscall.SIGCONT) })
		next, token := WaitStableLeader(t, others(fleet, old), electTimeout)
		if token <= oldToken {
			t.Fatalf("new leader %s has token %d, not above %d", next, token, oldToken)
		}
		old.Cont()
		// The first request after the pause finds the deadline passed: it is rejected.
		resp, err := old.Get("/gated")
		if err != nil {
			t.Fatal(err)
		}
		if resp.Status == 200 {
			t.Fatalf("the paused leader served /gated after SIGCONT: %q", resp.Body)
		}
	})
}
