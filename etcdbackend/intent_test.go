package etcdbackend

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
)

// TestHandoverRequests covers resign and transfer asked of any instance: the request
// travels through etcd, not between the instances.
func TestHandoverRequests(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	const ttl = 2 * time.Second
	cluster := etcdtest.Start(t, 1)

	t.Run("transfer_asked_of_a_third_instance_hands_leadership_to_the_named_one", func(t *testing.T) {
		f := startFleet(t, cluster, fleetOptions{size: 3, ttl: ttl, election: "transfer"})
		leader, token := f.waitLeader(ttl + 5*time.Second)
		rest := f.others(leader)
		target, asker := rest[0], rest[1]
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if err := asker.election.Transfer(ctx, target.id, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		now, newToken := f.waitLeader(ttl + 5*time.Second)
		if now != target {
			t.Fatalf("%s leads after a transfer to %s", now.id, target.id)
		}
		if newToken <= token {
			t.Errorf("token %d after %d", newToken, token)
		}
		// The transfer is complete, so nobody stands aside any more: when the new
		// leader resigns, someone else takes over at once.
		if err := target.election.Resign(ctx, time.Minute); err != nil {
			t.Fatal(err)
		}
		next, _, _ := f.waitNewLeader(target, ttl)
		if next == target {
			t.Fatal("the resigned target still leads")
		}
	})

	t.Run("transfer_to_an_instance_that_is_not_a_candidate_fails_clearly", func(t *testing.T) {
		f := startFleet(t, cluster, fleetOptions{size: 2, ttl: ttl, election: "transfer-unknown"})
		leader, token := f.waitLeader(ttl + 5*time.Second)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err := f.others(leader)[0].election.Transfer(ctx, "nobody", 5*time.Second)
		if !errors.Is(err, elector.ErrNotCandidate) {
			t.Fatalf("err = %v, want ErrNotCandidate", err)
		}
		if now, tok := f.waitLeader(ttl); now != leader || tok != token {
			t.Errorf("a failed transfer changed leadership: %s token %d", now.id, tok)
		}
	})

	t.Run("resign_asked_of_a_follower_is_relayed_to_the_leader", func(t *testing.T) {
		f := startFleet(t, cluster, fleetOptions{size: 3, ttl: ttl, election: "relay"})
		leader, token := f.waitLeader(ttl + 5*time.Second)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		asked := time.Now()
		if err := f.others(leader)[0].election.RequestResign(ctx, time.Minute); err != nil {
			t.Fatal(err)
		}
		next, nextToken, at := f.waitNewLeader(leader, ttl)
		record(t, "failover after a resign relayed through etcd", at.Sub(asked))
		if nextToken <= token {
			t.Errorf("token %d after %d", nextToken, token)
		}
		if leader.leading() {
			t.Errorf("%s still leads after resigning (new leader %s)", leader.id, next.id)
		}
	})
}
