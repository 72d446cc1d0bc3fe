//go:build unix

package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
	"github.com/caddyleader/caddy-leader/internal/testkit/faultproxy"
)

func TestEtcdFaults(t *testing.T) {
	needCaddy(t)

	for _, tc := range []struct {
		name   string
		victim func(raftLeader int) int
	}{
		// Losing a follower member costs the cluster no election: the fleet must not
		// notice beyond reconnecting.
		{"stopped_etcd_follower_member_changes_no_leadership", func(raftLeader int) int { return (raftLeader + 1) % 3 }},
		// A stopped raft leader hands raft leadership over first, and the new raft leader
		// extends every lease: the election must not notice either.
		{"stopped_etcd_raft_leader_member_changes_no_leadership", func(raftLeader int) int { return raftLeader }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			etcd := etcdtest.Start(t, 3)
			fleet := StartFleet(t, 3, Config{Endpoints: etcd.Endpoints(), Variant: "v0"})
			leader, token := WaitStableLeader(t, fleet, electTimeout)

			victim := tc.victim(etcd.LeaderIndex(t))
			watch := startTermWatch(fleet, leader, token)
			etcd.Stop(t, victim)
			time.Sleep(3 * ttl)
			watch.stopAndCheck(t)

			watch = startTermWatch(fleet, leader, token)
			etcd.Restart(t, victim)
			time.Sleep(ttl)
			watch.stopAndCheck(t)
		})
	}

	t.Run("etcd_unreachable_at_start_fails_closed_then_leads_after_heal", func(t *testing.T) {
		etcd := etcdtest.Start(t, 1)
		proxy, err := faultproxy.New(strings.TrimPrefix(etcd.Endpoint(0), "http://"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { proxy.Close() })
		proxy.Blackhole()

		// StartInstance returns only once the admin API and the HTTP port answer: a silent
		// etcd must not hold up Caddy's start.
		// No hold: with no leader known, a gated request would otherwise wait for one.
		in := StartInstance(t, "c0", Config{Endpoints: []string{proxy.URL()}, Variant: "v0", Hold: "0s"})
		end := time.Now().Add(ttl)
		checks := 0
		for checks == 0 || time.Now().Before(end) {
			checks++
			for _, path := range []string{"/gated", "/leader", "/health"} {
				resp, err := in.Get(path)
				if err != nil {
					t.Fatalf("GET %s with etcd unreachable: %v", path, err)
				}
				if resp.Status != http.StatusServiceUnavailable {
					t.Fatalf("GET %s with etcd unreachable = %d %q, want 503 (fail closed)", path, resp.Status, resp.Body)
				}
				if path == "/gated" && resp.Header.Get("Retry-After") == "" {
					t.Fatalf("GET /gated with etcd unreachable: 503 without Retry-After")
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Logf("%d checks over %v: /gated and /leader failed closed while etcd was unreachable", checks, ttl)

		healed := time.Now()
		proxy.Heal()
		// Alone, it leads as soon as a lease grant and a campaign get through: after at
		// most one dial timeout (5s by default) and one retry backoff (up to ttl).
		const within = 5*time.Second + ttl + 3*time.Second
		poller := StartPoller([]*Instance{in})
		defer poller.Stop()
		s := poller.WaitServed(t, within, "after the heal", func(Served) bool { return true })
		t.Logf("MEASURED leader after etcd became reachable: %v (token %d)", s.At.Sub(healed), s.Gated.Token)
		if resp, err := in.Get("/health"); err != nil || resp.Status != http.StatusOK {
			t.Errorf("GET /health once etcd answers: %v %d, want 200", err, resp.Status)
		}
	})
}
