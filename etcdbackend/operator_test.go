package etcdbackend

import (
	"context"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/internal/etcdtest"
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
	b, err := New(Config{Endpoints: cluster.Endpoints(), Prefix: testPrefix, DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
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
		released, err := b.Released(ctx, "rounding", 1, elector.LeaseID(grant.ID))
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
