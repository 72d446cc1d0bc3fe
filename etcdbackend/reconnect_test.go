package etcdbackend

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
)

// TestLeaseOutlivesAClusterRestart: etcd, restarted, extends every lease by its ttl, so a
// holder whose renewal gets through within a ttl of the restart keeps its lease (and, on
// failsafe, its term). After 20 s with the whole cluster down, gRPC's own reconnect backoff
// would make its next attempt up to about 10 s after the restart; the backend's paces it to
// half a second at most, well inside the ttl of 3 s used here.
func TestLeaseOutlivesAClusterRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	const ttl, outage = 3 * time.Second, 20 * time.Second
	cluster := etcdtest.Start(t, 1)
	b, err := New(Config{Endpoints: cluster.Endpoints(), Prefix: testPrefix, DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lease, _, err := b.Grant(ctx, ttl)
	if err != nil {
		t.Fatal(err)
	}

	cluster.Stop(t, 0)
	// Renew as a holder does (every ttl/3) while the cluster is down: every attempt fails
	// and the client's connection backs off.
	for end := time.Now().Add(outage); time.Now().Before(end); time.Sleep(ttl / 3) {
		rctx, cancel := context.WithTimeout(ctx, ttl/3)
		_, err := b.Renew(rctx, lease)
		cancel()
		if err == nil {
			t.Fatal("a renewal succeeded with the cluster down")
		}
	}
	cluster.Restart(t, 0)
	restarted := time.Now()

	for {
		rctx, cancel := context.WithTimeout(ctx, ttl/3)
		_, err := b.Renew(rctx, lease)
		cancel()
		switch {
		case err == nil:
			t.Logf("renewed %v after the restart", time.Since(restarted).Round(time.Millisecond))
			return
		case errors.Is(err, elector.ErrLeaseNotFound):
			t.Fatalf("the lease expired %v after the restart: the client did not get a renewal through within its ttl (%v)",
				time.Since(restarted).Round(time.Millisecond), ttl)
		case ctx.Err() != nil:
			t.Fatalf("no renewal went through within a minute: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
