package caddyleader

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
	"github.com/caddyleader/caddy-leader/internal/testkit/freeport"
)

func init() {
	caddy.RegisterModule(eventRecorder{})
}

// eventRecorder is an events handler module that remembers the leader events it gets.
type eventRecorder struct{}

var metricsRuns atomic.Int64

var recorded struct {
	sync.Mutex
	events []caddy.Event
}

func (eventRecorder) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "events.handlers.leader_test_recorder", New: func() caddy.Module { return new(eventRecorder) }}
}

func (eventRecorder) Handle(_ context.Context, e caddy.Event) error {
	recorded.Lock()
	recorded.events = append(recorded.events, e)
	recorded.Unlock()
	return nil
}

func waitEvent(t *testing.T, name string) caddy.Event {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		recorded.Lock()
		for _, e := range recorded.events {
			if e.Name() == name {
				recorded.Unlock()
				return e
			}
		}
		recorded.Unlock()
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no %s event", name)
	return caddy.Event{}
}

// metric reads one sample from the admin endpoint's /metrics; -1 when it is absent.
func metric(t *testing.T, adminPort int, series string) float64 {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", adminPort))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindSubmatch(body)
	if m == nil {
		return -1
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestMetricsAndEvents runs the plugin in this process through Caddy's own config loading:
// the metrics at the admin /metrics endpoint and the events through the events app, across
// a reload and a resign.
func TestMetricsAndEvents(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and Caddy")
	}
	recorded.Lock()
	recorded.events = nil
	recorded.Unlock()
	// Counters are process-wide and keep counting; a fresh election starts them at zero.
	election := fmt.Sprintf("metrics%d", metricsRuns.Add(1))
	cluster := etcdtest.Start(t, 1)
	ports := freeport.MustPick(t, 2)
	adminPort, httpPort := ports[0], ports[1]
	config := func(body string) []byte {
		return []byte(fmt.Sprintf(`{
			"admin": {"listen": "127.0.0.1:%d"},
			"apps": {
				"leader": {"endpoints": [%q], "prefix": "/metrics-test/", "ttl": "2s",
					"instance_id": "metrics-node", "advertise": "http://127.0.0.1:%d"},
				"events": {"subscriptions": [{
					"events": ["leader_elected", "leader_lost", "leader_changed"],
					"handlers": [{"handler": "leader_test_recorder"}]}]},
				"http": {"servers": {"s": {
					"listen": ["127.0.0.1:%d"], "automatic_https": {"disable": true},
					"routes": [
						{"match": [{"path": ["/held"]}], "handle": [
							{"handler": "leader_gate", "election": %[5]q, "hold": "100ms"},
							{"handler": "static_response", "body": %[6]q}]},
						{"handle": [
							{"handler": "leader_gate", "election": %[5]q, "hold": 0},
							{"handler": "static_response", "body": %[6]q}]}]}}}
			}}`, adminPort, cluster.Endpoint(0), httpPort, httpPort, election, body))
	}
	if err := caddy.Load(config("one"), true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })

	elected := waitEvent(t, EventElected)
	if elected.Data["election"] != election || elected.Data["self"] != "metrics-node" || elected.Data["token"].(int64) <= 0 {
		t.Errorf("leader_elected data = %v", elected.Data)
	}
	waitEvent(t, EventChanged)

	get := func(want string) {
		t.Helper()
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/", httpPort))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || string(body) != want {
			t.Fatalf("GET / = %d %q, want 200 %q", resp.StatusCode, body, want)
		}
	}
	// Elected is the key won; the first winner of an election then waits a ttl before it
	// admits (it cannot name a term before it).
	el := `{election="` + election + `"}`
	for deadline := time.Now().Add(10 * time.Second); metric(t, adminPort, "caddy_leader_is_leader"+el) != 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the elected instance did not lead within 10s")
		}
	}
	get("one")
	get("one")

	series := func(name, label string) string { return name + `{election="` + election + `",` + label + `}` }
	checks := []struct {
		series string
		ok     func(float64) bool
	}{
		{"caddy_leader_is_leader" + el, func(v float64) bool { return v == 1 }},
		{series("caddy_leader_transitions_total", `to="leader"`), func(v float64) bool { return v == 1 }},
		{series("caddy_leader_requests_total", `outcome="served"`), func(v float64) bool { return v == 2 }},
		{"caddy_leader_term_token" + el, func(v float64) bool { return v > 0 }},
		{"caddy_leader_lease_remaining_seconds" + el, func(v float64) bool { return v > 0 && v <= 2 }},
		{"caddy_leader_last_store_contact_timestamp_seconds", func(v float64) bool {
			return v > float64(time.Now().Add(-2*time.Second).Unix()) && v <= float64(time.Now().Unix()+1)
		}},
		{"caddy_leader_requests_in_flight" + el, func(v float64) bool { return v == 0 }},
		{"caddy_leader_term_start_timestamp_seconds" + el, func(v float64) bool {
			return v > float64(time.Now().Add(-time.Minute).Unix()) && v <= float64(time.Now().Unix()+1)
		}},
	}
	for _, c := range checks {
		if v := metric(t, adminPort, c.series); !c.ok(v) {
			t.Errorf("%s = %v", c.series, v)
		}
	}

	t.Run("a_reload_neither_resets_nor_duplicates_metrics", func(t *testing.T) {
		if err := caddy.Load(config("two"), true); err != nil {
			t.Fatal(err)
		}
		get("two")
		if v := metric(t, adminPort, series("caddy_leader_requests_total", `outcome="served"`)); v != 3 {
			t.Errorf("served after reload = %v, want 3 (counting on)", v)
		}
		if v := metric(t, adminPort, series("caddy_leader_transitions_total", `to="leader"`)); v != 1 {
			t.Errorf("transitions to leader after reload = %v, want still 1", v)
		}
		if v := metric(t, adminPort, "caddy_leader_is_leader"+el); v != 1 {
			t.Errorf("is_leader after reload = %v", v)
		}
	})

	t.Run("resign_is_a_transition_and_a_leader_lost_event", func(t *testing.T) {
		resp, err := http.Post(fmt.Sprintf("http://127.0.0.1:%d/leader/%s/resign?hold_off=1m", adminPort, election), "", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("resign: %d", resp.StatusCode)
		}
		lost := waitEvent(t, EventLost)
		if lost.Data["reason"] != "resigned" {
			t.Errorf("leader_lost reason = %v", lost.Data["reason"])
		}
		if v := metric(t, adminPort, "caddy_leader_is_leader"+el); v != 0 {
			t.Errorf("is_leader after resign = %v", v)
		}
		if v := metric(t, adminPort, series("caddy_leader_transitions_total", `to="follower"`)); v != 1 {
			t.Errorf("transitions to follower = %v, want 1", v)
		}
		resp, err = http.Get(fmt.Sprintf("http://127.0.0.1:%d/", httpPort))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("gated request after resign: %d, want 503", resp.StatusCode)
		}
		if v := metric(t, adminPort, series("caddy_leader_requests_total", `outcome="rejected"`)); v != 1 {
			t.Errorf("rejected = %v, want 1", v)
		}

		// A held request is counted once by its outcome, and its wait apart from it.
		resp, err = http.Get(fmt.Sprintf("http://127.0.0.1:%d/held", httpPort))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("held request after resign: %d, want 503", resp.StatusCode)
		}
		if v := metric(t, adminPort, series("caddy_leader_requests_total", `outcome="rejected"`)); v != 2 {
			t.Errorf("rejected after a held request = %v, want 2 (held requests count once)", v)
		}
		if v := metric(t, adminPort, "caddy_leader_hold_duration_seconds_count"+el); v != 1 {
			t.Errorf("hold_duration_seconds_count = %v, want 1", v)
		}
		if v := metric(t, adminPort, "caddy_leader_hold_duration_seconds_sum"+el); v < 0.09 {
			t.Errorf("hold_duration_seconds_sum = %v, want about the 100ms hold", v)
		}
	})

	t.Run("admin_api_lists_the_election", func(t *testing.T) {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/leader/", adminPort))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, want := range []string{`"election":"` + election + `"`, `"self":"metrics-node"`, `"reason":"resigned"`} {
			if !strings.Contains(string(body), want) {
				t.Errorf("GET /leader/ = %s, missing %s", body, want)
			}
		}
	})
}
