package kubebackend

import (
	"context"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

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
