package etcdbackend

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/elector/electortest"
	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
	"github.com/caddyleader/caddy-leader/internal/testkit/faultproxy"
	fleetpkg "github.com/caddyleader/caddy-leader/internal/testkit/fleet"
)

const testPrefix = "/caddy-leader-test/"

// node is one candidate in a test fleet, reaching etcd through its own fault proxy so that
// its link can be cut without touching the others.
type node struct {
	id       string
	cand     *elector.Candidate
	election *elector.Election
	proxies  []*faultproxy.Proxy
}

func (n *node) cut() {
	for _, p := range n.proxies {
		p.Blackhole()
	}
}

func (n *node) heal() {
	for _, p := range n.proxies {
		p.Heal()
	}
}

func (n *node) leading() bool {
	_, ok := n.election.Check()
	return ok
}

// fleet is a set of nodes in one election plus a watchdog that fails the test if two of
// them ever admit at the same moment.
type fleet struct {
	t     *testing.T
	nodes []*node
	stop  chan struct{}
	done  chan struct{}
	// overlaps counts watchdog samples in which two nodes admitted at once.
	overlaps atomic.Int64
}

type fleetOptions struct {
	size     int
	ttl      time.Duration
	election string
	ids      []string // instance ids; default node-0, node-1, ...
	// priority and preempt go to each node's elector.Config.
	priority int
	preempt  bool
	// logs, if set, also receives every node's log, its backend's included; each node's
	// entries are named by its id.
	logs zapcore.Core
}

func startFleet(t *testing.T, cluster *etcdtest.Cluster, o fleetOptions) *fleet {
	t.Helper()
	if o.election == "" {
		o.election = "default"
	}
	f := &fleet{t: t, stop: make(chan struct{}), done: make(chan struct{})}
	for i := range o.size {
		id := fmt.Sprintf("node-%d", i)
		if i < len(o.ids) {
			id = o.ids[i]
		}
		f.nodes = append(f.nodes, startNode(t, cluster, id, o))
	}
	go f.watchdog()
	t.Cleanup(func() {
		close(f.stop)
		<-f.done
		if n := f.overlaps.Load(); n > 0 {
			t.Errorf("double leadership: %d samples in which two nodes admitted at once", n)
		}
	})
	return f
}

func startNode(t *testing.T, cluster *etcdtest.Cluster, id string, o fleetOptions) *node {
	t.Helper()
	n := &node{id: id}
	var endpoints []string
	for _, ep := range cluster.Endpoints() {
		p, err := faultproxy.New(hostPort(ep))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		n.proxies = append(n.proxies, p)
		endpoints = append(endpoints, p.URL())
	}
	logger := zaptest.NewLogger(t)
	if o.logs != nil {
		logger = zap.New(zapcore.NewTee(logger.Core(), o.logs))
	}
	logger = logger.Named(id)
	backend, err := New(Config{Endpoints: endpoints, Prefix: testPrefix, DialTimeout: 2 * time.Second, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	cands, es := fleetpkg.StartCandidate(t, elector.Config{
		ID:           id,
		URL:          "http://" + id + ".test:8080",
		TTL:          o.ttl,
		DrainTimeout: 2 * time.Second,
		Backend:      backend,
		Logger:       logger,
		Priority:     o.priority,
		Preempt:      o.preempt,
	}, o.election)
	n.cand, n.election = cands, es[0]
	t.Cleanup(n.heal) // before the candidate closes: cleanups run last first
	return n
}

func hostPort(url string) string {
	const scheme = "http://"
	return url[len(scheme):]
}

// watchdog samples every node's admission decision as fast as it can and counts samples in
// which more than one node would admit a gated request.
func (f *fleet) watchdog() {
	defer close(f.done)
	prev := f.sample()
	for {
		select {
		case <-f.stop:
			return
		default:
		}
		next := f.sample()
		if electortest.Overlapped(prev, next) {
			f.overlaps.Add(1)
		}
		prev = next
		time.Sleep(200 * time.Microsecond)
	}
}

// sample reads every node once, in order.
func (f *fleet) sample() []electortest.Sample {
	s := make([]electortest.Sample, len(f.nodes))
	for i, n := range f.nodes {
		s[i] = electortest.SampleOf(n.election)
	}
	return s
}

// waitLeader waits until exactly one of nodes leads and every one of them names it, and
// returns it with its token.
func (f *fleet) waitLeader(within time.Duration, nodes ...*node) (*node, int64) {
	f.t.Helper()
	if len(nodes) == 0 {
		nodes = f.nodes
	}
	elections := make([]*elector.Election, len(nodes))
	for i, n := range nodes {
		elections[i] = n.election
	}
	i, token := fleetpkg.WaitAgreed(f.t, within, elections)
	return nodes[i], token
}

// waitNewLeader waits for a leader among nodes other than old, and returns when it was
// first seen leading.
func (f *fleet) waitNewLeader(old *node, within time.Duration) (*node, int64, time.Time) {
	f.t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		for _, n := range f.nodes {
			if n != old && n.leading() {
				return n, n.election.Term().Token, time.Now()
			}
		}
		time.Sleep(time.Millisecond)
	}
	f.t.Fatalf("no new leader within %s", within)
	return nil, 0, time.Time{}
}

func (f *fleet) others(leader *node) []*node {
	var rest []*node
	for _, n := range f.nodes {
		if n != leader {
			rest = append(rest, n)
		}
	}
	return rest
}

// failoverLog collects measured failover times so the test log reports them together.
var failoverLog sync.Map

func record(t *testing.T, what string, d time.Duration) {
	t.Logf("measured %s: %s", what, d.Round(time.Millisecond))
	failoverLog.Store(t.Name()+"/"+what, d)
}

func TestElection(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd clusters")
	}
	for _, members := range []int{1, 3} {
		t.Run(fmt.Sprintf("%d_member_etcd", members), func(t *testing.T) {
			cluster := etcdtest.Start(t, members)
			testElectionScenarios(t, cluster)
		})
	}
}

