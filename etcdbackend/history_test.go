package etcdbackend

import (
	"context"
	"encoding/json"
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

// TestHistoryOfATermItsSuccessorNeverSaw: the sole leader stops (SIGTERM: it hands over to
// nobody), and an instance started after it wins. It never saw the term before its own;
// etcd names only its token and how it ended. The record keeps just that: no leader and no
// start, rather than an empty id and the zero time that pages showed as a start in year 1
// and a term of 2562047h.
func TestHistoryOfATermItsSuccessorNeverSaw(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	const ttl = time.Second
	cluster := etcdtest.Start(t, 1)
	o := fleetOptions{size: 1, ttl: ttl, election: "history-unseen"}
	f := startFleet(t, cluster, o)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	first, t1 := f.waitLeader(ttl + 5*time.Second)
	if err := first.cand.Close(ctx); err != nil {
		t.Fatal(err)
	}
	later := startNode(t, cluster, "later", o)
	var last elector.PastTerm
	for deadline := time.Now().Add(10 * time.Second); last.Token != t1; time.Sleep(20 * time.Millisecond) {
		list, err := later.election.History(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(list) > 0 {
			last = list[len(list)-1]
		}
		if time.Now().After(deadline) {
			t.Fatalf("the history %+v does not record term %d", list, t1)
		}
	}
	if last.Leader != "" || !last.Start.IsZero() || last.End.IsZero() || last.Ended != elector.EndedHandedOver || last.Successor != "later" {
		t.Errorf("recorded %+v: want no leader, no start, an end, handed over, successor later", last)
	}
	raw, err := cluster.Client(t).Get(ctx, testPrefix+o.election+"/history")
	if err != nil || len(raw.Kvs) != 1 {
		t.Fatalf("reading the history key: %v (%d keys)", err, len(raw.Kvs))
	}
	var entries [][]byte
	if err := json.Unmarshal(raw.Kvs[0].Value, &entries); err != nil {
		t.Fatal(err)
	}
	var stored map[string]any
	if err := json.Unmarshal(entries[len(entries)-1], &stored); err != nil {
		t.Fatal(err)
	}
	for _, field := range []string{"leader", "start"} {
		if v, ok := stored[field]; ok {
			t.Errorf("the stored record says %s %q, which etcd never told its writer", field, v)
		}
	}
}
