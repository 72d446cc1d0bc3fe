package etcdbackend

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
)

// TestHistoryOfTerms runs a fleet through a handover and a failover and checks that every
// instance reads the same history of ended terms from etcd, with how each one ended: the
// resign in the resigning leader's own word, the cut-off leader's end without a word.
func TestHistoryOfTerms(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	const ttl = time.Second
	cluster := etcdtest.Start(t, 1)
	f := startFleet(t, cluster, fleetOptions{size: 3, ttl: ttl, election: "history"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// waitHistory polls each reader until its history is want (a successor records the
	// term it ended once its own term settles, so the entry lands shortly after it leads).
	waitHistory := func(want string, readers ...*node) {
		t.Helper()
		for _, n := range readers {
			var got string
			for deadline := time.Now().Add(10 * time.Second); ; {
				list, err := n.election.History(ctx)
				if err != nil {
					t.Fatalf("%s: History: %v", n.id, err)
				}
				got = describeHistory(list)
				if got == want {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s reads the history %q, want %q", n.id, got, want)
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
	}

	first, t1 := f.waitLeader(ttl + 5*time.Second)
	if err := first.election.Resign(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	second, t2 := f.waitLeader(2*ttl+5*time.Second, f.others(first)...)
	resigned := fmt.Sprintf("%d:%s:%s:%s@%d", t1, first.id, elector.EndedResigned, second.id, t2)
	waitHistory(resigned, f.nodes...)

	// Cut off, the second leader cannot say it stopped: the third waits out its deadline.
	second.cut()
	var third *node
	for _, n := range f.nodes {
		if n != first && n != second {
			third = n
		}
	}
	_, t3 := f.waitLeader(3*ttl+5*time.Second, third)
	crashed := fmt.Sprintf("%d:%s:%s:%s@%d", t2, second.id, elector.EndedCrashed, third.id, t3)
	waitHistory(resigned+" "+crashed, first, third)

	list, err := third.election.History(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range list {
		if p.URL != "http://"+p.Leader+".test:8080" || p.Start.IsZero() || p.End.Before(p.Start) {
			t.Errorf("history entry %+v: want the leader's URL, a start, and an end after it", p)
		}
	}
}

func describeHistory(list []elector.PastTerm) string {
	s := ""
	for i, p := range list {
		if i > 0 {
			s += " "
		}
		s += fmt.Sprintf("%d:%s:%s:%s@%d", p.Token, p.Leader, p.Ended, p.Successor, p.SuccessorToken)
	}
	return s
}
