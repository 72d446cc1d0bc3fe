package e2e

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/etcdtest"
	"github.com/caddyleader/caddy-leader/internal/faultproxy"
	"github.com/caddyleader/caddy-leader/internal/fleet"
	"github.com/caddyleader/caddy-leader/internal/freeport"
)

// caddyBin is the Caddy binary TestMain built from l4/cmd/caddy.
var caddyBin string

func TestMain(m *testing.M) { os.Exit(runMain(m)) }

func runMain(m *testing.M) int {
	flag.Parse()
	if testing.Short() {
		return m.Run() // every test skips itself
	}
	dir, err := os.MkdirTemp("", "caddy-leader-l4-e2e-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
		return 1
	}
	defer os.RemoveAll(dir)
	caddyBin = filepath.Join(dir, "caddy")
	if err := fleet.BuildPackage(caddyBin, "github.com/caddyleader/caddy-leader/l4/cmd/caddy", os.Getenv("E2E_CADDY_RACE") == "1"); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
		return 1
	}
	return m.Run()
}

// node is one Caddy instance with the redis-server it fronts and the link to etcd that a
// test can cut.
type node struct {
	*fleet.Instance
	redis *redisServer
	link  *faultproxy.Proxy
	// proxyAddr is the gate whose followers hand connections to the leader; closeAddr the
	// gate whose followers close them.
	proxyAddr, closeAddr string
}

// startNodes starts etcd, and n instances with cfg (its HTTP options) each with its own redis-server, the layer-4
// gates in front of it (follower proxy and follower close), and a link to etcd of its own.
func startNodes(t *testing.T, n int, cfg fleet.Config) []*node {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end test: starts etcd, redis-server and Caddy processes; skipped with -short")
	}
	etcd := etcdtest.Start(t, 1)
	ports, err := freeport.Pick(3 * n)
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
			redis:     startRedis(t, ports[3*i]),
			link:      link,
			proxyAddr: fmt.Sprintf("127.0.0.1:%d", ports[3*i+1]),
			closeAddr: fmt.Sprintf("127.0.0.1:%d", ports[3*i+2]),
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

// layer4App is the node's caddy-l4 configuration: both gates in front of its redis-server.
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
	}}}
}

// waitFor polls cond until it holds, or fails t after within.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(fleet.PollInterval)
	}
}
