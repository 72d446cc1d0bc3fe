package electortest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/shards"
)

// placedFleet is candidates that each take part in every election of one shard set, placed
// by rendezvous hashing as the leader app places them.
type placedFleet struct {
	t       *testing.T
	store   *Store
	shards  int
	members map[string][]*elector.Election // by instance id, one election per shard
	cands   map[string]*elector.Candidate
	// logs, if not nil, makes join log each candidate to an observer, by id, at DEBUG, and
	// give its set a MoveLog, as the leader app does.
	logs map[string]*observer.ObservedLogs
	// older names the instances that run as an older release would: without the set's
	// shared registry.
	older map[string]bool
	// batching gives the instances a client that batches (elector.Batcher).
	batching bool
	// claimsLate, with batching, makes the store answer each claim, or batch of claims,
	// that long after applying it (Client.AnswerClaimsLate).
	claimsLate time.Duration
	// ttl is the candidates' TTL; 0 for a second.
	ttl time.Duration
	// backends is each instance's store client, by id.
	backends map[string]elector.Backend
	// overlaps counts samples in which two candidates admitted in one shard at once.
	overlaps atomic.Int64
	mu       sync.Mutex
}

func shardName(s int) string { return fmt.Sprintf("rooms.%d", s) }

func (f *placedFleet) join(id string, moves int) {
	f.t.Helper()
	logger := zaptest.NewLogger(f.t).Named(id)
	if f.logs != nil {
		core, logs := observer.New(zap.DebugLevel)
		logger = zap.New(core)
		f.mu.Lock()
		f.logs[id] = logs
		f.mu.Unlock()
	}
	backend := f.client()
	f.mu.Lock()
	if f.backends == nil {
		f.backends = map[string]elector.Backend{}
	}
	f.backends[id] = backend
	f.mu.Unlock()
	c, err := elector.NewCandidate(elector.Config{
		ID: id, URL: "http://" + id + ".test:8080", TTL: cmp.Or(f.ttl, time.Second), DrainTimeout: time.Second,
		Backend: backend, Logger: logger,
	})
	if err != nil {
		f.t.Fatal(err)
	}
	slots := make(chan struct{}, moves)
	list := make([]*elector.Election, f.shards)
	for s := range list {
		e := c.Election(shardName(s))
		shard := s
		e.SetPlacement(func(id string, priority int) float64 { return shards.Score(id, shard, priority) }, slots)
		if !f.older[id] {
			e.ShareRegistry("rooms")
		}
		if f.logs != nil {
			e.SetMoveLog(c.MoveLog("rooms", f.shards))
		}
		list[s] = e
	}
	c.Start()
	for _, e := range list {
		e.Start()
	}
	f.mu.Lock()
	f.members[id], f.cands[id] = list, c
	f.mu.Unlock()
	f.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.Close(ctx)
	})
}

// holders returns, per shard, the ids that would admit now.
func (f *placedFleet) holders() [][]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([][]string, f.shards)
	for id, list := range f.members {
		for s, e := range list {
			if _, ok := e.Check(); ok {
				out[s] = append(out[s], id)
			}
		}
	}
	return out
}

// admittingTerm is a member's term that admitted when asked.
type admittingTerm struct {
	id    string
	token int64
	e     *elector.Election
}

// admitting returns, per shard, the members whose term admitted when asked, in the order
// they were asked.
func (f *placedFleet) admitting() [][]admittingTerm {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([][]admittingTerm, f.shards)
	for id, list := range f.members {
		for s, e := range list {
			if t, ok := e.Check(); ok {
				out[s] = append(out[s], admittingTerm{id: id, token: t.Token, e: e})
			}
		}
	}
	return out
}

