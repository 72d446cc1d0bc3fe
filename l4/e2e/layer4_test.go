package e2e

import (
	"errors"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/fleet"
)

const electTimeout = 20 * time.Second

// TestFollowers: a follower's close gate closes a connection at once without a byte, its
// proxy gate hands the connection to the leader's service, and a follower's own service
// never gets a connection.
func TestFollowers(t *testing.T) {
	nodes := startNodes(t, 3, fleet.Config{})
	leader, _ := fleet.WaitStableLeader(t, instances(nodes), electTimeout)
	for _, nd := range nodes {
		if nd.Instance == leader {
			continue
		}
		t.Run(nd.ID+"_closes", func(t *testing.T) {
			c, err := net.Dial("tcp", nd.closeAddr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_, _ = c.Write([]byte("*1\r\n$4\r\nPING\r\n"))
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			n, err := c.Read(make([]byte, 64))
			var ne net.Error
			if n > 0 || errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("follower's close gate: read %d bytes, %v; want the connection closed at once", n, err)
			}
		})
		t.Run(nd.ID+"_hands_over_to_the_leader", func(t *testing.T) {
			c, err := dialRESP(nd.proxyAddr, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			tag := "via-" + nd.ID
			if _, err := c.do("EVAL", logScript, "0", tag); err != nil {
				t.Fatalf("a write through the follower's proxy gate: %v", err)
			}
			if !slices.ContainsFunc(byInstance(nodes, leader).redis.entries(t, 0), func(e entry) bool { return e.tag == tag }) {
				t.Fatalf("the write through follower %s did not reach the leader's service", nd.ID)
			}
		})
	}
	for _, nd := range nodes {
		if nd.Instance != leader {
			if got := nd.redis.relayedConns(t); got != 0 {
				t.Errorf("follower %s's service accepted %d connections; want none", nd.ID, got)
			}
		}
	}
}

// TestFaults runs writers through every instance's proxy gate while the leader is frozen,
// cut from etcd, asked to transfer, killed and shut down, and checks after each fault that
// the old leader's service got no write after the new leader's service got its first.
func TestFaults(t *testing.T) {
	nodes := startNodes(t, 3, fleet.Config{})
	led := runFaults(t, nodes, allFaults(), redisLog, "layer4", func(alive func() []*node) stopper {
		return startWriters(writerCount, func() []string {
			var addrs []string
			for _, nd := range alive() {
				addrs = append(addrs, nd.proxyAddr)
			}
			return addrs
		}, dialRedis)
	})
	for _, nd := range nodes {
		if !led[nd] {
			if got := nd.redis.relayedConns(t); got != 0 {
				t.Errorf("%s never led, yet its service accepted %d connections; want none", nd.ID, got)
			}
		}
	}
}

// redisLog reads a node's redis-server log.
func redisLog(t *testing.T, nd *node, from int) []entry { return nd.redis.entries(t, from) }

// writersSeen counts the writers with an entry in es.
func writersSeen(es []entry) int {
	seen := map[string]bool{}
	for _, e := range es {
		id, _, _ := strings.Cut(e.tag, ".")
		seen[id] = true
	}
	return len(seen)
}

func instances(nodes []*node) []*fleet.Instance {
	out := make([]*fleet.Instance, len(nodes))
	for i, nd := range nodes {
		out[i] = nd.Instance
	}
	return out
}

func byInstance(nodes []*node, in *fleet.Instance) *node {
	for _, nd := range nodes {
		if nd.Instance == in {
			return nd
		}
	}
	panic("no node for instance " + in.ID)
}

func without(nodes []*node, drop *node) []*node {
	var out []*node
	for _, nd := range nodes {
		if nd != drop {
			out = append(out, nd)
		}
	}
	return out
}
