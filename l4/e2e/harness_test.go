package e2e

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
	"github.com/caddyleader/caddy-leader/internal/testkit/faultproxy"
	"github.com/caddyleader/caddy-leader/internal/testkit/fleet"
	"github.com/caddyleader/caddy-leader/internal/testkit/freeport"
)

// caddyBin is the Caddy binary TestMain built from l4/cmd/caddy.
var caddyBin string

func TestMain(m *testing.M) { os.Exit(runMain(m)) }

func runMain(m *testing.M) int {
	return fleet.MainWithCaddy(m, "github.com/caddyleader/caddy-leader/l4/cmd/caddy", &caddyBin)
}

// node is one Caddy instance with the redis-server it fronts and the link to etcd that a
// test can cut.
type node struct {
	*fleet.Instance
	redis *redisServer
	link  *faultproxy.Proxy
	etcd  *etcdtest.Cluster // the fleet's store, shared
	// proxyAddr is the gate whose followers hand connections to the leader; closeAddr the
	// gate whose followers close them; plainAddr caddy-l4's proxy to the service without a
	// gate, the reference of the benchmarks.
	proxyAddr, closeAddr, plainAddr string
}

// startNodes starts etcd, and n instances with cfg (its HTTP options) each with its own redis-server, the layer-4
// gates in front of it (follower proxy and follower close), and a link to etcd of its own.
func startNodes(t testing.TB, n int, cfg fleet.Config) []*node {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end test: starts etcd, redis-server and Caddy processes; skipped with -short")
	}
	etcd := etcdtest.Start(t, 1)
	ports, err := freeport.Pick(4 * n)
	if err != nil {
		t.Fatal(err)
	}
	nodes := make([]*node, n)
	byID := map[string]*node{}
	endpoints := map[string][]string{}
	for i := range nodes {
		id := fmt.Sprintf("c%d", i)
		link, err := faultproxy.New(strings.TrimPrefix(etcd.Endpoint(0), "http://"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { link.Close() })
		nd := &node{
			redis:     startRedis(t, ports[4*i]),
			link:      link,
			etcd:      etcd,
			proxyAddr: fmt.Sprintf("127.0.0.1:%d", ports[4*i+1]),
			closeAddr: fmt.Sprintf("127.0.0.1:%d", ports[4*i+2]),
			plainAddr: fmt.Sprintf("127.0.0.1:%d", ports[4*i+3]),
		}
		nodes[i], byID[id], endpoints[id] = nd, nd, []string{link.URL()}
	}
	cfg.InstanceEndpoints = endpoints
	cfg.DrainTimeout = "5s"
	cfg.Apps = func(in *fleet.Instance) map[string]any { return byID[in.ID].layer4App() }
	for i, nd := range nodes {
		nd.Instance = fleet.StartInstance(t, caddyBin, fmt.Sprintf("c%d", i), cfg)
	}
	return nodes
}

// layer4App is the node's caddy-l4 configuration: both gates, and a plain proxy, in front
// of its redis-server.
func (nd *node) layer4App() map[string]any {
	proxy := func(dial string) map[string]any {
		return map[string]any{"handler": "proxy", "upstreams": []map[string]any{{"dial": []string{dial}}}}
	}
	server := func(listen string, handle ...map[string]any) map[string]any {
		return map[string]any{"listen": []string{listen}, "routes": []map[string]any{{"handle": handle}}}
	}
	return map[string]any{"layer4": map[string]any{"servers": map[string]any{
		"proxy": server(nd.proxyAddr,
			map[string]any{"handler": "leader_gate", "follower": "proxy", "advertise": nd.proxyAddr, "upstream": nd.redis.addr},
			proxy("{l4.leader.dial}")),
		"close": server(nd.closeAddr,
			map[string]any{"handler": "leader_gate", "follower": "close", "hold": "0s"},
			proxy(nd.redis.addr)),
		"plain": server(nd.plainAddr, proxy(nd.redis.addr)),
	}}}
}

// waitFor polls cond until it holds, or fails t after within.
func waitFor(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(fleet.PollInterval)
	}
}