// settledOn waits until every shard is led by its preferred owner among ids, and returns
// each shard's token.
func (f *placedFleet) settledOn(ids []string, within time.Duration) []int64 {
	f.t.Helper()
	cands := make([]shards.Candidate, len(ids))
	for i, id := range ids {
		cands[i] = shards.Candidate{ID: id, Weight: 1}
	}
	want := shards.Placement(f.shards, cands)
	deadline := time.Now().Add(within)
	for {
		h := f.holders()
		ok := true
		for s := range want {
			if len(h[s]) != 1 || h[s][0] != want[s] {
				ok = false
			}
		}
		if ok {
			tokens := make([]int64, f.shards)
			for s := range want {
				tokens[s] = f.members[want[s]][s].Term().Token
			}
			return tokens
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("the shards did not settle on their preferred owners within %s: want %v, leading %v", within, want, h)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (f *placedFleet) watch(stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		for s, terms := range f.admitting() {
			if len(terms) < 2 {
				continue
			}
			// The members were asked one after the other: a handover between two asks
			// shows both. The first one still admitting under the same term after the
			// others were asked admitted all along, and so at the same time as they did.
			first := terms[0]
			if t, ok := first.e.Check(); ok && t.Token == first.token {
				f.overlaps.Add(1)
				f.t.Logf("shard %d: %s (token %d) and %s (token %d) admitted at once", s, first.id, first.token, terms[1].id, terms[1].token)
			}
		}
		time.Sleep(time.Millisecond)
	}
}

// A shard set's elections settle on the owners rendezvous hashing prefers; an instance that
// joins draws exactly its own shards, each once, a few at a time, and nothing else moves; one
// that leaves hands its shards to their next owners.
func TestPlacedElectionsFollowTheirRanking(t *testing.T) {
	f := &placedFleet{t: t, store: NewStore(), shards: 24, members: map[string][]*elector.Election{}, cands: map[string]*elector.Candidate{}}
	defer f.checkOverlaps(t)()

	for _, id := range []string{"node-a", "node-b", "node-c"} {
		f.join(id, 4)
	}
	before := f.settledOn([]string{"node-a", "node-b", "node-c"}, 20*time.Second)

	f.join("node-d", 4)
	after := f.settledOn([]string{"node-a", "node-b", "node-c", "node-d"}, 20*time.Second)
	moved := 0
	for s := range before {
		owner := f.holders()[s][0]
		switch {
		case owner == "node-d":
			moved++
		case after[s] != before[s]:
			t.Errorf("shard %d stayed with %s but its term changed (token %d -> %d): it moved although its owner did not", s, owner, before[s], after[s])
		}
	}
	if moved == 0 {
		t.Fatal("no shard moved to the instance that joined")
	}
	t.Logf("a join moved %d of %d shards", moved, f.shards)

	f.leave("node-a")
	f.settledOn([]string{"node-b", "node-c", "node-d"}, 20*time.Second)
}

// The shards of a set share one registry entry per instance: starting a set costs each
// instance one announcement and one registry watch, however many shards it has, and a
// resign with a hold-off of one shard is seen in that shard's registry alone, so that the
// shard moves to its next owner at once and no other shard does.
func TestShardSetSharesOneRegistry(t *testing.T) {
	store := NewStore()
	f := &placedFleet{t: t, store: store, shards: 32, members: map[string][]*elector.Election{}, cands: map[string]*elector.Candidate{}}
	ids := []string{"node-a", "node-b", "node-c"}
	for _, id := range ids {
		f.join(id, 4)
	}
	before := f.settledOn(ids, 20*time.Second)

	calls := store.Calls()
	t.Logf("calls to place %d shards on %d instances: %v", f.shards, len(ids), calls)
	if got, most := calls["WatchCandidates"], int64(len(ids)); got > most {
		t.Errorf("%d registry watches, want at most one per instance (%d)", got, most)
	}
	if got, most := calls["Announce"], int64(2*len(ids)); got > most {
		t.Errorf("%d announcements for %d shards, want at most %d: one entry per instance, not per shard", got, f.shards, most)
	}
	if got, want := calls["WatchGroupIntents"], int64(len(ids)); got != want || calls["WatchIntent"] != 0 {
		t.Errorf("%d watches of the set's intents and %d of a shard's, want %d and 0: one per instance", got, calls["WatchIntent"], want)
	}

	// A transfer of one shard reaches its holder through the set's watch of intents: the
	// target leads.
	moved := 0
	owner := f.holders()[moved][0]
	to := "node-b"
	if owner == to {
		to = "node-c"
	}
	tctx, tcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer tcancel()
	if err := f.members["node-a"][moved].Transfer(tctx, to, 5*time.Second); err != nil {
		t.Fatalf("transfer of shard %d from %s to %s: %v", moved, owner, to, err)
	}
	// Transfer returns once the store shows that the target led; placement may move the
	// shard back to its preferred owner since.

	// Resign one shard of node-a's with a long hold-off.
	var shard int
	for s, owner := range f.holders() {
		if len(owner) == 1 && owner[0] == "node-a" { // not a shard that is moving
			shard = s
			break
		}
	}
	e := f.members["node-a"][shard]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.Resign(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		h := f.holders()[shard]
		if len(h) == 1 && h[0] != "node-a" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("shard %d, resigned by node-a with a hold-off, has no other owner after 10s (leading: %v)", shard, h)
		}
		time.Sleep(5 * time.Millisecond)
	}
	viewOf := func(e *elector.Election, id string) elector.CandidateInfo {
		list, err := e.KnownCandidates(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range list {
			if c.ID == id {
				return c
			}
		}
		t.Fatalf("%s is not in %s's view", id, e.Name())
		return elector.CandidateInfo{}
	}
	f.settle(t, "node-b's view of node-a in the resigned shard", func() bool {
		c := viewOf(f.members["node-b"][shard], "node-a")
		return !c.Healthy && !c.HoldOffUntil.IsZero()
	})
	for s := range f.shards {
		if s == shard || s == moved {
			continue
		}
		if c := viewOf(f.members["node-b"][s], "node-a"); !c.Healthy {
			t.Errorf("shard %d: node-b's view has node-a unhealthy (%+v), but node-a resigned shard %d only", s, c, shard)
		}
		if owner := f.holders()[s]; len(owner) != 1 || f.members[owner[0]][s].Term().Token != before[s] {
			t.Errorf("shard %d moved (leading: %v) when node-a resigned shard %d", s, owner, shard)
		}
	}
}

// settle waits until cond holds, for at most 10s.
func (f *placedFleet) settle(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Instances of an older release, which announce themselves per shard, and of this one,
// which announce once per set, do not see each other's announcements: each kind places
// the set among its own. Every shard still has one owner at a time, each instance of this
// release says that older ones run the set, and the set settles.
func TestOlderReleaseInTheSetKeepsOneOwnerPerShard(t *testing.T) {
	f := &placedFleet{t: t, store: NewStore(), shards: 16, members: map[string][]*elector.Election{}, cands: map[string]*elector.Candidate{},
		logs: map[string]*observer.ObservedLogs{}, older: map[string]bool{"node-old": true}}
	stopChecking := f.checkOverlaps(t)
	for _, id := range []string{"node-a", "node-old", "node-b"} {
		f.join(id, 4)
	}
	f.settle(t, "every shard owned once", func() bool {
		for _, h := range f.holders() {
			if len(h) != 1 {
				return false
			}
		}
		return true
	})
	f.settle(t, "node-a's warning about node-old", func() bool {
		f.mu.Lock()
		logs := f.logs["node-a"]
		f.mu.Unlock()
		for _, e := range logs.FilterMessageSnippet("instances of an older release").All() {
			if fmt.Sprint(e.ContextMap()["older_instances"]) == "[node-old]" {
				return true
			}
		}
		return false
	})
	stopChecking()
}

func (f *placedFleet) client() elector.Backend {
	if f.batching {
		// A store that takes a moment to answer, as a real one does: releases asked
		// meanwhile wait for the next batch.
		c := f.store.BatchingClient()
		c.SetDelay(2 * time.Millisecond)
		c.AnswerClaimsLate(f.claimsLate)
		return c
	}
	return f.store.Client()
}

// batchingPair starts node-a and node-b in a set of 64 shards on a store that batches.
func batchingPair(t *testing.T) (*placedFleet, *Store) {
	store := NewStore()
	f := &placedFleet{t: t, store: store, shards: 64, members: map[string][]*elector.Election{}, cands: map[string]*elector.Candidate{}, batching: true}
	f.join("node-a", 4)
	f.join("node-b", 4)
	return f, store
}

// An instance that leaves releases its shards in a few batches where the store batches,
// not one request per shard, and each successor still takes its shard at once, on the
// release's acknowledgement.
func TestLeavingInstanceReleasesItsShardsInBatches(t *testing.T) {
	f, store := batchingPair(t)
	defer f.checkOverlaps(t)()
	f.settledOn([]string{"node-a", "node-b"}, 20*time.Second)
	held := 0
	for _, h := range f.holders() {
		if h[0] == "node-a" {
			held++
		}
	}
	before := store.Calls()
	f.leave("node-a")
	f.settledOn([]string{"node-b"}, 10*time.Second)
	after := store.Calls()
	releases, batches := after["Release"]-before["Release"], after["ReleaseAll"]-before["ReleaseAll"]
	t.Logf("node-a held %d shards and released them in %d single releases and %d batches", held, releases, batches)
	if releases+batches > int64(held)/4 {
		t.Errorf("%d shards released in %d requests (%d alone, %d batches); want them batched", held, releases+batches, releases, batches)
	}
}

// A set's shards claim their keys in a few batches where the store batches, not one
// request per shard: at a start every instance claims the shards it is preferred for at
// the same moment. Placement is as it is with single claims: one owner per shard, the
// preferred one.
func TestShardSetClaimsInBatches(t *testing.T) {
	f, store := batchingPair(t)
	defer f.checkOverlaps(t)()
	f.settledOn([]string{"node-a", "node-b"}, 20*time.Second)
	calls := store.Calls()
	claims, batches := calls["Campaign"], calls["CampaignAll"]
	t.Logf("%d shards claimed in %d single claims and %d batches", f.shards, claims, batches)
	if batches == 0 || claims+batches > int64(f.shards)/4 {
		t.Errorf("%d shards claimed in %d requests (%d alone, %d batches); want them batched", f.shards, claims+batches, claims, batches)
	}
}

// A set's shards read their keys (those an instance is not preferred for, before they
// follow) in a few batches where the store batches reads, not one request per shard: at a
// start, every instance reads thousands at the same moment. (Their failsafe rosters go
// the same way: Election.readHistory.)
func TestShardSetReadsInBatches(t *testing.T) {
	f, store := batchingPair(t)
	defer f.checkOverlaps(t)()
	f.settledOn([]string{"node-a", "node-b"}, 20*time.Second)
	calls := store.Calls()
	single, batches := calls["Observe"], calls["ObserveAll"]
	t.Logf("keys read in %d single reads and %d batches for %d shards on 2 instances", single, batches, f.shards)
	if batches == 0 || single+batches > int64(f.shards)/4 {
		t.Errorf("keys read in %d requests (%d alone, %d batches) for %d shards on 2 instances; want them batched", single+batches, single, batches, f.shards)
	}
}

// A set's shards each claim their key once at a start. A shard's placement, set before
// Start, asks its campaign loop to read the key again, and the loop's first pass is that
// read: it must not end the follow of the key the pass has just won and claim it a second
// time (every shard did, which doubled the writes a set's start sends to the store).
func TestShardSetClaimsEachKeyOnceAtAStart(t *testing.T) {
	f := &placedFleet{t: t, store: NewStore(), shards: 64, members: map[string][]*elector.Election{}, cands: map[string]*elector.Candidate{}}
	defer f.checkOverlaps(t)()
	f.join("node-a", 4)
	f.settledOn([]string{"node-a"}, 20*time.Second)
	if claims := f.store.Calls()["Campaign"]; claims != int64(f.shards) {
		t.Errorf("%d shards won with %d claims; want one claim each", f.shards, claims)
	}
}

// A shard's claim that waited for the batch before its own still learns what its own
// batch did, however late the store answers it: the request is bounded from its sending,
// not from the claim's wait. Here every batch of claims is answered 700 ms after it was
// applied, so the claims asked while the first was on its way are answered 1.4 s after
// they were asked, past a request's timeout (1 s) counted from then. Before, those
// claims gave up, their answers lost, and each claimed its key a second time to find it
// held under its own lease: a term that cannot name its predecessor, so it waits a whole
// ttl before it admits. At a SIGTERM of an owner of 800 shards on etcd, 66 of the shards
// taken waited so, and requests forwarded to them failed meanwhile.
func TestShardSetClaimWaitsForItsOwnBatchAnswer(t *testing.T) {
	f := &placedFleet{t: t, store: NewStore(), shards: 64, members: map[string][]*elector.Election{}, cands: map[string]*elector.Candidate{},
		batching: true, claimsLate: 700 * time.Millisecond, ttl: 3 * time.Second}
	defer f.checkOverlaps(t)()
	f.join("node-a", 4)
	f.settledOn([]string{"node-a"}, 30*time.Second)
	if claims := f.store.Claimed(); claims != int64(f.shards) {
		t.Errorf("%d shards won with %d claims; want one claim each", f.shards, claims)
	}
}

// A term won by a claim answered late gets its first heartbeat before its deadline, which
// counts from the claim's sending, even when that deadline comes before the lease's next
// renewal: the set's heartbeats go with the renewals, and a term left for the next one
// passed its deadline, which gives up the lease and every shard held under it. Here each
// batch of claims is answered 700 ms after it was sent, 200 ms before the heartbeat
// deadline of a 1 s ttl, while renewals go every 333 ms: without the early heartbeat, some
// instance's lease went in nearly every run.
func TestShardSetBeatsATermWonLateBeforeItsDeadline(t *testing.T) {
	f := &placedFleet{t: t, store: NewStore(), shards: 48, members: map[string][]*elector.Election{}, cands: map[string]*elector.Candidate{},
		batching: true, claimsLate: 700 * time.Millisecond}
	defer f.checkOverlaps(t)()
	ids := []string{"node-a", "node-b", "node-c"}
	for _, id := range ids {
		f.join(id, 4)
	}
	f.settledOn(ids, 30*time.Second)
	if grants := f.store.Calls()["Grant"]; grants != int64(len(ids)) {
		t.Errorf("%d instances were granted %d leases: a lease was given up at the start", len(ids), grants)
	}
}

// A set's held shards send their heartbeats in one request per renewal where the store
// batches them (elector.HeartbeatBatcher), not a request, a loop and a timer per shard; a
// shard still stops admitting when its own heartbeat deadline passes.
func TestShardSetBeatsInOneRequestPerRenewal(t *testing.T) {
	f, store := batchingPair(t)
	defer f.checkOverlaps(t)()
	f.settledOn([]string{"node-a", "node-b"}, 20*time.Second)
	before := store.Calls()
	f.settle(t, "three batched heartbeats of each instance", func() bool {
		return store.Calls()["UpdateAll"]-before["UpdateAll"] >= 6
	})
	after := store.Calls()
	single, batches := after["Update"]-before["Update"], after["UpdateAll"]-before["UpdateAll"]
	t.Logf("%d shards held: %d heartbeats alone and %d batches", f.shards, single, batches)
	// A heartbeat goes alone only while its election writes its record (a rare
	// handover's mark); one renewal's worth alone is what a loop per shard sent.
	if single >= int64(f.shards) {
		t.Errorf("%d heartbeats sent alone beside %d batches; want the held shards' in their set's batch", single, batches)
	}
}

// When the store refuses an instance's heartbeats while its lease renewals go on (a full
// disk, a permission taken away), each term it holds stops admitting at its own heartbeat
// deadline, though its set's loop, not the shard's, sends them: a beat window after its
// last heartbeat that succeeded, or after the campaign that won it (its first write). The
// instance is alone in the set, so nothing but that deadline ends its terms; it gives up
// its lease and wins its shards again, a term at a time.
func TestShardSetWhoseHeartbeatsFailLetsGo(t *testing.T) {
	f := &placedFleet{t: t, store: NewStore(), shards: 64, members: map[string][]*elector.Election{}, cands: map[string]*elector.Candidate{}, batching: true}
	f.join("node-a", 4)
	f.settledOn([]string{"node-a"}, 20*time.Second)
	f.mu.Lock()
	a, terms := f.backends["node-a"].(BatchingClient), f.members["node-a"]
	f.mu.Unlock()
	a.Fail("Update", -1, errors.New("etcdserver: mvcc: database space exceeded"))
	failed := time.Now()
	// A term admits at most a beat window (under a ttl, 1 s here) past its last write;
	// twice the ttl leaves room for a loaded machine, and a term whose deadline a refused
	// heartbeat moved would admit to the end.
	const longest = 2 * time.Second
	type shardTerm struct {
		shard int
		token int64
	}
	since := map[shardTerm]time.Time{}
	for time.Since(failed) < 3*longest {
		for s, e := range terms {
			term, ok := e.Check()
			if !ok {
				continue
			}
			key := shardTerm{s, term.Token}
			if _, seen := since[key]; !seen {
				since[key] = time.Now()
			}
			if d := time.Since(since[key]); d > longest {
				t.Fatalf("shard %d: node-a's term %d still admits %s after it was first seen admitting with every heartbeat refused", s, term.Token, d)
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// checkOverlaps samples the fleet for two instances admitting in one shard until the
// function it returns is called, which fails t if any did.
func (f *placedFleet) checkOverlaps(t *testing.T) func() {
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { defer close(done); f.watch(stop) }()
	return func() {
		close(stop)
		<-done
		if n := f.overlaps.Load(); n > 0 {
			t.Errorf("%d samples saw two instances admit in one shard", n)
		}
	}
}

// leave makes the instance id leave the set, as on SIGTERM.
func (f *placedFleet) leave(id string) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := f.cands[id].Leave(ctx); err != nil {
		f.t.Fatal(err)
	}
	f.mu.Lock()
	delete(f.members, id)
	f.mu.Unlock()
}

// A shard's campaign loop that only waits for news of its key (the watch, its holder's
// silence, a lost lease) runs in no goroutine of its own: a placed set's loops cost
// goroutines only while they have something to handle, so an instance's goroutines do not
// grow with the shards it follows.
func TestFollowingShardsRunNoGoroutine(t *testing.T) {
	const shardCount = 256
	f := &placedFleet{t: t, store: NewStore(), shards: shardCount, members: map[string][]*elector.Election{}, cands: map[string]*elector.Candidate{}, batching: true}
	f.join("node-a", 4)
	f.join("node-b", 4)
	defer f.checkOverlaps(t)()
	f.settledOn([]string{"node-a", "node-b"}, 30*time.Second)
	// What the elector runs, not the fake store's watches (a goroutine each: a real
	// store's set watch wakes its readers without one).
	electorGoroutines := func() int {
		n := 0
		for fn, count := range goroutinesByFunction() {
			if strings.HasPrefix(fn, "github.com/caddyleader/caddy-leader/elector.") {
				n += count
			}
		}
		return n
	}
	// A set costs each instance a few loops of its own (registry, intents, heartbeats,
	// preempts) and a shard costs one for a moment while news of it is handled; a loop
	// per shard would be 2 × 256 here.
	const most = shardCount / 8
	fewest := electorGoroutines()
	for deadline := time.Now().Add(5 * time.Second); fewest > most && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		fewest = min(fewest, electorGoroutines())
	}
	t.Logf("%d shards on 2 instances: %d goroutines of the elector at the fewest", shardCount, fewest)
	if fewest > most {
		t.Errorf("the elector runs %d goroutines for 2 instances following %d shards; want at most %d, not one per shard", fewest, shardCount, most)
	}
}
