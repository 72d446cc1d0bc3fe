package etcdbackend

import (
	"context"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
)

// TestReleasesShareAnAcknowledgementLease releases many keys at once, as a shutdown with a
// shard set does: their acknowledgements share one lease, which outlives the holder's TTL,
// and once an operator revokes that lease (taking the acknowledgements with it) the next
// release is acknowledged under a new one.
func TestReleasesShareAnAcknowledgementLease(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	const (
		ttl  = 2 * time.Second
		keys = 16
	)
	cluster := etcdtest.Start(t, 1)
	cli := cluster.Client(t)
	b := newTestBackend(t, cluster)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	holder, _, err := b.Grant(ctx, ttl)
	if err != nil {
		t.Fatal(err)
	}
	tokens := make([]int64, keys)
	for i := range tokens {
		obs, err := b.Campaign(ctx, ackElection(i), []byte(`{"id":"a"}`), holder)
		if err != nil || obs.Holder == nil || obs.Holder.Lease != holder {
			t.Fatalf("campaign %d: %+v, %v", i, obs, err)
		}
		tokens[i] = obs.Holder.Token
	}
	release := func(i int) error { return b.Release(ctx, ackElection(i), tokens[i], holder, elector.EndedHandedOver) }

	t.Run("released_together_under_one_lease", func(t *testing.T) {
		var wg sync.WaitGroup
		errs := make([]error, keys-1)
		for i := range keys - 1 {
			wg.Add(1)
			go func() { defer wg.Done(); errs[i] = release(i) }()
		}
		wg.Wait()
		leases := map[int64]bool{}
		for i := range keys - 1 {
			if errs[i] != nil {
				t.Fatalf("release %d: %v", i, errs[i])
			}
			leases[ackLeaseOf(t, cli, b, i, tokens[i])] = true
		}
		if len(leases) != 1 {
			t.Fatalf("%d acknowledgements put under %d leases, want one", keys-1, len(leases))
		}
		for id := range leases {
			left, err := cli.TimeToLive(ctx, clientv3.LeaseID(id))
			if err != nil {
				t.Fatal(err)
			}
			if time.Duration(left.TTL)*time.Second < ttl {
				t.Fatalf("the acknowledgements' lease has %ds left, less than the holder's ttl %v", left.TTL, ttl)
			}
		}
	})

	t.Run("revoked_lease_is_replaced", func(t *testing.T) {
		shared := ackLeaseOf(t, cli, b, 0, tokens[0])
		if _, err := cli.Revoke(ctx, clientv3.LeaseID(shared)); err != nil {
			t.Fatal(err)
		}
		last := keys - 1
		if err := release(last); err != nil {
			t.Fatalf("release after the operator revoked the acknowledgements' lease: %v", err)
		}
		if id := ackLeaseOf(t, cli, b, last, tokens[last]); id == shared {
			t.Fatalf("acknowledged under the revoked lease %x", id)
		}
		if resp, err := cli.Get(ctx, b.Key(ackElection(last))); err != nil || len(resp.Kvs) > 0 {
			t.Fatalf("the released key is still there (%v)", err)
		}
	})
}

// ackElection is the name of the i-th election of the test.
func ackElection(i int) string { return "acks-" + string(rune('a'+i)) }

// ackLeaseOf returns the lease of the acknowledgement of election i's term token, failing t
// if there is none.
func ackLeaseOf(t *testing.T, cli *clientv3.Client, b *Backend, i int, token int64) int64 {
	t.Helper()
	resp, err := cli.Get(context.Background(), b.releasedKey(ackElection(i), token))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 {
		t.Fatalf("no acknowledgement of election %s's term %d", ackElection(i), token)
	}
	return resp.Kvs[0].Lease
}
