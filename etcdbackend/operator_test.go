package etcdbackend

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
)

// TestReleasedOnlyWhenLeaseGone checks that a lease in its last second, which etcd reports
// with a remaining TTL of 0 because it truncates to whole seconds, does not count as
// released: the holder's own deadline may still be ahead. The check is an ordering: a lease
// that etcd still knows after Released answered was alive when Released answered.
func TestReleasedOnlyWhenLeaseGone(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	cluster := etcdtest.Start(t, 1)
	cli := cluster.Client(t)
	b := newTestBackend(t, cluster)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	checked := 0
	for attempt := 0; checked < 3 && attempt < 10; attempt++ {
		grant, err := cli.Grant(ctx, 2)
		if err != nil {
			t.Fatal(err)
		}
		for {
			ttl, err := cli.TimeToLive(ctx, grant.ID)
			if err != nil {
				t.Fatal(err)
			}
			if ttl.TTL <= 0 {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		released, _, err := b.Released(ctx, "rounding", 1, elector.LeaseID(grant.ID))
		if err != nil {
			t.Fatal(err)
		}
		after, err := cli.TimeToLive(ctx, grant.ID)
		if err != nil {
			t.Fatal(err)
		}
		if after.TTL == leaseGone {
			continue // expired meanwhile: this round proves nothing either way
		}
		checked++
		if released {
			t.Fatalf("Released said the lease was gone while etcd still knew it (remaining TTL %d)", after.TTL)
		}
	}
	if checked == 0 {
		t.Fatal("no lease could be checked in its last second")
	}
}

// TestOperatorRevokeNeverGivesTwoLeaders revokes the leader's lease, as `etcdctl lease
// revoke` does, while the leader's link to etcd is slow: the key vanishes at once, but the
// leader's own deadline is still ahead and it learns of the revocation only a slow round
// trip later. The follower that takes the key must not admit before the old leader has
// stopped: the fleet's watchdog fails the test if two ever admit at once, and the old
// leader's last admission must come before the new leader's first.
func TestOperatorRevokeNeverGivesTwoLeaders(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	cluster, f, leader, token := slowLeaderFleet(t, "slow-revoke", 300*time.Millisecond)
	const ttl = slowLeaderTTL
	cli := cluster.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, testPrefix+"slow-revoke")
	if err != nil || len(resp.Kvs) == 0 {
		t.Fatalf("reading the election key: %v (%d keys)", err, len(resp.Kvs))
	}
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()

	var oldLast time.Time
	deadline := time.Now().Add(3 * ttl)
	for {
		if leader.leading() {
			oldLast = time.Now()
		}
		for _, n := range f.others(leader) {
			if tok := n.election.Term().Token; n.leading() && tok > token {
				newFirst := time.Now()
				if !oldLast.IsZero() && !oldLast.Before(newFirst) {
					t.Fatalf("old leader admitted at %s, not before %s's first admission at %s", oldLast, n.id, newFirst)
				}
				if leader.leading() {
					t.Fatalf("%s leads term %d while the old leader %s still admits", n.id, tok, leader.id)
				}
				record(t, "failover after lease revoke", newFirst.Sub(revoked))
				return // the watchdog, at cleanup, says whether two ever admitted at once
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no new term after the lease was revoked")
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// slowLeaderTTL is the ttl of slowLeaderFleet: the slow link must not cost the leader its
// lease, so it is well above the slowed round trip.
const slowLeaderTTL = 5 * time.Second

// slowLeaderFleet starts three nodes in election on a 1-member etcd, waits for a leader,
// and delays that leader's link to etcd by delay each way.
func slowLeaderFleet(t *testing.T, election string, delay time.Duration) (*etcdtest.Cluster, *fleet, *node, int64) {
	t.Helper()
	cluster := etcdtest.Start(t, 1)
	f := startFleet(t, cluster, fleetOptions{size: 3, ttl: slowLeaderTTL, election: election})
	leader, token := f.waitLeader(slowLeaderTTL + 5*time.Second)
	for _, p := range leader.proxies {
		p.Delay(delay)
	}
	return cluster, f, leader, token
}

// TestTwinCandidatesKeepTheirEntries gives two processes one instance id, as a config
// mistake does: when one of them leaves (its lease revoked), the other is still listed as a
// candidate, so a transfer to that id still finds it.
func TestTwinCandidatesKeepTheirEntries(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	cluster := etcdtest.Start(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var leases []elector.LeaseID
	var backends []*Backend
	for range 2 {
		b := newTestBackend(t, cluster)
		id, _, err := b.Grant(ctx, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Announce(ctx, "twins", "twin", []byte("twin"), id); err != nil {
			t.Fatal(err)
		}
		leases, backends = append(leases, id), append(backends, b)
	}
	// The second announced last; it leaves.
	if err := backends[1].Revoke(ctx, leases[1]); err != nil {
		t.Fatal(err)
	}
	ids, err := backends[0].Candidates(ctx, "twins")
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 1 || ids[0].ID != "twin" {
		t.Fatalf("candidates %v after one twin left, want [twin]", ids)
	}
}

// TestFailedLeaveNeverCampaignsAgain lets an instance leave while its link to etcd is cut,
// so that the release fails but the lease survives; healed, the campaign loop lets go of
// the key, and the instance, which is leaving for good, must not take it again.
func TestFailedLeaveNeverCampaignsAgain(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	const ttl = 6 * time.Second
	cluster := etcdtest.Start(t, 1)
	f := startFleet(t, cluster, fleetOptions{size: 1, ttl: ttl, election: "failed-leave"})
	n, token := f.waitLeader(ttl + 5*time.Second)
	n.cut()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	err := n.cand.Leave(ctx)
	cancel()
	if err == nil {
		t.Fatal("leave succeeded over a cut link")
	}
	n.heal()
	waitFor(t, 2*ttl, "the key to be released after the heal", func() bool { return !n.election.Term().Holds() })
	watchFor := time.Now().Add(2 * time.Second)
	for time.Now().Before(watchFor) {
		if term := n.election.Term(); term.Holds() {
			t.Fatalf("the leaving instance holds the key again (token %d, was %d, reason %q)", term.Token, token, term.Reason)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestAcknowledgementsDoNotAccumulate resigns the leader several times: each resign leaves
// an acknowledgement for the successor, bound to the resigner's lease, which lives on. Once
// the successor admits it has read the acknowledgement, which must then be gone.
func TestAcknowledgementsDoNotAccumulate(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	const ttl = 5 * time.Second
	cluster := etcdtest.Start(t, 1)
	cli := cluster.Client(t)
	f := startFleet(t, cluster, fleetOptions{size: 2, ttl: ttl, election: "acks"})
	for range 3 {
		leader, _ := f.waitLeader(ttl + 5*time.Second)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := leader.election.Resign(ctx, 300*time.Millisecond); err != nil {
			cancel()
			t.Fatal(err)
		}
		_, tok, _ := f.waitNewLeader(leader, ttl)
		resp, err := cli.Get(ctx, testPrefix+"acks/released/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) > 0 {
			t.Fatalf("term %d admits while %d acknowledgements are left, first %s", tok, len(resp.Kvs), resp.Kvs[0].Key)
		}
	}
}

// TestClearedIntentsLeaveNoLease sets and clears intents as handovers do: each is set
// under a lease of its own, which must go with it.
func TestClearedIntentsLeaveNoLease(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	cluster := etcdtest.Start(t, 1)
	cli := cluster.Client(t)
	b := newTestBackend(t, cluster)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 3 {
		if err := b.SetIntent(ctx, "intents", []byte(`{"action":"resign"}`), time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := b.ClearIntent(ctx, "intents", nil); err != nil {
			t.Fatal(err)
		}
	}
	leases, err := cli.Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(leases.Leases) > 0 {
		t.Fatalf("%d intent leases left after the intents were cleared", len(leases.Leases))
	}
}

// newTestBackend is a Backend on cluster's members, closed at cleanup.
func newTestBackend(t *testing.T, cluster *etcdtest.Cluster) *Backend {
	t.Helper()
	b, err := New(Config{Endpoints: cluster.Endpoints(), Prefix: testPrefix, DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// TestDroppedElectionIsReleasedAfterAFailedRelease drops an election from a candidate (as
// a reload that removes it does) while the link to etcd is cut, so that the release fails
// while the lease, which the candidate keeps renewing for its other elections, survives.
// Once healed, the key must be let go: bound to a lease that lives on, it would otherwise
// keep every other instance out of the election for good.
func TestDroppedElectionIsReleasedAfterAFailedRelease(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	const ttl = 6 * time.Second
	cluster := etcdtest.Start(t, 1)
	cli := cluster.Client(t)
	f := startFleet(t, cluster, fleetOptions{size: 1, ttl: ttl, election: "dropped"})
	n, _ := f.waitLeader(ttl + 5*time.Second)
	n.cut()
	n.cand.Release(n.election) // blocks until the handover gives up
	if !keyExists(t, cli, testPrefix+"dropped") {
		t.Fatal("setup: the key went away although the link was cut")
	}
	n.heal()
	waitFor(t, 2*ttl, "the dropped election's key to be released", func() bool {
		return !keyExists(t, cli, testPrefix+"dropped")
	})
	if n.cand.LeaseRemaining() == 0 {
		t.Fatal("the candidate lost its lease: the key went with it, not by the release")
	}
}

func keyExists(t *testing.T, cli *clientv3.Client, key string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, key, clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count > 0
}

// TestShutdownIsAcknowledged closes the leader (a SIGTERM does the same): it lets go of the
// key and then revokes its lease at once. Its successor must still find the
// acknowledgement, rather than wait out the old leader's heartbeat deadline.
func TestShutdownIsAcknowledged(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	const ttl = 5 * time.Second
	cluster := etcdtest.Start(t, 1)
	f := startFleet(t, cluster, fleetOptions{size: 2, ttl: ttl, election: "shutdown-ack"})
	leader, _ := f.waitLeader(ttl + 5*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := leader.cand.Close(ctx); err != nil {
		t.Fatal(err)
	}
	successor, _, _ := f.waitNewLeader(leader, 2*ttl)
	if reason := successor.election.Term().Reason; reason != "elected" {
		t.Fatalf("successor began with reason %q: it did not see the acknowledgement", reason)
	}
}

// TestKeyDeletedWhileDrainingDoesNotStallTheSuccessor resigns the leader with a long
// hold-off while a request it admitted is still running, and deletes the key while it
// drains. A draining leader does not acknowledge a delete (its own release will), and its
// release then finds the key gone and acknowledges nothing; its lease lives on. The
// successor must not wait for an acknowledgement that never comes: it starts once the old
// leader's heartbeat deadline has passed.
func TestKeyDeletedWhileDrainingDoesNotStallTheSuccessor(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	const ttl = 3 * time.Second
	cluster := etcdtest.Start(t, 1)
	cli := cluster.Client(t)
	f := startFleet(t, cluster, fleetOptions{size: 2, ttl: ttl, election: "drain-delete"})
	leader, token := f.waitLeader(ttl + 5*time.Second)
	if _, ok := leader.election.Enter(); !ok {
		t.Fatal("setup: the leader does not admit")
	}
	resigned := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resigned <- leader.election.Resign(ctx, time.Hour)
	}()
	waitFor(t, ttl, "the leader to drain", func() bool { return leader.election.Term().Draining })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := cli.Delete(ctx, testPrefix+"drain-delete"); err != nil {
		t.Fatal(err)
	}
	successor, newToken, _ := f.waitNewLeader(leader, 3*ttl)
	if newToken <= token {
		t.Fatalf("successor %s leads with token %d, not above %d", successor.id, newToken, token)
	}
	leader.election.Exit()
	<-resigned
	if leader.cand.LeaseRemaining() == 0 {
		t.Fatal("the old leader lost its lease: the test did not show the stall it is about")
	}
}
