package caddyleader

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/elector/electortest"
	"github.com/caddyleader/caddy-leader/internal/testkit/fleet"
)

// memoryCandidate starts a candidate of election "default" on the in-memory store, on the
// real clock (a new leader waits out real time before it admits).
func memoryCandidate(t *testing.T, store *electortest.Store, id string, priority int) *elector.Election {
	t.Helper()
	_, es := fleet.StartCandidate(t, elector.Config{
		ID: id, URL: "http://" + id + ".test", TTL: 3 * time.Second, DrainTimeout: time.Second,
		Priority: priority, Backend: store.Client(), Logger: zaptest.NewLogger(t).Named(id),
	}, DefaultElection)
	return es[0]
}

func newHealth(t *testing.T, h HealthHandler, e *elector.Election) *HealthHandler {
	t.Helper()
	h.Election = DefaultElection
	h.election = e
	if h.LeaderStatus == 0 {
		h.LeaderStatus = DefaultHealthLeaderStatus
	}
	if h.StandbyStatus == 0 {
		h.StandbyStatus = DefaultHealthStandbyStatus
	}
	if h.UnhealthyStatus == 0 {
		h.UnhealthyStatus = DefaultHealthUnhealthyStatus
	}
	if err := h.Validate(); err != nil {
		t.Fatal(err)
	}
	return &h
}

// askHealth sends one request to h and returns the status and the decoded body (zero for HEAD).
func askHealth(t *testing.T, h *HealthHandler, method string) (int, HealthReport, string) {
	t.Helper()
	w := httptest.NewRecorder()
	if err := h.ServeHTTP(w, httptest.NewRequest(method, "/health", nil), nil); err != nil {
		t.Fatal(err)
	}
	var rep HealthReport
	if method != http.MethodHead {
		if err := json.Unmarshal(w.Body.Bytes(), &rep); err != nil {
			t.Fatalf("body %q is not a health report: %v", w.Body, err)
		}
	} else if w.Body.Len() != 0 {
		t.Errorf("HEAD answered with a body: %q", w.Body)
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", ct)
	}
	return w.Code, rep, w.Body.String()
}

func TestHealthHandler(t *testing.T) {
	store := electortest.NewStore()
	store.RunClock(t, 10*time.Millisecond) // the first winner waits a ttl
	a := memoryCandidate(t, store, "a", 0)
	b := memoryCandidate(t, store, "b", 2)
	never := memoryCandidate(t, store, "never", elector.NeverLead)
	fleet.WaitAgreed(t, 10*time.Second, []*elector.Election{a, b, never})
	leader, standby := a, b
	if _, ok := b.Check(); ok {
		leader, standby = b, a
	}
	leaderID := leader.Term().Self

	tests := []struct {
		name       string
		handler    HealthHandler
		e          *elector.Election
		wantStatus int
		wantRole   string
	}{
		{"leader_200", HealthHandler{}, leader, http.StatusOK, HealthRoleLeader},
		{"standby_429", HealthHandler{}, standby, http.StatusTooManyRequests, HealthRoleStandby},
		{"priority_0_is_a_standby", HealthHandler{}, never, http.StatusTooManyRequests, HealthRoleStandby},
		{"standby_ok_answers_as_the_leader", HealthHandler{StandbyOK: true, LeaderStatus: 202}, standby, http.StatusAccepted, HealthRoleStandby},
		{"standby_status_overridden", HealthHandler{StandbyStatus: 200, LeaderStatus: 503}, standby, http.StatusOK, HealthRoleStandby},
		{"leader_status_overridden", HealthHandler{StandbyStatus: 200, LeaderStatus: 503}, leader, http.StatusServiceUnavailable, HealthRoleLeader},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHealth(t, tt.handler, tt.e)
			status, rep, _ := askHealth(t, h, http.MethodGet)
			if status != tt.wantStatus || rep.Role != tt.wantRole {
				t.Errorf("GET: %d %s, want %d %s", status, rep.Role, tt.wantStatus, tt.wantRole)
			}
			if rep.Leader == nil || *rep.Leader != leaderID || rep.Token == 0 || rep.Election != DefaultElection {
				t.Errorf("body %+v: want leader %q, a token and election %q", rep, leaderID, DefaultElection)
			}
			if status, _, _ := askHealth(t, h, http.MethodHead); status != tt.wantStatus {
				t.Errorf("HEAD: %d, want %d", status, tt.wantStatus)
			}
		})
	}

	t.Run("held_off_after_resign_is_a_healthy_standby", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := leader.Resign(ctx, time.Hour); err != nil {
			t.Fatal(err)
		}
		status, rep, _ := askHealth(t, newHealth(t, HealthHandler{}, leader), http.MethodGet)
		if status != http.StatusTooManyRequests || rep.Role != HealthRoleStandby {
			t.Errorf("a held-off instance answers %d %s, want 429 standby", status, rep.Role)
		}
	})

	t.Run("unhealthy_503_when_the_lease_runs_out", func(t *testing.T) {
		store.SetDown(context.DeadlineExceeded)
		waitUntil(t, "the standby's lease runs out", func() bool { return !standby.Healthy() })
		status, rep, _ := askHealth(t, newHealth(t, HealthHandler{}, standby), http.MethodGet)
		if status != http.StatusServiceUnavailable || rep.Role != HealthRoleUnhealthy {
			t.Errorf("with the lease run out: %d %s, want 503 unhealthy", status, rep.Role)
		}
	})
}

