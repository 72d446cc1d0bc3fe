package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/fleet"
)

// writerCount is how many clients keep writing during the fault tests.
const writerCount = 6

// serviceLog reads what one node's service received, in arrival order, from position from.
type serviceLog func(t *testing.T, nd *node, from int) []entry

type stopper interface{ Stop() }

// fault is one fault injected into the leader.
type fault struct {
	name string
	// do injects the fault and returns how to undo it (nil: nothing), and whether the
	// leader is gone for good.
	do func(t *testing.T, l *node, others []*node) (undo func(), gone bool)
	// planned faults are timed: from the fault to the new leader's first write.
	planned bool
	// sameMayWin: the old leader may win the next term itself (the key deleted under it).
	sameMayWin bool
}

// keyDelete deletes the election key under the leader, as an operator might.
var keyDelete = fault{name: "key_delete", sameMayWin: true, do: func(t *testing.T, l *node, _ []*node) (func(), bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := l.etcd.Client(t).Delete(ctx, "/caddy-leader/default"); err != nil {
		t.Fatalf("deleting the election key: %v", err)
	}
	return nil, false
}}

var transfer = fault{name: "transfer", planned: true, do: func(t *testing.T, l *node, others []*node) (func(), bool) {
	resp, err := l.Admin(http.MethodPost, "/leader/default/transfer?to="+others[0].ID+"&timeout=10s", nil)
	if err != nil || resp.Status != http.StatusOK {
		t.Fatalf("transfer: %v %+v", err, resp)
	}
	return nil, false
}}

// allFaults are the faults of the safety suite, in an order that leaves one instance, with
// 4 transfers, or as many as L4_TRANSFERS says (to measure handovers).
func allFaults() []fault {
	transfers := 4
	if n, err := strconv.Atoi(os.Getenv("L4_TRANSFERS")); err == nil && n > 0 {
		transfers = n
	}
	faults := []fault{
		{"sigstop", func(t *testing.T, l *node, _ []*node) (func(), bool) { l.Stop(); return l.Cont, false }, false, false},
		{"store_cut", func(t *testing.T, l *node, _ []*node) (func(), bool) { l.link.Blackhole(); return l.link.Heal, false }, false, false},
		keyDelete,
	}
	for range transfers {
		faults = append(faults, transfer)
	}
	return append(faults,
		fault{"sigkill", func(t *testing.T, l *node, _ []*node) (func(), bool) { l.Kill(); return nil, true }, false, false},
		fault{"sigterm", func(t *testing.T, l *node, _ []*node) (func(), bool) { l.Term(); return nil, true }, true, false},
	)
}

