package caddyleader

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
)

// flakyService is a local service whose health probe answers 503 for a number of probes
// that the test sets, and 200 otherwise.
type flakyService struct {
	*httptest.Server
	failNext       atomic.Int64
	failed, passed atomic.Int64
}

func newFlakyService(t *testing.T) *flakyService {
	s := &flakyService{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.failNext.Add(-1) >= 0 {
			s.failed.Add(1)
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		s.passed.Add(1)
	}))
	t.Cleanup(s.Close)
	return s
}

// TestStepDownWhenUnhealthy runs step_down_when_unhealthy (from the Caddyfile) against a
// real HTTP service and a real etcd, with a second candidate standing by: failures fewer
// than `fails` in a row change nothing; `fails` in a row make the leader hand over to the
// other candidate, stay out while its hold-off lasts, and say why in an event.
func TestStepDownWhenUnhealthy(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and Caddy")
	}
	cluster := etcdtest.Start(t, 1)
	service := newFlakyService(t)
	sink := newEventSink(t)
	logFile := filepath.Join(t.TempDir(), "leader.log")
	const prefix = "/step-down-test/"
	loadCaddyfile(t, fmt.Sprintf(`{
	admin off
	persist_config off
	log {
		output file %s
		format json
		include leader
	}
	leader {
		endpoints %s
		prefix %s
		ttl 3s
		instance_id tracked-node
		elections tracked
		step_down_when_unhealthy %s/healthz {
			interval 300ms
			timeout 300ms
			fails 3
			hold_off 1m
		}
	}
	events {
		on leader_service_unhealthy leader_webhook %s
		on leader_service_healthy leader_webhook %s
	}
}
`, logFile, cluster.Endpoint(0), prefix, service.URL, sink.URL, sink.URL))
	election := runningApp(t).elections["tracked"]
	waitUntil(t, "the tracked instance leads", func() bool { _, ok := election.Check(); return ok })
	token := election.Term().Token
	other := startInstanceUnder(t, cluster.Endpoints(), prefix, "standby-node", "http://127.0.0.1:1", "tracked", 3*time.Second, false)
	waitUntil(t, "the standby knows the leader", func() bool { return other.election.Term().Leader.ID == "tracked-node" })

	t.Run("fewer_failures_than_fails_keep_leadership", func(t *testing.T) {
		passed := service.passed.Load()
		service.failNext.Store(2)
		// Two failures, then passes: the count of failures in a row starts over.
		waitUntil(t, "two probes fail and two pass", func() bool {
			return service.failed.Load() >= 2 && service.passed.Load() >= passed+2
		})
		if term, ok := election.Check(); !ok || term.Token != token {
			t.Fatalf("leading %v with token %d after two failed probes; want still leading with token %d", ok, term.Token, token)
		}
		if got := sink.names(); len(got) != 0 {
			t.Errorf("events %v; want none", got)
		}
	})

	t.Run("fails_in_a_row_hand_over_and_hold_off", func(t *testing.T) {
		service.failNext.Store(1 << 30)
		waitUntil(t, "the standby leads", func() bool { _, ok := other.election.Check(); return ok })
		if _, ok := election.Check(); ok {
			t.Fatal("the unhealthy instance still leads")
		}
		if n := service.failed.Load(); n < 2+3 {
			t.Errorf("stepped down after %d failed probes in all; want 3 in a row after the first 2", n)
		}
		waitUntil(t, "the unhealthy event arrives", func() bool { return len(sink.received()) >= 1 })
		ev := sink.received()[0]
		if ev.Name != EventServiceUnhealthy || ev.Data["self"] != "tracked-node" || ev.Data["failures"] != float64(3) ||
			ev.Data["error"] != "status 503" || ev.Data["hold_off"] != "1m0s" || !slices.Equal(anyStrings(ev.Data["stepped_down"]), []string{"tracked"}) {
			t.Errorf("event = %+v", ev)
		}
		logged, err := os.ReadFile(logFile)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(logged), `"msg":"local service unhealthy; stepping down and holding off"`) ||
			!strings.Contains(string(logged), `"error":"status 503"`) {
			t.Errorf("no WARN saying why in the log:\n%s", logged)
		}
	})

	t.Run("healthy_again_waits_out_the_hold_off", func(t *testing.T) {
		service.failNext.Store(0)
		waitUntil(t, "the healthy event arrives", func() bool { return len(sink.received()) >= 2 })
		if ev := sink.received()[1]; ev.Name != EventServiceHealthy || ev.Data["self"] != "tracked-node" {
			t.Errorf("event = %+v", ev)
		}
		// The standby keeps leading: the recovered instance holds off for a minute.
		if term := other.election.Term(); !term.Holds() || term.Leader.ID != "standby-node" {
			t.Errorf("after the recovery the term is %+v; want the standby's", term)
		}
		if got := sink.names(); len(got) != 2 {
			t.Errorf("events %v; want one unhealthy and one healthy", got)
		}
	})
}

func anyStrings(v any) []string {
	list, _ := v.([]any)
	var out []string
	for _, x := range list {
		s, _ := x.(string)
		out = append(out, s)
	}
	return out
}
