package etcdbackend

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
)

// TestPriority runs in-process candidates of different priorities against a real etcd.
func TestPriority(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	const ttl = time.Second
	cluster := etcdtest.Start(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	start := func(t *testing.T, election, id string, priority int, preempt bool) *node {
		return startNode(t, cluster, id, fleetOptions{ttl: ttl, election: election, priority: priority, preempt: preempt})
	}
	// waitRegistry waits until the registry lists want (id:priority:healthy, sorted by id)
	// in the view of each of nodes: what each consults when it yields.
	waitRegistry := func(t *testing.T, want string, nodes ...*node) {
		t.Helper()
		for _, n := range nodes {
			var got string
			for deadline := time.Now().Add(10 * time.Second); got != want; time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("%s's registry %q, want %q", n.id, got, want)
				}
				list, err := n.election.KnownCandidates(ctx)
				if err != nil {
					t.Fatal(err)
				}
				got = ""
				for _, c := range list {
					got += fmt.Sprintf("%s:%d:%v ", c.ID, c.Priority, c.Healthy)
				}
			}
		}
	}
	// waitLeads waits until n leads, failing if any of never ever holds the key meanwhile.
	waitLeads := func(t *testing.T, n *node, never ...*node) int64 {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			for _, o := range never {
				if o.election.Term().Holds() {
					t.Fatalf("%s holds the key: %+v", o.id, o.election.Term())
				}
			}
			if n.leading() {
				return n.election.Term().Token
			}
		}
		t.Fatalf("%s does not lead: %+v", n.id, n.election.Term())
		return 0
	}

	t.Run("priority_0_never_leads", func(t *testing.T) {
		never := start(t, "never", "never", elector.NeverLead, false)
		waitRegistry(t, "never:0:true ", never)
		// Alone with a vacant key, it only follows; once another candidate joins, that one
		// leads at its first campaign.
		if err := never.election.Resign(ctx, 0); err != nil { // a loop pass: it reads the vacant key
			t.Fatal(err)
		}
		a := start(t, "never", "a", 0, false)
		waitLeads(t, a, never)
		for deadline := time.Now().Add(10 * time.Second); never.election.Term().Leader.ID != "a"; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the priority 0 candidate does not follow a: %+v", never.election.Term())
			}
		}
		// The only other candidate resigns: the key stays vacant rather than go to never.
		if err := a.election.Resign(ctx, time.Minute); err != nil {
			t.Fatal(err)
		}
		b := start(t, "never", "b", 0, false)
		waitLeads(t, b, never)
		if err := a.election.Transfer(ctx, "never", ttl); err == nil {
			t.Error("a transfer to a candidate of priority 0 was accepted")
		}
	})

	t.Run("highest_priority_free_candidate_wins_a_vacancy", func(t *testing.T) {
		first := start(t, "vacancy", "first", 0, false)
		waitLeads(t, first)
		low := start(t, "vacancy", "low", 1, false)
		high := start(t, "vacancy", "high", 3, false)
		mid := start(t, "vacancy", "mid", 2, false)
		waitRegistry(t, "first:1:true high:3:true low:1:true mid:2:true ", first, low, high, mid)
		// Every follower sees the vacancy at once; the highest campaigns first.
		if err := first.election.Resign(ctx, time.Minute); err != nil {
			t.Fatal(err)
		}
		waitLeads(t, high, low, mid)
		// Resigned and held off, it is no longer healthy: the next highest wins.
		waitRegistry(t, "first:1:false high:3:true low:1:true mid:2:true ", low, mid)
		if err := high.election.Resign(ctx, time.Minute); err != nil {
			t.Fatal(err)
		}
		waitLeads(t, mid, low)
	})

	t.Run("preempt_transfers_gracefully", func(t *testing.T) {
		low := start(t, "preempt", "low", 1, false)
		t1 := waitLeads(t, low)
		high := start(t, "preempt", "high", 5, true)
		t2 := waitLeads(t, high)
		if t2 <= t1 {
			t.Fatalf("token %d after preemption is not above %d", t2, t1)
		}
		// Gracefully: the old leader said it stopped (no waiting out its deadline), and it
		// is not held off (it will take over again if high goes).
		var list []elector.PastTerm
		for deadline := time.Now().Add(10 * time.Second); len(list) == 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			var err error
			if list, err = low.election.History(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if got := describeHistory(list); got != fmt.Sprintf("%d:low:%s:high@%d", t1, elector.EndedTransferred, t2) {
			t.Errorf("history %q, want low's term transferred to high", got)
		}
		if !low.election.Healthy() {
			t.Error("the preempted leader is held off")
		}
		waitRegistry(t, "high:5:true low:1:true ", low)
	})
}
