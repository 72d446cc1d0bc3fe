package e2e

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/fleet"
)

const electTimeout = 20 * time.Second

// TestFollowers: a follower's close gate closes a connection at once without a byte, its
// proxy gate hands the connection to the leader's service, and a follower's own service
// never gets a connection.
func TestFollowers(t *testing.T) {
	nodes := startNodes(t, 3)
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
	nodes := startNodes(t, 3)
	var mu sync.Mutex
	alive := slices.Clone(nodes)
	w := startWriters(6, func() []string {
		mu.Lock()
		defer mu.Unlock()
		addrs := make([]string, len(alive))
		for i, nd := range alive {
			addrs[i] = nd.proxyAddr
		}
		return addrs
	})
	defer w.Stop()
	led := map[*node]bool{}
	var handovers []time.Duration

	type fault struct {
		name string
		// do injects the fault into the leader and returns how to undo it (nil: nothing),
		// and whether the leader is gone for good.
		do func(t *testing.T, l *node, others []*node) (undo func(), gone bool)
		// planned faults are timed: from the fault to the new leader's first write.
		planned bool
	}
	transfer := fault{"transfer", func(t *testing.T, l *node, others []*node) (func(), bool) {
		resp, err := l.Admin(http.MethodPost, "/leader/default/transfer?to="+others[0].ID+"&timeout=10s", nil)
		if err != nil || resp.Status != http.StatusOK {
			t.Fatalf("transfer: %v %+v", err, resp)
		}
		return nil, false
	}, true}
	faults := []fault{
		{"sigstop", func(t *testing.T, l *node, _ []*node) (func(), bool) { l.Stop(); return l.Cont, false }, false},
		{"store_cut", func(t *testing.T, l *node, _ []*node) (func(), bool) { l.link.Blackhole(); return l.link.Heal, false }, false},
		transfer, transfer, transfer, transfer,
		{"sigkill", func(t *testing.T, l *node, _ []*node) (func(), bool) { l.Kill(); return nil, true }, false},
		{"sigterm", func(t *testing.T, l *node, _ []*node) (func(), bool) { l.Term(); return nil, true }, true},
	}
	for i, f := range faults {
		t.Run(fmt.Sprintf("%d_%s", i, f.name), func(t *testing.T) {
			mu.Lock()
			fleetNow := slices.Clone(alive)
			mu.Unlock()
			leaderIn, _ := fleet.WaitStableLeader(t, instances(fleetNow), electTimeout)
			l := byInstance(fleetNow, leaderIn)
			led[l] = true
			start := l.redis.length(t)
			waitFor(t, electTimeout, "writes reaching the leader's service", func() bool { return l.redis.length(t) >= start+20 })
			others := without(fleetNow, l)
			pos := map[*node]int{}
			for _, nd := range fleetNow {
				pos[nd] = nd.redis.length(t)
			}
			at := time.Now()
			undo, gone := f.do(t, l, others)
			if gone {
				mu.Lock()
				alive = without(alive, l)
				mu.Unlock()
			}
			newIn, _ := fleet.WaitStableLeader(t, instances(others), electTimeout)
			n := byInstance(others, newIn)
			led[n] = true
			waitFor(t, electTimeout, "writes reaching the new leader's service", func() bool { return n.redis.length(t) >= pos[n]+20 })
			if undo != nil {
				undo()
			}
			if !gone {
				// The old leader is back (thawed, reconnected): whatever it still had
				// to relay, it has had the time to, once every member agrees again.
				fleet.WaitStableLeader(t, instances(fleetNow), electTimeout)
			}
			first := checkHandover(t, nodes, l, n, pos)
			if f.planned {
				handovers = append(handovers, first.Sub(at))
				t.Logf("%s: first write relayed by the new leader %v after the fault", f.name, first.Sub(at))
				waitFor(t, 10*time.Second, "every writer reconnecting to the new leader", func() bool {
					return writersSeen(n.redis.entries(t, pos[n])) == 6
				})
			}
		})
		if t.Failed() {
			break
		}
	}
	w.Stop()
	for _, nd := range nodes {
		if !led[nd] {
			if got := nd.redis.relayedConns(t); got != 0 {
				t.Errorf("%s never led, yet its service accepted %d connections; want none", nd.ID, got)
			}
		}
	}
	if len(handovers) > 0 {
		sort.Slice(handovers, func(i, j int) bool { return handovers[i] < handovers[j] })
		p50, p99 := handovers[len(handovers)/2], handovers[len(handovers)-1]
		t.Logf("planned handovers (%d): fault to first byte relayed by the new leader p50 %v, p99 (max) %v", len(handovers), p50, p99)
		if path := os.Getenv("L4_HANDOVER_REPORT"); path != "" {
			_ = os.WriteFile(path, []byte(fmt.Sprintf("n=%d p50=%v p99=%v\n", len(handovers), p50, p99)), 0o644)
		}
	}
}

// checkHandover checks one fault: since pos, the old leader l's service got no write after
// the first that the new leader n's service got, and no other service got any. It returns
// the time of that first write.
func checkHandover(t *testing.T, nodes []*node, l, n *node, pos map[*node]int) time.Time {
	t.Helper()
	fresh := n.redis.entries(t, pos[n])
	if len(fresh) == 0 {
		t.Fatalf("the new leader %s's service got no write", n.ID)
	}
	first := fresh[0].at
	for _, e := range fresh {
		if e.at.Before(first) {
			first = e.at
		}
	}
	var late []string
	for _, e := range l.redis.entries(t, pos[l]) {
		if !e.at.Before(first) {
			late = append(late, fmt.Sprintf("%s at +%v", e.tag, e.at.Sub(first)))
		}
	}
	if len(late) > 0 {
		t.Errorf("old leader %s's service got %d writes after the new leader %s's first: %s", l.ID, len(late), n.ID, strings.Join(late, ", "))
	}
	for _, nd := range nodes {
		if nd == l || nd == n {
			continue
		}
		if _, ok := pos[nd]; ok {
			if got := nd.redis.length(t) - pos[nd]; got != 0 {
				t.Errorf("%s, neither the old nor the new leader, got %d writes", nd.ID, got)
			}
		}
	}
	return first
}

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
