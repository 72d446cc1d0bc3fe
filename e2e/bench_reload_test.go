//go:build bench && unix

package e2e

// TestBenchReload times config reloads of the leader (POST /load through the admin API)
// while the harness's term watch polls the whole fleet, and counts leadership changes:
// the target is none. See BENCHMARKS.md.
//
//	go test -tags bench -run TestBenchReload -v ./e2e

import (
	"flag"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
	"github.com/caddyleader/caddy-leader/internal/testkit/failover"
)

var benchReloads = flag.Int("bench.reloads", 20, "reloads of the leader to time")

func TestBenchReload(t *testing.T) {
	needCaddy(t)
	etcd := etcdtest.Start(t, 1)
	cfg := Config{Endpoints: etcd.Endpoints(), Variant: "v0"}
	fleet := StartFleet(t, 3, cfg)
	leader, token := WaitStableLeader(t, fleet, electTimeout)
	watch := startTermWatch(fleet, leader, token)

	// Spread over several renewal intervals (ttl/3), so that renewals land between and
	// during reloads.
	spacing := 3 * ttl / time.Duration(*benchReloads)
	var took []time.Duration
	drops := 0
	for i := range *benchReloads {
		time.Sleep(spacing)
		cfg.Variant = fmt.Sprintf("v%d", 1+i%2)
		start := time.Now()
		leader.Reload(cfg)
		took = append(took, time.Since(start))
		// Caddy drops some connections as it swaps configs, before any handler runs
		// (see termWatch); such a request is retried, as a client would.
		resp, dropped, err := getRetrying(leader, "/whoami")
		drops += dropped
		var w Whoami
		if err == nil {
			w, err = parseWhoami(resp)
		}
		if err != nil || !w.IsLeader || w.Token != token {
			t.Errorf("after reload %d: leader %s /whoami = %+v, %v; want it leading with token %d", i+1, leader, w, err, token)
		}
		resp, dropped, err = getRetrying(leader, "/gated")
		drops += dropped
		if err != nil || resp.Status != http.StatusOK {
			t.Errorf("after reload %d: GET /gated on %s = %+v, %v", i+1, leader, resp, err)
		} else if g, err := parseGated(resp.Body); err != nil || g.Variant != cfg.Variant || g.Token != token {
			t.Errorf("after reload %d: /gated = %q (%v), want variant %s with token %d", i+1, resp.Body, err, cfg.Variant, token)
		}
	}
	watch.stopAndCheck(t)
	final, finalToken := WaitStableLeader(t, fleet, electTimeout)
	if final != leader || finalToken != token {
		t.Errorf("after %d reloads %s leads with token %d, want %s with token %d", *benchReloads, final, finalToken, leader, token)
	}
	t.Logf("RESULT %d reloads of leader %s (POST /load until it answers): %s; leader and token after: %s %d (before: %s %d); connections Caddy dropped during the checks after a reload (retried): %d",
		*benchReloads, leader, failover.Summary(took), final, finalToken, leader, token, drops)
}
