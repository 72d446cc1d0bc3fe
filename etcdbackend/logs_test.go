package etcdbackend

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
	"github.com/caddyleader/caddy-leader/internal/testkit/faultproxy"
)

// TestLogs checks what operators read: one INFO line per role change with the election,
// this instance, the leader, the token and the reason; etcd trouble as one WARN per
// outage however many requests fail, and one INFO when etcd answers again.
func TestLogs(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	cluster := etcdtest.Start(t, 1)
	proxy, err := faultproxy.New(hostPort(cluster.Endpoint(0)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	backend, err := New(Config{Endpoints: []string{proxy.URL()}, Prefix: testPrefix, DialTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.InfoLevel)
	cand, err := elector.NewCandidate(elector.Config{
		ID: "logger", URL: "http://logger.test", TTL: 2 * time.Second, DrainTimeout: time.Second,
		Backend: backend, Logger: zap.New(core),
	})
	if err != nil {
		t.Fatal(err)
	}
	failures := new(failureCounter)
	cand.SetObserver(failures)
	e := cand.Election("logs")
	cand.Start()
	e.Start()
	t.Cleanup(func() {
		proxy.Heal()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = cand.Close(ctx)
	})
	waitFor(t, 10*time.Second, "leadership", func() bool { _, ok := e.Check(); return ok })

	entry := func(msg string) observer.LoggedEntry {
		t.Helper()
		found := logs.FilterMessage(msg).All()
		if len(found) != 1 {
			t.Fatalf("%d %q lines, want 1: %v", len(found), msg, logs.All())
		}
		return found[0]
	}
	elected := entry("became leader").ContextMap()
	// The election is new: its first winner cannot name a term before it, so it waits a ttl.
	for key, want := range map[string]any{"election": "logs", "self": "logger", "leader": "logger", "reason": elector.ReasonUnseenWaitedOut} {
		if elected[key] != want {
			t.Errorf("became leader: %s = %v, want %v", key, elected[key], want)
		}
	}
	if tok, _ := elected["token"].(int64); tok <= 0 {
		t.Errorf("became leader: token = %v", elected["token"])
	}

	// Cut etcd off until the lease lapses and many more requests have failed, none of
	// which may log again.
	proxy.Blackhole()
	waitFor(t, 10*time.Second, "stepping down", func() bool { return logs.FilterMessage("stepped down").Len() == 1 })
	failedBefore := failures.Load()
	waitFor(t, 30*time.Second, "more failed etcd requests", func() bool { return failures.Load() >= failedBefore+5 })
	proxy.Heal()
	waitFor(t, 15*time.Second, "store reachable again", func() bool { return logs.FilterMessage("store reachable again").Len() >= 1 })

	if n := logs.FilterMessageSnippet("store request failing").FilterLevelExact(zapcore.WarnLevel).Len(); n != 1 {
		t.Errorf("%d WARN lines for one etcd outage, want 1", n)
	}
	down := entry("stepped down").ContextMap()
	if down["reason"] != "lease lost" && down["reason"] != "store unreachable" {
		t.Errorf("stepped down: reason = %v", down["reason"])
	}
}

func waitFor(t *testing.T, within time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %s", what, within)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// failureCounter counts the failed etcd requests a candidate reports: all of them, and
// the campaign loop's reads and watches of the key apart.
type failureCounter struct {
	atomic.Int64
	campaign atomic.Int64
}

func (*failureCounter) TermChanged(*elector.Election, *elector.Term, *elector.Term) {}

func (f *failureCounter) StoreFailed(op string, _ error) {
	f.Add(1)
	if op == "campaign" {
		f.campaign.Add(1)
	}
}
