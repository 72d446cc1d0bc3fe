//go:build unix

package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
)

// TestAdminAPI drives the admin endpoints of real instances, always through a follower:
// it passes resigns and transfers on through etcd.
func TestAdminAPI(t *testing.T) {
	needCaddy(t)
	etcd := etcdtest.Start(t, 1)
	fleet := StartFleet(t, 3, Config{Endpoints: etcd.Endpoints(), Variant: "v0"})
	leader, token := WaitStableLeader(t, fleet, electTimeout)
	rest := others(fleet, leader)

	t.Run("status_lists_the_election", func(t *testing.T) {
		resp, err := rest[0].Admin(http.MethodGet, "/leader/", nil)
		if err != nil || resp.Status != http.StatusOK {
			t.Fatalf("GET /leader/: %v %d", err, resp.Status)
		}
		for _, want := range []string{`"election":"default"`, `"role":"follower"`, `"leader_id":"` + leader.ID + `"`} {
			if !strings.Contains(resp.Body, want) {
				t.Errorf("GET /leader/ = %s, missing %s", resp.Body, want)
			}
		}
	})

	t.Run("transfer_to_an_unknown_instance_is_refused", func(t *testing.T) {
		resp, err := rest[0].Admin(http.MethodPost, "/leader/default/transfer?to=nobody", nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.Status != http.StatusBadRequest || !strings.Contains(resp.Body, "not a live candidate") {
			t.Errorf("transfer to nobody = %d %s, want 400 naming the problem", resp.Status, resp.Body)
		}
	})

	t.Run("transfer_sent_to_a_follower_moves_leadership_to_the_named_instance", func(t *testing.T) {
		target := rest[1]
		resp, err := rest[0].Admin(http.MethodPost, "/leader/default/transfer?to="+target.ID+"&timeout=10s", nil)
		if err != nil || resp.Status != http.StatusOK {
			t.Fatalf("transfer: %v %d %s", err, resp.Status, resp.Body)
		}
		now, newToken := WaitStableLeader(t, fleet, electTimeout)
		if now != target || newToken <= token {
			t.Fatalf("after the transfer %s leads with token %d, want %s with a token above %d", now, newToken, target, token)
		}
		leader, token = now, newToken
	})

	t.Run("resign_sent_to_a_follower_is_relayed_to_the_leader", func(t *testing.T) {
		follower := others(fleet, leader)[0]
		resp, err := follower.Admin(http.MethodPost, "/leader/default/resign?hold_off=30s", nil)
		if err != nil || resp.Status != http.StatusAccepted {
			t.Fatalf("resign through a follower: %v %d %s", err, resp.Status, resp.Body)
		}
		deadline := time.Now().Add(ttl + 3*time.Second)
		for {
			now, newToken := WaitStableLeader(t, fleet, electTimeout)
			if now != leader && newToken > token {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s still leads after a resign was relayed to it", leader)
			}
			time.Sleep(pollInterval)
		}
	})
}
