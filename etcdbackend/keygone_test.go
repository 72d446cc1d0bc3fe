package etcdbackend

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
	fleetpkg "github.com/caddyleader/caddy-leader/internal/testkit/fleet"
)

// deafWatch is a Backend whose watches of election keys go silent once deaf is set: a
// watch whose events a loaded host has not delivered yet, or has lost.
type deafWatch struct {
	*Backend
	deaf atomic.Bool
}

func (d *deafWatch) Watch(ctx context.Context, election string, afterRev int64) <-chan elector.Observation {
	in := d.Backend.Watch(ctx, election, afterRev)
	out := make(chan elector.Observation)
	go func() {
		defer close(out)
		for o := range in {
			if d.deaf.Load() {
				continue
			}
			select {
			case out <- o:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// TestDeletedKeyEndsTermWithoutWatch deletes the leader's key by hand while the leader's
// watch shows it nothing. Its next heartbeat finds the key gone, and that must end the
// term: without it, the leader went on admitting until its heartbeat deadline, most of a
// TTL after the delete, and no successor could admit meanwhile.
func TestDeletedKeyEndsTermWithoutWatch(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	const ttl = 3 * time.Second
	cluster := etcdtest.Start(t, 1)
	cli := cluster.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := &deafWatch{Backend: newTestBackend(t, cluster)}
	_, es := fleetpkg.StartCandidate(t, elector.Config{ID: "a", URL: "http://a.test:8080", TTL: ttl, Backend: b, Logger: zaptest.NewLogger(t)}, "deaf")
	e := es[0]
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, ok := e.Check(); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a does not lead: %+v", e.Term())
		}
	}
	held := e.Term()
	b.deaf.Store(true)
	deleted := time.Now()
	if _, err := cli.Delete(ctx, b.Key("deaf")); err != nil {
		t.Fatal(err)
	}
	// Every Term published from here on, up to the first that is not the deleted one's.
	timeout := time.After(ttl)
	got := e.Term()
	for got.Token == held.Token {
		changed := e.Changed()
		if got = e.Term(); got.Token != held.Token {
			break
		}
		select {
		case <-changed:
			got = e.Term()
		case <-timeout:
			t.Fatalf("the term whose key was deleted still stands a ttl later: %+v", got)
		}
	}
	// Ended by the heartbeat's answer, not by its deadline running out.
	if got.Reason != "key deleted" {
		t.Fatalf("term ended %s after the delete with reason %q, want %q", time.Since(deleted).Round(time.Millisecond), got.Reason, "key deleted")
	}
	t.Logf("term ended %s after the delete", time.Since(deleted).Round(time.Millisecond))
}
