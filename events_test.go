package caddyleader

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/caddyserver/caddy/v2"
	dto "github.com/prometheus/client_model/go"

	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
	"github.com/caddyleader/caddy-leader/internal/testkit/faultproxy"
)

// eventSink is an HTTP endpoint that records what leader_webhook POSTs to it.
type eventSink struct {
	*httptest.Server
	mu     sync.Mutex
	events []webhookBody
}

func newEventSink(t *testing.T) *eventSink {
	s := &eventSink{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var ev webhookBody
		if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json" {
			t.Errorf("webhook request %s with Content-Type %q", r.Method, r.Header.Get("Content-Type"))
		}
		if err := json.NewDecoder(r.Body).Decode(&ev); err != nil {
			t.Errorf("webhook body: %v", err)
		}
		s.mu.Lock()
		s.events = append(s.events, ev)
		s.mu.Unlock()
	}))
	t.Cleanup(s.Close)
	return s
}

// received returns the events received so far.
func (s *eventSink) received() []webhookBody {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]webhookBody(nil), s.events...)
}

func (s *eventSink) names() []string {
	var names []string
	for _, ev := range s.received() {
		names = append(names, ev.Name)
	}
	return names
}

// loadCaddyfile adapts a Caddyfile and runs it in this process until the test ends.
func loadCaddyfile(t *testing.T, text string) {
	t.Helper()
	t.Setenv("XDG_DATA_HOME", t.TempDir())
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	js, _, err := adaptCaddyfile(t, text)
	if err != nil {
		t.Fatalf("the Caddyfile does not adapt: %v\n%s", err, text)
	}
	if err := caddy.Load(js, true); err != nil {
		t.Fatalf("the Caddyfile does not load: %v\n%s", err, js)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
}

// runningApp is the leader app of the config running in this process.
func runningApp(t *testing.T) *App {
	t.Helper()
	app, err := caddy.ActiveContext().AppIfConfigured("leader")
	if err != nil {
		t.Fatal(err)
	}
	return app.(*App)
}

// TestStoreTroubleEvents cuts the link between a running Caddy and a real etcd, lets many
// lease requests fail, and heals it: leader_webhook, subscribed with the Caddyfile form
// that docs/events.md shows, receives exactly one leader_store_unreachable and then one
// leader_store_reachable.
func TestStoreTroubleEvents(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and Caddy")
	}
	cluster := etcdtest.Start(t, 1)
	link, err := faultproxy.New(strings.TrimPrefix(cluster.Endpoint(0), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = link.Close() })
	sink := newEventSink(t)

	loadCaddyfile(t, fmt.Sprintf(`{
	admin off
	persist_config off
	leader {
		endpoints %s
		prefix /events-test/
		ttl 2s
		instance_id trouble-node
		elections trouble
	}
	events {
		on leader_store_unreachable leader_webhook %s
		on leader_store_reachable leader_webhook %s {
			timeout 2s
		}
	}
}
`, link.URL(), sink.URL, sink.URL))
	candidate := runningApp(t).candidate
	waitUntil(t, "the store confirms the lease", func() bool { return !candidate.LastContact().IsZero() })

	failedLeaseRequests := func() float64 {
		n := 0.0
		for _, op := range []string{"grant", "renew"} {
			var m dto.Metric
			if err := metrics.storeErrors.WithLabelValues(op).Write(&m); err != nil {
				t.Fatal(err)
			}
			n += m.GetCounter().GetValue()
		}
		return n
	}
	before := failedLeaseRequests()
	link.Blackhole()
	waitUntil(t, "three lease requests fail", func() bool { return failedLeaseRequests() >= before+3 })
	waitUntil(t, "the unreachable event arrives", func() bool { return len(sink.received()) >= 1 })
	link.Heal()
	waitUntil(t, "the reachable event arrives", func() bool { return len(sink.received()) >= 2 })

	got := sink.received()
	if names := sink.names(); strings.Join(names, " ") != EventStoreUnreachable+" "+EventStoreReachable {
		t.Fatalf("events = %v, want one %s then one %s", names, EventStoreUnreachable, EventStoreReachable)
	}
	down, up := got[0], got[1]
	if down.Data["self"] != "trouble-node" || down.Data["error"] == "" || down.Origin != "leader" {
		t.Errorf("%s = %+v", EventStoreUnreachable, down)
	}
	if n, _ := up.Data["failed_requests"].(float64); up.Data["self"] != "trouble-node" || n < 3 {
		t.Errorf("%s = %+v, want self trouble-node and failed_requests >= 3", EventStoreReachable, up)
	}
}

// TestDocsShowGoldens keeps the Caddyfile examples of the docs the golden files that
// TestCaddyfileAdapt adapts, verbatim.
func TestDocsShowGoldens(t *testing.T) {
	cases := []struct{ doc, golden string }{
		{"docs/events.md", "events_webhook"},
		{"docs/app.md", "global_step_down_when_unhealthy"},
		{"docs/app.md", "global_store_etcd"},
		{"docs/app.md", "global_store_postgres"},
		{"docs/leader_health.md", "health_every_option"},
		{"docs/status-page.md", "status_page_behind_auth"},
		{"docs/status-page.md", "status_page_admin_link"},
	}
	for _, tc := range cases {
		t.Run(tc.golden, func(t *testing.T) {
			doc, err := os.ReadFile(tc.doc)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(goldenAdaptDir, tc.golden+".caddyfiletest")
			cf, _ := readGolden(t, path)
			if !strings.Contains(string(doc), "```\n"+cf+"```\n") {
				t.Errorf("%s does not show the Caddyfile of %s verbatim: copy it over", tc.doc, path)
			}
		})
	}
}
