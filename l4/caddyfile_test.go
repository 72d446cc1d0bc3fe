package leaderl4

import (
	"sync/atomic"
	"testing"

	"github.com/caddyserver/caddy/v2"
	_ "github.com/mholt/caddy-l4"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddyleader/caddy-leader/internal/testkit/goldentest"
)

// TestCaddyfileAdapt runs the golden adapt tests in testdata/caddyfile_adapt: the JSON each
// Caddyfile adapts to, and the error of each error_* file, line number included.
// The recipe_* files are the recipes of docs/layer4.md, with the environment below.
func TestCaddyfileAdapt(t *testing.T) {
	t.Setenv("ETCD_ENDPOINTS", "10.0.0.11:2379 10.0.0.12:2379")
	t.Setenv("HOSTNAME", "node-a")
	t.Setenv("HOST_IP", "10.0.0.5")
	goldentest.RunDir(t, "testdata/caddyfile_adapt")
}

// TestGateCheck covers what only JSON can get wrong, field by field.
func TestGateCheck(t *testing.T) {
	hold := func(s string) *caddy.Duration {
		d, err := caddy.ParseDuration(s)
		if err != nil {
			t.Fatal(err)
		}
		v := caddy.Duration(d)
		return &v
	}
	for _, tt := range []struct {
		name string
		gate Gate
		want string
	}{
		{"follower_unknown", Gate{Follower: "reject", Hold: hold("1s")}, `layer4 leader_gate: follower: "reject" is not one of close, proxy`},
		{"advertise_without_port", Gate{Follower: FollowerProxy, Advertise: "10.0.0.5", Hold: hold("1s")}, `layer4 leader_gate: advertise: "10.0.0.5" is not a host:port`},
		{"upstream_without_port", Gate{Follower: FollowerClose, Upstream: "redis", Hold: hold("1s")}, `layer4 leader_gate: upstream: "redis" is not a host:port`},
		{"drain_negative", Gate{Follower: FollowerClose, Drain: -1, Hold: hold("1s")}, `layer4 leader_gate: drain: -1ns is negative`},
		{"hold_negative", Gate{Follower: FollowerClose, Hold: hold("-1s")}, `layer4 leader_gate: hold: -1s is negative`},
		{"placeholders_checked_when_used", Gate{Follower: FollowerProxy, Advertise: "{env.ADDR}", Upstream: "{env.UPSTREAM}", Hold: hold("1s")}, ""},
		{"proxy_without_advertise", Gate{Follower: FollowerProxy, Upstream: "127.0.0.1:6379", Hold: hold("1s")}, "layer4 leader_gate: follower proxy needs advertise <host:port>, the address at which peers reach this instance's layer-4 server: without it no follower learns where the leader is, and each closes every connection"},
		{"proxy_without_upstream", Gate{Follower: FollowerProxy, Advertise: "10.0.0.5:6380", Hold: hold("1s")}, "layer4 leader_gate: follower proxy needs upstream <host:port>, the local service that {l4.leader.dial} names on the leader: without it the leader's proxy {l4.leader.dial} dials nothing"},
		{"valid", Gate{Follower: FollowerProxy, Advertise: "10.0.0.5:6380", Upstream: "127.0.0.1:6379", Hold: hold("0s")}, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.gate.check()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tt.want != "" && (err == nil || err.Error() != tt.want):
				t.Fatalf("got %v, want %q", err, tt.want)
			}
		})
	}
}

// TestNoUpstreamWarnsOnce: on the leader of a gate without upstream, {l4.leader.dial} is
// empty, and the first connection that asks for it logs why, once.
func TestNoUpstreamWarnsOnce(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	g := &Gate{Election: "default", logger: zap.New(core), warnedNoUpstream: new(atomic.Bool)}
	for range 3 {
		repl := caddy.NewReplacer()
		repl.Map(g.noUpstream)
		if v, ok := repl.Get("l4.leader.dial"); !ok || v != "" {
			t.Fatalf("{l4.leader.dial} = %v, %v; want empty and known", v, ok)
		}
		if _, ok := repl.Get("l4.leader.other"); ok {
			t.Fatal("noUpstream answered another placeholder")
		}
	}
	if n := logs.FilterMessageSnippet("has no upstream").Len(); n != 1 {
		t.Errorf("%d warnings, want 1", n)
	}
}