func testElectionScenarios(t *testing.T, cluster *etcdtest.Cluster) {
	const ttl = 2 * time.Second

	t.Run("exactly_one_leader_and_followers_know_it", func(t *testing.T) {
		f := startFleet(t, cluster, fleetOptions{size: 3, ttl: ttl, election: "one"})
		leader, token := f.waitLeader(ttl + 5*time.Second)
		if token <= 0 {
			t.Fatalf("token = %d, want > 0", token)
		}
		for _, n := range f.others(leader) {
			term := n.election.Term()
			if term.Leader.URL != "http://"+leader.id+".test:8080" {
				t.Errorf("%s sees leader URL %q", n.id, term.Leader.URL)
			}
			if term.Holds() {
				t.Errorf("%s holds the key but is not the leader", n.id)
			}
		}
	})

	t.Run("crashed_leader_is_replaced_after_its_lease_expires", func(t *testing.T) {
		f := startFleet(t, cluster, fleetOptions{size: 3, ttl: ttl, election: "crash"})
		leader, token := f.waitLeader(ttl + 5*time.Second)
		// A leader that is cut off for good is, to the fleet, a crashed one.
		cutAt := time.Now()
		leader.cut()
		next, nextToken, at := f.waitNewLeader(leader, ttl+3*time.Second)
		record(t, "failover after crash", at.Sub(cutAt))
		if nextToken <= token {
			t.Errorf("new token %d is not above old token %d", nextToken, token)
		}
		if next == leader {
			t.Fatal("the crashed node leads again")
		}
	})

	t.Run("resign_hands_over_without_waiting_for_the_ttl", func(t *testing.T) {
		f := startFleet(t, cluster, fleetOptions{size: 3, ttl: ttl, election: "resign"})
		leader, token := f.waitLeader(ttl + 5*time.Second)
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := leader.election.Resign(ctx, time.Minute); err != nil {
			t.Fatal(err)
		}
		_, nextToken, at := f.waitNewLeader(leader, ttl)
		record(t, "failover after resign", at.Sub(start))
		if nextToken <= token {
			t.Errorf("new token %d is not above old token %d", nextToken, token)
		}
		if leader.leading() || leader.election.Term().Holds() {
			t.Error("the resigned node still leads")
		}
	})

	t.Run("leader_cut_off_from_etcd_stops_admitting_before_anyone_else_leads", func(t *testing.T) {
		f := startFleet(t, cluster, fleetOptions{size: 3, ttl: ttl, election: "cut"})
		leader, token := f.waitLeader(ttl + 5*time.Second)
		leader.cut()
		var stoppedAt time.Time
		deadline := time.Now().Add(ttl + time.Second)
		for leader.leading() {
			if time.Now().After(deadline) {
				t.Fatal("the cut-off leader still admits after its ttl")
			}
			time.Sleep(100 * time.Microsecond)
		}
		stoppedAt = time.Now()
		next, nextToken, at := f.waitNewLeader(leader, ttl+3*time.Second)
		if !stoppedAt.Before(at) {
			t.Fatalf("old leader stopped admitting at %s, after %s started leading at %s", stoppedAt, next.id, at)
		}
		record(t, "gap between old leader stopping and new leader starting", at.Sub(stoppedAt))
		if nextToken <= token {
			t.Errorf("new token %d is not above old token %d", nextToken, token)
		}
		// Healed, the old leader learns the new one and stays a follower.
		leader.heal()
		f.waitLeader(ttl + 5*time.Second)
		if leader.leading() {
			t.Error("the healed node took leadership back")
		}
	})

	t.Run("key_deleted_by_an_operator_makes_the_leader_step_down_and_a_new_term_start", func(t *testing.T) {
		f := startFleet(t, cluster, fleetOptions{size: 3, ttl: ttl, election: "deleted"})
		leader, token := f.waitLeader(ttl + 5*time.Second)
		cli := cluster.Client(t)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := cli.Delete(ctx, testPrefix+"deleted"); err != nil {
			t.Fatal(err)
		}
		// Whoever wins the new race, it is a new term with a higher token, well before
		// any lease could have expired.
		deadline := time.Now().Add(ttl / 2)
		for {
			_, tok := f.waitLeader(ttl)
			if tok > token {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("still token %d half a ttl after the key was deleted (leader %s)", tok, leader.id)
			}
			time.Sleep(5 * time.Millisecond)
		}
	})

	t.Run("tokens_strictly_increase_over_successive_terms", func(t *testing.T) {
		f := startFleet(t, cluster, fleetOptions{size: 3, ttl: ttl, election: "tokens"})
		_, last := f.waitLeader(ttl + 5*time.Second)
		for range 4 {
			leader, _ := f.waitLeader(ttl + 5*time.Second)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := leader.election.Resign(ctx, 500*time.Millisecond); err != nil {
				cancel()
				t.Fatal(err)
			}
			cancel()
			_, tok, _ := f.waitNewLeader(leader, ttl)
			if tok <= last {
				t.Fatalf("token %d after token %d", tok, last)
			}
			last = tok
		}
	})

	t.Run("two_processes_with_one_instance_id_never_both_lead", func(t *testing.T) {
		f := startFleet(t, cluster, fleetOptions{size: 2, ttl: ttl, election: "sameid", ids: []string{"twin", "twin"}})
		leader, _ := f.waitLeader(ttl + 5*time.Second)
		other := f.others(leader)[0]
		if other.election.Term().Holds() {
			t.Fatal("both twins hold the key")
		}
	})

	// A follower cut off from etcd by a silent link (its watch does not fail for many
	// seconds) keeps the leader it last saw while its own lease is valid, as a brief outage
	// warrants, and forgets it once the lease lapses, so that it stops redirecting and
	// forwarding to a leader it can no longer vouch for. Healed, it sees the same term again.
	t.Run("cut_off_follower_forgets_the_leader_when_its_own_lease_lapses", func(t *testing.T) {
		f := startFleet(t, cluster, fleetOptions{size: 2, ttl: ttl, election: "cut-follower"})
		leader, token := f.waitLeader(ttl + 5*time.Second)
		follower := f.others(leader)[0]

		failures := new(failureCounter)
		follower.cand.SetObserver(failures)
		follower.cut()
		// No renewal gets through any more, so the lease deadline stays where it is now.
		leaseDeadline := time.Now().Add(follower.cand.LeaseRemaining())
		var forgotten *elector.Term
		var failedReads int64
		for giveUp := time.Now().Add(30 * time.Second); forgotten == nil; time.Sleep(5 * time.Millisecond) {
			term := follower.election.Term()
			switch {
			case term.Leader.ID == "":
				forgotten, failedReads = term, failures.campaign.Load()
			case term.Leader.ID != leader.id || term.Token != token:
				t.Fatalf("cut-off follower sees leader %q token %d (reason %q), want %s token %d or none",
					term.Leader.ID, term.Token, term.Reason, leader.id, token)
			case time.Now().After(giveUp):
				t.Fatalf("cut-off follower still shows leader %s %v after its lease deadline", leader.id, time.Since(leaseDeadline))
			}
		}
		if forgotten.At.Before(leaseDeadline) {
			t.Errorf("the leader was forgotten %v before the follower's lease deadline (reason %q)",
				leaseDeadline.Sub(forgotten.At), forgotten.Reason)
		}
		// The silent link breaks the watch only when its keepalive gives up (5s + 3s): a
		// follower that forgot only then, on a failed read, kept a leader it could not vouch
		// for long after its lease had lapsed.
		if failedReads > 0 {
			t.Errorf("the leader was forgotten only after %d failed reads of the key, not when the lease lapsed", failedReads)
		}
		if forgotten.Reason != "store unreachable" {
			t.Errorf("reason %q, want %q", forgotten.Reason, "store unreachable")
		}
		if !leader.leading() {
			t.Fatalf("the leader, which kept its link, stopped leading: %s", leader.election.Term().Reason)
		}

		follower.heal()
		if again, tok := f.waitLeader(ttl + 10*time.Second); again != leader || tok != token {
			t.Errorf("after the heal %s leads with token %d, want %s with token %d", again.id, tok, leader.id, token)
		}
	})
}

