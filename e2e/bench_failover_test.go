//go:build bench && unix

package e2e

// TestBenchFailover times failovers between real Caddy processes: from the signal to the
// leader (SIGTERM: graceful handover; SIGKILL: crash), or from the admin API request (a
// resign on the leader, a transfer asked of a follower), to the first gated request that
// another instance serves, over many trials and several ttls. See BENCHMARKS.md.
//
//	go test -tags bench -run TestBenchFailover -v -timeout 40m ./e2e
//	go test -tags bench -run 'TestBenchFailover/sigkill_ttl_10s' -v ./e2e -bench.trials 5
//	go test -tags bench -run TestBenchFailover -v ./e2e -bench.store postgres -bench.ttls 2s
//	go test -tags bench -run TestBenchFailover -v ./e2e -bench.ttls 2s -bench.trials 50 -bench.follower forward
//
// Each subtest runs its own 1-member etcd (or, with -bench.store postgres, its own
// PostgreSQL server) and a fleet of three instances. A trial waits
// until the fleet agrees on a leader, then for a random fraction of a renewal interval
// (ttl/3), so that faults land uniformly over the lease's renewal cycle; it starts the
// harness's Poller on the two others, strikes, and waits for the first 200 on /gated with
// a higher token (internal/testkit/failover, which the Kubernetes store's benchmark shares). A signalled instance is then replaced by a new process. The Poller
// pauses 1ms after every non-200 answer, so a takeover is seen up to about 1ms late: the
// times below are upper bounds by that much. With -bench.follower forward, every request
// to a follower is forwarded, and any answer other than 200 counts as a failed request.

import (
	"context"
	"flag"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
	"github.com/caddyleader/caddy-leader/internal/testkit/failover"
	"github.com/caddyleader/caddy-leader/internal/testkit/pgtest"
)

var (
	benchFlags = failover.RegisterFlags(flag.CommandLine)
	benchStore = flag.String("bench.store", "etcd", "the store the fleet elects through: etcd or postgres")
)

func TestBenchFailover(t *testing.T) {
	needCaddy(t)
	benchFlags.Run(t, func(t *testing.T, ttl time.Duration) failover.Setup {
		s := failover.Setup{Bin: caddyBin, Store: *benchStore}
		switch *benchStore {
		case "etcd":
			etcd := etcdtest.Start(t, 1)
			cli := etcd.Client(t)
			s.Config.Endpoints = etcd.Endpoints()
			s.WatchDeleted = func(ctx context.Context) func() time.Time {
				return watchKey(ctx, cli, electionKey).deletedAt
			}
		case "postgres":
			s.Config.Store = map[string]any{"module": "postgres", "dsn": pgtest.Start(t).DSN()}
		default:
			t.Fatalf("-bench.store %q: use etcd or postgres", *benchStore)
		}
		return s
	})
}

// keyEvents records when the election key was deleted and when it was created again,
// as etcd reports them to a watch from the test process.
type keyEvents struct {
	mu               sync.Mutex
	deleted, created time.Time
}

// watchKey records key's first delete and create from now on. It returns once etcd has
// registered the watch, so that no event after the call is missed.
func watchKey(ctx context.Context, cli *clientv3.Client, key string) *keyEvents {
	ev := &keyEvents{}
	ch := cli.Watch(ctx, key, clientv3.WithCreatedNotify())
	<-ch // the created notification (or the channel closed with ctx)
	go func() {
		for resp := range ch {
			now := time.Now()
			for _, e := range resp.Events {
				ev.mu.Lock()
				switch {
				case e.Type == clientv3.EventTypeDelete && ev.deleted.IsZero():
					ev.deleted = now
				case e.Type == clientv3.EventTypePut && e.IsCreate() && ev.created.IsZero():
					ev.created = now
				}
				ev.mu.Unlock()
			}
		}
	}()
	return ev
}

// deletedAt is when the key was first deleted; zero if it has not been.
func (ev *keyEvents) deletedAt() time.Time {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	return ev.deleted
}
