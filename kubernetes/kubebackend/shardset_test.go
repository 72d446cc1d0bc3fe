package kubebackend

import (
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/internal/testkit/fleet"
	"github.com/caddyleader/caddy-leader/kubernetes/internal/kubetest"
)

// TestShardSetStartKeepsLeases starts three instances in a shard set of 64 shards on a
// real kube-apiserver, each with the client rate limit the backend sets, and watches them
// for a while: no instance gives up its lease, and the shards get owners. A set's
// campaigns fill the client's rate limit at a start, and a heartbeat that writes its key
// (before the shard's watch is up, say) must not wait behind them: when it did, every
// instance missed a heartbeat deadline within half a minute, gave up its lease and every
// shard with it, and started over, again and again.
func TestShardSetStartKeepsLeases(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kube-apiserver")
	}
	const shards, window = 64, 40 * time.Second
	srv := kubetest.Start(t, kubetest.Options{})
	kubeconfig := srv.Kubeconfig(t, "admin", "default", "")
	warnings, logs := observer.New(zap.WarnLevel)
	var first []*elector.Election
	for i := range 3 {
		b, err := New(Config{Kubeconfig: kubeconfig, Prefix: "set64-"})
		if err != nil {
			t.Fatal(err)
		}
		id := fmt.Sprintf("node-%d", i)
		logger := zap.New(zapcore.NewTee(zaptest.NewLogger(t).Core(), warnings)).Named(id)
		_, es := fleet.StartShardCandidate(t, elector.Config{
			ID: id, URL: "http://" + id + ".test:8080", TTL: 2 * time.Second, DrainTimeout: time.Second,
			Backend: b, Logger: logger,
		}, "keys", shards, 4)
		if first == nil {
			first = es
		}
	}
	time.Sleep(window) // a window watched, not a condition awaited
	if lost := logs.FilterMessage("lease lost").Len(); lost > 0 {
		for _, e := range logs.FilterMessage("lease lost").All() {
			t.Errorf("%s: %v", e.Message, e.ContextMap())
		}
	}
	owned := 0
	for _, e := range first {
		if e.Term().Leader.ID != "" {
			owned++
		}
	}
	if owned < shards/2 {
		t.Errorf("node-0 sees an owner for %d of %d shards after %v", owned, shards, window)
	}
}
