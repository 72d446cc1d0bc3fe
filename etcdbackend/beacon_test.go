package etcdbackend

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
)

// TestGroupedWatchesNeedNoGoroutineEach: the watches of a group's keys share the group's
// one stream, which hands each its changes without a goroutine of its own, so that a set
// of thousands of shards watches its keys with a fixed number of goroutines; and they
// still report, and end with their context.
func TestGroupedWatchesNeedNoGoroutineEach(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	cluster := etcdtest.Start(t, 1)
	b, err := New(Config{Endpoints: cluster.Endpoints(), Prefix: testPrefix, DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	b.GroupHeartbeats("rooms")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lease, _, err := b.Grant(ctx, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	campaign := func(election string) {
		t.Helper()
		if _, err := b.Campaign(ctx, election, []byte("holder"), lease); err != nil {
			t.Fatal(err)
		}
	}
	reported := func(ch <-chan elector.Observation, election string) {
		t.Helper()
		select {
		case o, ok := <-ch:
			if !ok || o.Err != nil || o.Holder == nil || o.Holder.Lease != lease {
				t.Fatalf("watch of %s reported %+v (open %v); want the campaign's holder", election, o, ok)
			}
		case <-ctx.Done():
			t.Fatalf("watch of %s reported nothing", election)
		}
	}
	seen, err := b.Observe(ctx, "rooms.0")
	if err != nil {
		t.Fatal(err)
	}
	watches, stop := context.WithCancel(ctx)
	first := b.WatchSeen(watches, "rooms.0", seen)
	campaign("rooms.0")
	reported(first, "rooms.0") // the stream runs, with every goroutine it needs

	const n = 500
	before := runtime.NumGoroutine()
	chans := make([]<-chan elector.Observation, n)
	for i := range chans {
		chans[i] = b.WatchSeen(watches, fmt.Sprintf("rooms.%d", i+1), seen)
	}
	if grown := runtime.NumGoroutine() - before; grown > n/10 {
		t.Fatalf("%d watches of the group's keys started %d goroutines; want them to share the stream's", n, grown)
	}
	campaign("rooms.7")
	reported(chans[6], "rooms.7")

	stop()
	for i, ch := range chans {
		select {
		case <-ch:
			for range ch {
			}
		case <-ctx.Done():
			t.Fatalf("watch of rooms.%d did not end with its context", i+1)
		}
	}
}
