//go:build unix

package e2e

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/freeport"
)

// caddyLBCaddyfile is the recipe of docs/caddy-lb.md, which TestCaddyLB runs as it is.
const caddyLBCaddyfile = "../deploy/caddy-lb/Caddyfile"

// lbSeesHealth is how long the load balancer takes at most to see a change of an instance's
// /health: a few of the recipe's health_interval (250ms). Waiting it out is not an
// assertion: the tests count failed requests, not time.
const lbSeesHealth = time.Second

// startCaddyLB runs the recipe's load balancer, a Caddy process, in front of fleet, and
// returns its URL.
func startCaddyLB(t *testing.T, fleet []*Instance) string {
	t.Helper()
	caddyfile, err := filepath.Abs(caddyLBCaddyfile)
	if err != nil {
		t.Fatal(err)
	}
	ports, err := freeport.Pick(2)
	if err != nil {
		t.Fatal(err)
	}
	var upstreams []string
	for _, in := range fleet {
		upstreams = append(upstreams, fmt.Sprintf("127.0.0.1:%d", in.HTTPPort))
	}
	lb := newInstance(t, "caddy-lb", ports[0], ports[1])
	env := []string{
		fmt.Sprintf("CADDY_ADMIN=127.0.0.1:%d", ports[1]),
		fmt.Sprintf("LB_PORT=%d", ports[0]),
		"UPSTREAMS=" + strings.Join(upstreams, " "),
	}
	if err := lb.Launch(caddyBin, env, "run", "--adapter", "caddyfile", "--config", caddyfile); err != nil {
		t.Fatalf("the load balancer: %v\n--- log ---\n%s", err, lb.Tail())
	}
	return lb.URL()
}

// TestCaddyLB runs Caddy as the load balancer of the fleet (deploy/caddy-lb/Caddyfile, in
// front of the instances of deploy/haproxy/Caddyfile) under a steady load of writes: a
// SIGTERM of the leader and a rolling restart of every instance cost no request, because a
// stopping instance fails leader_health at once and serves, forwarding writes, until the
// load balancer has moved on. A crash (SIGKILL) of the leader is measured, not held to zero.
func TestCaddyLB(t *testing.T) {
	needCaddy(t)
	f := startRecipeFleet(t)
	lb := startCaddyLB(t, f.fleet)
	f.lbSees = lbSeesHealth

	t.Run("sigterm_leader_at_200rps_fails_no_request", func(t *testing.T) {
		f.attempt(t, func() []string { return f.sigtermUnderLoad(t, lb+"/write", 200) })
	})
	t.Run("rolling_restart_at_200rps_fails_no_request", func(t *testing.T) {
		f.attempt(t, func() []string { return f.rollingRestartUnderLoad(t, lb+"/write", 200) })
	})

	t.Run("sigkill_leader_at_20rps_is_measured", func(t *testing.T) {
		leader := f.settle(t)
		load := StartLoad(lb+"/write", 20)
		time.Sleep(loadWarmup)
		killed := time.Now()
		leader.Kill()
		// A successor within ttl (plus the store's expiry), then a second of requests that
		// must all succeed.
		recovered := killed.Add(recipeTTL + time.Second)
		time.Sleep(time.Until(recovered) + time.Second)
		outcomes := load.Stop()
		failed, slowest := tally(outcomes)
		var gate, other int
		var last time.Time
		for _, o := range failed {
			if o.Err == nil && o.Status == http.StatusServiceUnavailable && o.RetryAfter != "" {
				gate++
			} else {
				other++
			}
			if o.Sent.After(recovered) {
				t.Errorf("a write sent %v after the crash, past ttl+1s, failed: %v", o.Sent.Sub(killed), o)
			}
			last = o.Sent
		}
		t.Logf("MEASURED caddy-lb, SIGKILL of the leader at 20 req/s (ttl %v, hold %v): %d of %d requests failed (%d with the gate's 503 and Retry-After while no leader was known, %d otherwise: in flight to the dead instance); the last failed one was sent %v after the kill; slowest answer %v",
			recipeTTL, recipeHold, len(failed), len(outcomes), gate, other, since(last, killed), slowest.Round(time.Millisecond))
		for _, p := range f.app.problems() {
			t.Error(p)
		}
		f.restart(t, leader)
	})
}