// TestEtcdMemberLoss stops etcd members under a 3-member cluster: a quorum remains, so the
// leader keeps its lease and nothing changes.
func TestEtcdMemberLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd clusters")
	}
	// Raft needs about an election timeout (1s) to replace a lost etcd leader; a 5s ttl
	// gives renewals room to ride that out, as production ttls do.
	const ttl = 5 * time.Second
	for _, which := range []string{"follower_member", "raft_leader_member"} {
		t.Run(which, func(t *testing.T) {
			cluster := etcdtest.Start(t, 3)
			f := startFleet(t, cluster, fleetOptions{size: 3, ttl: ttl, election: "members"})
			leader, token := f.waitLeader(ttl + 5*time.Second)
			victim := cluster.LeaderIndex(t)
			if which == "follower_member" {
				victim = (victim + 1) % 3
			}
			cluster.Stop(t, victim)
			watchUnchanged(t, f, leader, token, 2*ttl)
			cluster.Restart(t, victim)
			watchUnchanged(t, f, leader, token, ttl)
		})
	}
}

// watchUnchanged checks for a while that leader keeps leading with token and that every
// node agrees.
func watchUnchanged(t *testing.T, f *fleet, leader *node, token int64, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if !leader.leading() {
			t.Fatalf("%s stopped leading: %s", leader.id, leader.election.Term().Reason)
		}
		for _, n := range f.nodes {
			if term := n.election.Term(); term.Token != token || term.Leader.ID != leader.id {
				t.Fatalf("%s now sees leader %q token %d (reason %q), want %s token %d",
					n.id, term.Leader.ID, term.Token, term.Reason, leader.id, token)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestOperatorDeleteNeverGivesTwoLeaders deletes the key while the leader's link to etcd is
// slow, so that it learns of the deletion late: the follower that takes the key must not
// admit until the old leader has stopped (the fleet's watchdog fails the test otherwise).
func TestOperatorDeleteNeverGivesTwoLeaders(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	// The slow link must not cost the leader its lease: ttl 5s against a 0.8s round trip.
	const ttl = 5 * time.Second
	cluster := etcdtest.Start(t, 1)
	f := startFleet(t, cluster, fleetOptions{size: 3, ttl: ttl, election: "slow-delete"})
	leader, token := f.waitLeader(ttl + 5*time.Second)
	for _, p := range leader.proxies {
		p.Delay(400 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := cluster.Client(t).Delete(ctx, testPrefix+"slow-delete"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(ttl)
	for {
		for _, n := range f.nodes {
			if tok := n.election.Term().Token; n.leading() && tok > token {
				t.Logf("%s leads term %d after the delete (was %s, term %d)", n.id, tok, leader.id, token)
				return // the watchdog, at cleanup, says whether two ever admitted at once
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no new term after the key was deleted")
		}
		time.Sleep(time.Millisecond)
	}
}