// TestHealthHandlerNoLeader: when no instance leads, the body says so instead of naming
// an empty leader.
func TestHealthHandlerNoLeader(t *testing.T) {
	store := electortest.NewStore()
	never := memoryCandidate(t, store, "never", elector.NeverLead)
	h := newHealth(t, HealthHandler{}, never)
	waitUntil(t, "the lone priority-0 candidate is healthy", never.Healthy)
	// Once its registry lists it, no candidate can ever lead: it is no standby, and a load
	// balancer must not keep sending it traffic as a 429 would have it do.
	waitUntil(t, "the registry lists the lone priority-0 candidate", never.NobodyCanLead)
	status, rep, body := askHealth(t, h, http.MethodGet)
	if status != http.StatusServiceUnavailable {
		t.Errorf("status %d, want 503", status)
	}
	if rep.Leader != nil || rep.Token != 0 || !strings.Contains(rep.Detail, "no instance leads election default, and none can: every candidate has priority 0") {
		t.Errorf("body %s: want leader null, token 0 and a detail saying that no instance leads or can", body)
	}
	if !strings.Contains(body, `"leader":null`) {
		t.Errorf("body %s: want \"leader\":null", body)
	}
}

func TestHealthHandlerValidate(t *testing.T) {
	h := HealthHandler{LeaderStatus: 200, StandbyStatus: 99, UnhealthyStatus: 503}
	if err := h.Validate(); err == nil || !strings.Contains(err.Error(), "standby_status") {
		t.Errorf("Validate() = %v, want an error naming standby_status", err)
	}
}

// TestNobodyCanLeadIsLogged: a fleet whose every instance has priority 0 never leads; the
// instance says so at a warning when its registry shows it, once.
func TestNobodyCanLeadIsLogged(t *testing.T) {
	store := electortest.NewStore()
	core, logs := observer.New(zap.WarnLevel)
	_, es := fleet.StartCandidate(t, elector.Config{
		ID: "never", URL: "http://never.test", TTL: 3 * time.Second, DrainTimeout: time.Second,
		Priority: elector.NeverLead, Backend: store.Client(), Logger: zap.New(core),
	}, DefaultElection)
	waitUntil(t, "the registry lists the lone priority-0 candidate", es[0].NobodyCanLead)
	warned := logs.FilterMessageSnippet("no candidate of this election can lead").FilterField(zap.String("election", DefaultElection))
	if warned.Len() != 1 {
		t.Fatalf("%d warnings that nobody can lead, want 1; logs: %v", warned.Len(), logs.All())
	}
}
