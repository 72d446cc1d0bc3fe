package caddyleader

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/electionstatus"
	"github.com/caddyleader/caddy-leader/elector/electortest"
)

// TestSettlingRole: a fleet's first winner waits, up to one ttl, before it admits (it cannot
// prove that nobody held the key just before). Meanwhile GET /leader/ (and so `caddy leader
// status`) and leader_health call it settling, not handing over or a standby of itself; once
// it admits, leader.
func TestSettlingRole(t *testing.T) {
	store := electortest.NewStore()
	a := memoryCandidate(t, store, "a", 0)
	waitUntil(t, "a takes the key", func() bool { return a.Term().Holds() })
	if !a.Term().Settling {
		t.Fatalf("a holds the key of a fresh store without waiting: %+v", a.Term())
	}
	if got := electionstatus.Of(context.Background(), a, time.Now()).Role; got != RoleSettling {
		t.Errorf("GET /leader/ role = %q, want %q", got, RoleSettling)
	}
	status, rep, body := askHealth(t, newHealth(t, HealthHandler{}, a), http.MethodGet)
	if status != http.StatusTooManyRequests || rep.Role != HealthRoleSettling {
		t.Errorf("GET /health = %d %s, want 429 with role %s", status, body, HealthRoleSettling)
	}
	waitUntil(t, "a leads", func() bool { _, ok := a.Check(); return ok })
	if got := electionstatus.Of(context.Background(), a, time.Now()).Role; got != RoleLeader {
		t.Errorf("once a admits, GET /leader/ role = %q, want %q", got, RoleLeader)
	}
}
