package deploy

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

const (
	caddyLBCaddyfile = "caddy-lb/Caddyfile"
	caddyLBDoc       = "../docs/caddy-lb.md"
)

// TestCaddyLBRecipe keeps the Caddy load balancer recipe what docs/caddy-lb.md says it is
// (e2e TestCaddyLB runs it under load): shown verbatim, formatted, health-checking the
// fleet's leader_health route well inside the fleet's lame-duck shutdown_delay.
func TestCaddyLBRecipe(t *testing.T) {
	body, err := os.ReadFile(caddyLBCaddyfile)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("UPSTREAMS", "caddy-1:8080 caddy-2:8080 caddy-3:8080")
	// The load balancer is a plain Caddy: no leader app, so not adapt's checks.
	js, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt(body, map[string]any{"filename": caddyLBCaddyfile})
	if err != nil || len(warnings) > 0 {
		t.Fatalf("%s does not adapt cleanly: %v %v", caddyLBCaddyfile, err, warnings)
	}
	if w, different := caddyfile.FormattingDifference(caddyLBCaddyfile, body); different {
		t.Errorf("%s:%d: not formatted as caddy fmt would", caddyLBCaddyfile, w.Line)
	}
	doc, err := os.ReadFile(caddyLBDoc)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), "```caddyfile\n"+string(body)+"```\n") {
		t.Errorf("%s does not show %s as it is: copy it into a ```caddyfile block", caddyLBDoc, caddyLBCaddyfile)
	}

	// The one reverse_proxy handler of the adapted config.
	var proxy struct {
		Upstreams     []struct{ Dial string }
		LoadBalancing struct {
			SelectionPolicy struct {
				Policy string
			} `json:"selection_policy"`
			Retries     int
			TryDuration float64 `json:"try_duration"`
		} `json:"load_balancing"`
		HealthChecks struct {
			Active struct {
				URI      string
				Interval float64
				Fails    int
			}
		} `json:"health_checks"`
	}
	s := string(js)
	i := strings.Index(s, `"handler":"reverse_proxy"`)
	if i < 0 {
		t.Fatalf("%s has no reverse_proxy", caddyLBCaddyfile)
	}
	start := strings.LastIndex(s[:i], "{")
	if err := json.NewDecoder(strings.NewReader(s[start:])).Decode(&proxy); err != nil {
		t.Fatal(err)
	}
	lb, active := proxy.LoadBalancing, proxy.HealthChecks.Active
	if len(proxy.Upstreams) != 3 || lb.SelectionPolicy.Policy != "first" || lb.TryDuration < float64(time.Second) {
		t.Errorf("reverse_proxy: %d upstreams, policy %q, retries %d, try_duration %v; want 3, first, a try duration of a second or more",
			len(proxy.Upstreams), lb.SelectionPolicy.Policy, lb.Retries, time.Duration(lb.TryDuration))
	}
	// The fleet's lame duck (deploy/haproxy/Caddyfile's shutdown_delay 2s) must outlast
	// the time the load balancer takes to see a failed check, with room to spare.
	if seen := time.Duration(active.Interval) * time.Duration(active.Fails); active.URI != "/health" || seen <= 0 || seen > time.Second {
		t.Errorf("active health check: uri %q, interval %v x fails %d; want /health, seen failing within 1s",
			active.URI, time.Duration(active.Interval), active.Fails)
	}
}
