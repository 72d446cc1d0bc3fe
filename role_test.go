package caddyleader

import (
	"net/http"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector/electortest"
)

// TestSettlingRole: a fleet's first winner waits, up to one ttl, before it admits (it cannot
// prove that nobody held the key just before). Meanwhile GET /leader/ (and so `caddy leader
// status`) and leader_health call it settling, not handing over or a standby of itself; once
// the wait is over, all of them call it leader.
func TestSettlingRole(t *testing.T) {
	store := electortest.NewStore() // its clock stands still until RunClock: the winner settles
	a := memoryCandidate(t, store, "a", 0)
	waitUntil(t, "a takes the key", func() bool { return a.Term().Holds() })

	check := func(t *testing.T, wantRole, wantHealthRole string, wantStatus int) {
		t.Helper()
		if got := statusOf(a, time.Now()).Role; got != wantRole {
			t.Errorf("GET /leader/ role = %q, want %q", got, wantRole)
		}
		status, rep, body := askHealth(t, newHealth(t, HealthHandler{}, a), http.MethodGet)
		if status != wantStatus || rep.Role != wantHealthRole {
			t.Errorf("GET /health = %d %s, want %d %s", status, body, wantStatus, wantHealthRole)
		}
	}
	t.Run("waiting_for_the_predecessor_is_settling", func(t *testing.T) {
		check(t, RoleSettling, HealthRoleSettling, http.StatusTooManyRequests)
	})
	t.Run("then_leader", func(t *testing.T) {
		store.RunClock(t, 10*time.Millisecond)
		waitUntil(t, "a leads", func() bool { _, ok := a.Check(); return ok })
		check(t, RoleLeader, HealthRoleLeader, http.StatusOK)
	})
}