// runFaults starts writers through the live nodes, injects each fault into the leader of
// the moment and checks the handover it causes (see checkHandover); it logs the planned
// handovers' times and returns which nodes led.
// kind is the connections' kind in the metrics (layer4, http): after a transfer, the old
// leader must have cut some.
func runFaults(t *testing.T, nodes []*node, faults []fault, log serviceLog, kind string, start func(alive func() []*node) stopper) map[*node]bool {
	t.Helper()
	var mu sync.Mutex
	alive := slices.Clone(nodes)
	w := start(func() []*node {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(alive)
	})
	defer w.Stop()
	length := func(nd *node) int { return len(log(t, nd, 0)) }
	led := map[*node]bool{}
	var handovers []time.Duration
	for i, f := range faults {
		t.Run(fmt.Sprintf("%d_%s", i, f.name), func(t *testing.T) {
			mu.Lock()
			fleetNow := slices.Clone(alive)
			mu.Unlock()
			leaderIn, token := fleet.WaitStableLeader(t, instances(fleetNow), electTimeout)
			l := byInstance(fleetNow, leaderIn)
			led[l] = true
			begin := length(l)
			waitFor(t, electTimeout, "writes reaching the leader's service", func() bool { return length(l) >= begin+20 })
			others := without(fleetNow, l)
			pos := map[*node]int{}
			for _, nd := range fleetNow {
				pos[nd] = length(nd)
			}
			cutBefore := connectionsCut(t, l, kind)
			at := time.Now()
			undo, gone := f.do(t, l, others)
			if gone {
				mu.Lock()
				alive = without(alive, l)
				mu.Unlock()
			}
			candidates := others
			if f.sameMayWin {
				candidates = fleetNow
			}
			newIn, _ := waitNewTerm(t, candidates, token)
			n := byInstance(candidates, newIn)
			led[n] = true
			waitFor(t, electTimeout, "writes reaching the new leader's service", func() bool { return length(n) >= pos[n]+20 })
			if undo != nil {
				undo()
			}
			if !gone {
				// The old leader is back (thawed, reconnected): whatever it still had
				// to relay, it has had the time to, once every member agrees again.
				fleet.WaitStableLeader(t, instances(fleetNow), electTimeout)
			}
			if n == l {
				// The same instance won the next term: its service cannot tell the two
				// terms' writes apart, so this step checks the cut (below) only.
				t.Logf("%s: %s won the next term too", f.name, l.ID)
				if cut := connectionsCut(t, l, kind) - cutBefore; cut == 0 {
					t.Errorf("%s: no connection of the ended term was cut", f.name)
				}
				return
			}
			first := checkHandover(t, fleetNow, l, n, pos, log)
			if !gone {
				cut := connectionsCut(t, l, kind) - cutBefore
				t.Logf("%s: the old leader cut %v connections", f.name, cut)
				if f.planned && cut == 0 {
					t.Errorf("%s: the old leader cut no connection, yet writers were connected", f.name)
				}
			}
			if f.planned {
				handovers = append(handovers, first.Sub(at))
				t.Logf("%s: first write relayed by the new leader %v after the fault", f.name, first.Sub(at))
				waitFor(t, 10*time.Second, "every writer reconnecting to the new leader", func() bool {
					return writersSeen(log(t, n, pos[n])) == writerCount
				})
			}
		})
		if t.Failed() {
			break
		}
	}
	if len(handovers) > 0 {
		sort.Slice(handovers, func(i, j int) bool { return handovers[i] < handovers[j] })
		p50, p99 := handovers[len(handovers)/2], handovers[len(handovers)-1]
		t.Logf("planned handovers (%d): fault to first write relayed by the new leader p50 %v, p99 (max) %v", len(handovers), p50, p99)
		if path := os.Getenv("L4_HANDOVER_REPORT"); path != "" {
			line := fmt.Sprintf("%s n=%d p50=%v p99=%v\n", t.Name(), len(handovers), p50, p99)
			f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
			if err == nil {
				_, _ = f.WriteString(line)
				f.Close()
			}
		}
	}
	return led
}

// waitNewTerm waits until the members agree on a leader of a term newer than token.
func waitNewTerm(t *testing.T, members []*node, token int64) (*fleet.Instance, int64) {
	t.Helper()
	deadline := time.Now().Add(electTimeout)
	for {
		in, got := fleet.WaitStableLeader(t, instances(members), electTimeout)
		if got > token {
			return in, got
		}
		if time.Now().After(deadline) {
			t.Fatalf("no term newer than %d within %v", token, electTimeout)
		}
		time.Sleep(fleet.PollInterval)
	}
}

// checkHandover checks one fault: since pos, the old leader l's service got no write after
// the first that the new leader n's service got, and no other service got any. It returns
// the time of that first write.
func checkHandover(t *testing.T, nodes []*node, l, n *node, pos map[*node]int, log serviceLog) time.Time {
	t.Helper()
	fresh := log(t, n, pos[n])
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
	for _, e := range log(t, l, pos[l]) {
		if !e.at.Before(first) {
			late = append(late, fmt.Sprintf("%s at +%v", e.tag, e.at.Sub(first)))
		}
	}
	if len(late) > 0 {
		t.Errorf("old leader %s's service got %d writes after the new leader %s's first: %s", l.ID, len(late), n.ID, strings.Join(late, ", "))
	}
	for _, nd := range nodes {
		if nd != l && nd != n {
			if got := len(log(t, nd, pos[nd])); got != 0 {
				t.Errorf("%s, neither the old nor the new leader, got %d writes", nd.ID, got)
			}
		}
	}
	return first
}
