package kubebackend

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordclient "k8s.io/client-go/kubernetes/typed/coordination/v1"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/kubernetes/internal/kubetest"
)

// TestBeaconExpireInFlight stops an Expire of a grouped key between its two requests (the
// beacon taken, the key not yet cleared) and sends the holder's heartbeat there: the
// beacon must not vouch for the key, so the heartbeat writes the key itself, and the
// Expire's clearing, conditional on the version it read, then fails. Were the beacon to
// count, the holder would have a heartbeat later than the follower's last sight of it, and
// the clearing would still succeed.
func TestBeaconExpireInFlight(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kube-apiserver")
	}
	srv := kubetest.Start(t, kubetest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := func() *Backend {
		b, err := New(Config{Kubeconfig: srv.Kubeconfig(t, "admin", "default", ""), Prefix: "inflight-"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		b.GroupHeartbeats("set")
		return b
	}
	holder, follower := client(), client()
	const election = "set.0"
	value := []byte("holder")
	lease, _, err := holder.Grant(ctx, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	won, err := holder.Campaign(ctx, election, value, lease)
	if err != nil || won.Holder == nil || won.Holder.Lease != lease {
		t.Fatalf("Campaign = %+v, %v; want a win", won.Holder, err)
	}
	holder.Watch(ctx, election, won.Revision) // a heartbeat is judged by the holder's watch
	seen, err := follower.Observe(ctx, election)
	if err != nil {
		t.Fatal(err)
	}
	watch := follower.Watch(ctx, election, seen.Revision)
	beat := func(what string) {
		t.Helper()
		if ok, err := holder.Update(ctx, election, won.Holder.Token, value); !ok || err != nil {
			t.Fatalf("%s = %v, %v; want true", what, ok, err)
		}
	}
	version := func() (*coordv1.Lease, int64) {
		t.Helper()
		_, obj, err := follower.read(ctx, election)
		if err != nil || obj == nil {
			t.Fatalf("reading the key: %v", err)
		}
		v, _ := parseRV(obj.ResourceVersion)
		return obj, v
	}
	beat("heartbeat")
	var last elector.Observation
	select {
	case last = <-watch:
	case <-ctx.Done():
		t.Fatal("the follower's watch reported no heartbeat")
	}
	obj, v := version()
	if last.Err != nil || last.Holder == nil || v >= last.Revision {
		t.Fatalf("the follower saw %+v and the key is at %d; want a beacon after the key", last, v)
	}

	// The Expire's first step, as of the beacon the follower saw last.
	if ok, err := follower.groupOf(election).holdBeacon(ctx, election, lease, v, last.Revision); !ok || err != nil {
		t.Fatalf("taking the beacon = %v, %v; want true", ok, err)
	}
	beat("heartbeat while an Expire is in flight")
	// The Expire's second step.
	if _, err := follower.vacate(ctx, obj); !apierrors.IsConflict(err) {
		t.Fatalf("clearing the key after the holder's heartbeat: %v; want a conflict (the beacon vouched for a key being expired)", err)
	}
	if o, err := follower.Observe(ctx, election); err != nil || o.Holder == nil || o.Holder.Token != won.Holder.Token {
		t.Fatalf("after the failed Expire: %+v, %v; want the key still held", o.Holder, err)
	}

	// The key has moved on past the Expire's entry: the beacon vouches for it again.
	_, before := version()
	beat("heartbeat after the failed Expire")
	if _, after := version(); after != before {
		t.Fatalf("the heartbeat after the failed Expire wrote the key (%d -> %d); want a beacon", before, after)
	}
}

// contendedLeases makes every write of a beacon fail, as a beacon that heartbeats and
// other followers' Expires keep writing would: before passing a create or an update on, it
// writes the object itself, so the API server answers that it exists already, or refuses
// the update's stale resourceVersion.
type contendedLeases struct {
	coordclient.LeaseInterface
	conflicts atomic.Int64
	// giveUp ends the test's context once far more conflicts than a bounded retry makes
	// have happened: without a bound the retry would go on until the context's deadline.
	giveUp context.CancelFunc
}

func (c *contendedLeases) Create(ctx context.Context, obj *coordv1.Lease, opts metav1.CreateOptions) (*coordv1.Lease, error) {
	if err := c.writeFirst(ctx, obj); err != nil {
		return nil, err
	}
	return c.LeaseInterface.Create(ctx, obj, opts)
}

func (c *contendedLeases) Update(ctx context.Context, obj *coordv1.Lease, opts metav1.UpdateOptions) (*coordv1.Lease, error) {
	if err := c.writeFirst(ctx, obj); err != nil {
		return nil, err
	}
	return c.LeaseInterface.Update(ctx, obj, opts)
}

// writeFirst writes obj, if it is a beacon, before the caller's write of it does.
func (c *contendedLeases) writeFirst(ctx context.Context, obj *coordv1.Lease) error {
	if !strings.Contains(obj.Name, "-beacon-") {
		return nil
	}
	n := c.conflicts.Add(1)
	if n > 10*holdTries {
		c.giveUp()
	}
	cur, err := c.LeaseInterface.Get(ctx, obj.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = c.LeaseInterface.Create(ctx, obj, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	cur.Annotations["test/touched"] = strconv.FormatInt(n, 10)
	_, err = c.LeaseInterface.Update(ctx, cur, metav1.UpdateOptions{})
	return err
}

// TestHoldBeaconGivesUpUnderContention: an Expire whose beacon write conflicts at every
// try gives up after holdTries with errBeaconContended, rather than retrying for as long
// as its context lasts; the elector's own retry of Expire decides when to look again.
func TestHoldBeaconGivesUpUnderContention(t *testing.T) {
	srv := kubetest.Start(t, kubetest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	follower, err := New(Config{Kubeconfig: srv.Kubeconfig(t, "admin", "default", ""), Prefix: "contended-"})
	if err != nil {
		t.Fatal(err)
	}
	defer follower.Close()
	follower.GroupHeartbeats("set")
	const election = "set.0"
	lease := elector.LeaseID(0x1ea5e)
	leases, err := follower.client()
	if err != nil {
		t.Fatal(err)
	}
	contended := &contendedLeases{LeaseInterface: leases, giveUp: cancel}
	follower.mu.Lock()
	follower.leases = contended
	follower.mu.Unlock()

	// Every beacon of the holder's is older than the follower's last sight of the key (a
	// revision beyond any): only the conflicts stop the Expire.
	ok, err := follower.groupOf(election).holdBeacon(ctx, election, lease, 1, math.MaxInt64)
	if ok || !errors.Is(err, errBeaconContended) {
		t.Fatalf("holdBeacon after %d conflicts = %v, %v; want false and %v", contended.conflicts.Load(), ok, err, errBeaconContended)
	}
	if n := contended.conflicts.Load(); n != holdTries {
		t.Fatalf("holdBeacon wrote the beacon %d times; want %d", n, holdTries)
	}
}

// TestPlainHeartbeatDoesNotQueueBehindASet: while a shard set's campaigns fill the general
// client's rate limit (hundreds of reads queued: seconds of them), a plain election's
// heartbeat, which writes its key, still gets through within a third of a ttl, on a client
// of its own. Queued behind the reads, it failed at once (the rate limiter would have
// passed its deadline), its term ended and the instance gave up its lease, and with it
// every shard it held.
func TestPlainHeartbeatDoesNotQueueBehindASet(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kube-apiserver")
	}
	srv := kubetest.Start(t, kubetest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := New(Config{Kubeconfig: srv.Kubeconfig(t, "admin", "default", ""), Prefix: "queued-"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	b.GroupHeartbeats("set")
	lease, _, err := b.Grant(ctx, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	value := []byte("plain")
	won, err := b.Campaign(ctx, "plain", value, lease)
	if err != nil || won.Holder == nil {
		t.Fatalf("Campaign = %+v, %v; want a win", won.Holder, err)
	}
	readers, rctx := 400, ctx // 400 reads at 50 a second: 6 s of them queued
	var started sync.WaitGroup
	for i := range readers {
		started.Add(1)
		go func() {
			started.Done()
			_, _ = b.Observe(rctx, "set."+strconv.Itoa(i))
		}()
	}
	started.Wait()
	time.Sleep(100 * time.Millisecond) // let them queue at the rate limiter
	bctx, bcancel := context.WithTimeout(ctx, 2*time.Second/3)
	defer bcancel()
	if ok, err := b.Update(bctx, "plain", won.Holder.Token, value); !ok || err != nil {
		t.Fatalf("heartbeat of a plain election behind a set's reads = %v, %v; want true", ok, err)
	}
}
