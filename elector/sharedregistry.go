package elector

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The elections of a shard set share one registry entry per instance, in the store's
// registry of an election named as the set (which no election uses: see shardcount.go),
// instead of one entry per shard: one Announce, one watch and one read per instance for the
// whole set, not per shard, which is most of what a shard costs the store to start (see
// BENCHMARKS.md). What an instance announces is mostly the same for every shard (its id,
// URL, priority, TTL); what may differ by shard (a hold-off after a resign, a layer-4
// address) is carried in the entry for the shards where it differs from the rest, and
// each shard's view of the registry is the entries as that shard's own registry would
// list them. Placement, yields, transfers and preemption read the views as before.
//
// An instance of an older release announces itself per shard, and does not read the
// shared entries: in a fleet of both, each side places the set among its own kind, and
// the store's compare-and-swap still gives every shard one holder (docs/shards.md,
// "Upgrades").

// sharedEntry is what an instance announces in a set's shared registry.
type sharedEntry struct {
	CandidateInfo
	// Shards holds, by shard number, the entry of each shard whose entry differs from
	// CandidateInfo.
	Shards map[string]shardEntry `json:"shards,omitempty"`
}

// shardEntry is the part of a candidate's entry that may differ from shard to shard.
type shardEntry struct {
	Healthy      bool      `json:"healthy"`
	HoldOffUntil time.Time `json:"hold_off_until,omitzero"`
	Leaving      bool      `json:"leaving,omitempty"`
	Layer4       string    `json:"layer4,omitempty"`
}

func shardPart(i CandidateInfo) shardEntry {
	return shardEntry{Healthy: i.Healthy, HoldOffUntil: i.HoldOffUntil, Leaving: i.Leaving, Layer4: i.Layer4}
}

func (s shardEntry) applyTo(i CandidateInfo) CandidateInfo {
	i.Healthy, i.HoldOffUntil, i.Leaving, i.Layer4 = s.Healthy, s.HoldOffUntil, s.Leaving, s.Layer4
	return i
}

// sharedRegistry is a set's shared registry as one candidate takes part in it.
type sharedRegistry struct {
	c     *Candidate
	group string // the set's name, and the election whose registry holds the entries
	// turns holds a token for each of the set's store requests on their way (setstore.go).
	turns, recordTurns chan struct{}

	mu      sync.Mutex
	members map[string]*Election // by shard number
	cancel  context.CancelFunc   // of the watch, while the set has members
	// stored is what the store holds of this candidate: the lease and value of its last
	// Announce that succeeded, and the shard part of each member's entry in it.
	stored struct {
		lease LeaseID
		value []byte
		parts map[string]shardEntry
		base  shardEntry
	}
	flushing bool
	flushed  chan struct{} // closed and replaced at the end of every flush
	// view is the shared registry as the watch last reported it (nil until it has, or
	// while it is broken), for a member that joins meanwhile.
	view []sharedEntry
	// common is the list of candidates that the members without entries of their own
	// share, made of the entries commonOf (listForLocked).
	common   []CandidateInfo
	commonOf []sharedEntry

	fresh freshRead[[]sharedEntry]

	// runs is, by shard, how each member campaigns; preempts is what the set's preempt
	// loop has yet to look at (sharedpreempt.go).
	runs     map[string]*memberRun
	preempts *preemptQueue
	// intents is, by shard, what the set's watch of intents gave each member (when the
	// store has one: sharedintents.go), and current the intents it last reported.
	intents map[string]*memberIntents
	current map[string][]byte

	// joined is when the first member joined, and moved when the watch last reported
	// another set of instances than before (zero until its first report): see awaitFleet.
	joined, moved time.Time
	liveNow       chan struct{} // closed at the watch's first report
	ids           []string      // the instances the watch last reported

	// beats keeps the set's held terms alive when the store batches heartbeats
	// (sharedbeat.go).
	beats setBeats

	fleetTTL    atomic.Int64
	ttlMismatch sync.Map
	leaderless  atomic.Bool
}

// ShareRegistry makes e one of the elections of the set named group (e's name is
// group.<n>) that announce themselves, and read the registry, through one entry per
// instance for the whole set. Every instance of a fleet shares the registries of the same
// sets. Call it before Start.
func (e *Election) ShareRegistry(group string) {
	shard, ok := strings.CutPrefix(e.name, group+".")
	if !ok || shard == "" {
		return
	}
	c := e.c
	c.mu.Lock()
	r := c.sharedRegistries[group]
	if r == nil {
		r = &sharedRegistry{c: c, group: group, members: map[string]*Election{}, flushed: make(chan struct{}), liveNow: make(chan struct{}), preempts: newPreemptQueue(),
			turns: make(chan struct{}, setRequests), recordTurns: make(chan struct{}, setRecords)}
		r.fresh.read = r.readStore
		if c.sharedRegistries == nil {
			c.sharedRegistries = map[string]*sharedRegistry{}
		}
		c.sharedRegistries[group] = r
	}
	c.mu.Unlock()
	e.shared.Store(&sharedMember{reg: r, shard: shard})
}

// memberRun is how a member campaigns: under ctx (its campaign loop's), and whether its
// preempt is on its way.
type memberRun struct {
	ctx        context.Context
	preempting bool
}

// sharedMember is an election's place in a shared registry.
type sharedMember struct {
	reg   *sharedRegistry
	shard string
}

// join adds e, which campaigns under ctx, to the set's members, starting the set's
// watches with the first.
func (r *sharedRegistry) join(ctx context.Context, e *Election, shard string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.members[shard] = e
	if r.runs == nil {
		r.runs = map[string]*memberRun{}
	}
	r.runs[shard] = &memberRun{ctx: ctx}
	r.kickPreempts(shard)
	if r.view != nil {
		r.setView(e, shard, r.view)
	}
	ig, intents := r.c.cfg.Backend.(IntentGrouper)
	if intents {
		if r.intents == nil {
			r.intents, r.current = map[string]*memberIntents{}, map[string][]byte{}
		}
		m := &memberIntents{ctx: ctx}
		r.intents[shard] = m
		if v, ok := r.current[shard]; ok {
			r.giveLocked(shard, m, v, false)
		}
	}
	if r.cancel != nil {
		return
	}
	ctx, cancel := context.WithCancel(r.c.ctx)
	r.cancel = cancel
	if r.joined.IsZero() {
		r.joined = time.Now()
	}
	r.c.loops.Add(3)
	go func() {
		defer r.c.loops.Done()
		r.follow(ctx)
	}()
	go func() {
		defer r.c.loops.Done()
		r.followPreempts(ctx)
	}()
	go func() {
		defer r.c.loops.Done()
		r.watchForOlder(ctx)
	}()
	if intents {
		r.c.loops.Add(1)
		go func() {
			defer r.c.loops.Done()
			r.followIntents(ctx, ig)
		}()
	}
}

// leave removes e from the members; the watch stops with the last.
func (r *sharedRegistry) leave(e *Election, shard string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.members[shard] != e {
		return
	}
	delete(r.members, shard)
	delete(r.runs, shard)
	delete(r.intents, shard)
	if len(r.members) == 0 && r.cancel != nil {
		r.cancel()
		r.cancel = nil
		r.view, r.current = nil, map[string][]byte{}
	}
}

// follow keeps every member's view of the registry from one watch of the set's entries,
// watching again after a backoff whenever the watch breaks.
func (r *sharedRegistry) follow(ctx context.Context) {
	followWatch(ctx, r.c.cfg.TTL,
		func(ctx context.Context) <-chan CandidatesChange {
			return r.c.cfg.Backend.WatchCandidates(ctx, r.group)
		},
		func(change CandidatesChange) bool { return change.Err != nil },
		func(change CandidatesChange) {
			entries := decodeShared(change.Candidates)
			r.note(entries)
			r.mu.Lock()
			defer r.mu.Unlock()
			if ids := entryIDs(entries); r.moved.IsZero() || !slices.Equal(ids, r.ids) {
				if r.moved.IsZero() {
					close(r.liveNow)
				}
				r.ids, r.moved = ids, time.Now()
			}
			if ctx.Err() == nil {
				r.view = entries
				for shard, e := range r.members {
					r.setView(e, shard, entries)
				}
				r.kickPreempts("")
			}
		},
		func() {
			r.mu.Lock()
			defer r.mu.Unlock()
			if ctx.Err() == nil {
				r.view = nil
				for _, e := range r.members {
					e.registry.set(nil, false)
				}
			}
		})
}

// awaitFleet delays the first campaigns of a set that is starting until the instances
// starting with this one are in its view of the registry: every shard is then first
// claimed by the owner placement prefers, and does not move again once the others have
// announced themselves (a cold start of a fleet of N instances would otherwise move
// about (N-1)/N of the shards, each by a transfer). It waits until the instances the
// registry's watch lists have stayed the same for one priority step (a fleet whose
// instances start one after the other is waited for as long as they keep coming), and
// one TTL after the set started at most; a set whose fleet has been the same for a step
// already does not wait. Only who tries first depends on it: the store's
// compare-and-swap decides who holds a shard.
func (r *sharedRegistry) awaitFleet(ctx context.Context) {
	r.mu.Lock()
	joined, liveNow := r.joined, r.liveNow
	r.mu.Unlock()
	step, latest := priorityStep(r.c.cfg.TTL), joined.Add(r.c.cfg.TTL)
	if !time.Now().Before(latest) {
		return // every campaign after the set's first ttl
	}
	t := time.NewTimer(time.Until(latest))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return
	case <-t.C:
		return
	case <-liveNow:
	}
	for {
		r.mu.Lock()
		stable := r.moved.Add(step)
		r.mu.Unlock()
		wait := time.Until(stable)
		if wait <= 0 || !time.Now().Before(latest) {
			return
		}
		if !sleepCtx(ctx, min(wait, time.Until(latest))) {
			return
		}
	}
}

// entryIDs lists the ids of entries, which are sorted by id.
func entryIDs(entries []sharedEntry) []string {
	ids := make([]string, len(entries))
	for i, en := range entries {
		ids[i] = en.ID
	}
	return ids
}

// setView gives member e (of shard) its view of entries. r.mu is held.
func (r *sharedRegistry) setView(e *Election, shard string, entries []sharedEntry) {
	e.registry.set(r.listForLocked(entries, shard), true)
	e.fleetTTL.Store(max(e.fleetTTL.Load(), r.fleetTTL.Load()))
}

// listFor is entries as the registry of shard alone would list them, sorted by id. Shards
// without entries of their own share one list, which nobody modifies.
func listFor(entries []sharedEntry, shard string) []CandidateInfo {
	list := make([]CandidateInfo, len(entries))
	for i, en := range entries {
		list[i] = en.CandidateInfo
		if part, ok := en.Shards[shard]; ok {
			list[i] = part.applyTo(en.CandidateInfo)
		}
	}
	return list
}

// listForLocked is listFor, but the shards that no entry says anything of its own about
// (nearly all) share one list per view of the registry, instead of a copy each. r.mu is
// held.
func (r *sharedRegistry) listForLocked(entries []sharedEntry, shard string) []CandidateInfo {
	for _, en := range entries {
		if _, own := en.Shards[shard]; own {
			return listFor(entries, shard)
		}
	}
	if !sameSlice(r.commonOf, entries) {
		r.commonOf, r.common = entries, listFor(entries, "")
	}
	return r.common
}

// sameSlice reports whether a and b are the same slice (not merely equal ones).
func sameSlice[T any](a, b []T) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// note does once for the set what noteTTLs and noteLeaderless do for an election.
func (r *sharedRegistry) note(entries []sharedEntry) {
	list := make([]CandidateInfo, len(entries))
	for i, en := range entries {
		list[i] = en.CandidateInfo
	}
	noteTTLs(r.c, r.group, list, &r.fleetTTL, &r.ttlMismatch)
	noteLeaderless(r.c, r.group, list, &r.leaderless)
}

// decodeShared turns the store's entries into what the candidates announced in a shared
// registry, sorted by id.
func decodeShared(entries []CandidateEntry) []sharedEntry {
	infos := decodeCandidates(entries) // sorted, and as an entry of an election's registry
	out := make([]sharedEntry, len(infos))
	byID := make(map[string][]byte, len(entries))
	for _, en := range entries {
		byID[en.ID] = en.Value
	}
	for i, info := range infos {
		out[i].CandidateInfo = info
		var extra struct {
			Shards map[string]shardEntry `json:"shards"`
		}
		if json.Unmarshal(byID[info.ID], &extra) == nil {
			out[i].Shards = extra.Shards
		}
	}
	return out
}

// announce makes sure that the store holds, under lease l, an entry of this candidate
// that lists e (of shard) as e.info() has it now: it returns at once when the entry does,
// and otherwise once an Announce of the whole set's entry that began after this call has
// succeeded (or failed: the caller tries again on its next pass, as with its own entry).
func (r *sharedRegistry) announce(ctx context.Context, l *lease, e *Election, shard string) error {
	want := shardPart(e.info())
	for {
		r.mu.Lock()
		if r.stored.lease == l.id && r.stored.value != nil && r.partLocked(shard) == want {
			r.mu.Unlock()
			return nil
		}
		if !r.flushing {
			r.flushing = true
			r.mu.Unlock()
			return r.flush(ctx, l)
		}
		wait := r.flushed
		r.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// partLocked is shard's part of the stored entry.
func (r *sharedRegistry) partLocked(shard string) shardEntry {
	if p, ok := r.stored.parts[shard]; ok {
		return p
	}
	return r.stored.base
}

// flush announces the entry every member has now, under l. It is called with r.flushing
// set, which it clears.
func (r *sharedRegistry) flush(ctx context.Context, l *lease) error {
	r.mu.Lock()
	members := make(map[string]*Election, len(r.members))
	for shard, m := range r.members {
		members[shard] = m
	}
	r.mu.Unlock()
	entry, parts := r.entryOf(members)
	value, _ := json.Marshal(entry) // strings, numbers, bools and times always marshal
	rctx, cancel := context.WithTimeout(ctx, r.c.requestTimeout)
	err := r.c.cfg.Backend.Announce(rctx, r.group, r.c.cfg.ID, value, l.id)
	cancel()
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil {
		r.stored.lease, r.stored.value = l.id, value
		r.stored.base, r.stored.parts = shardPart(entry.CandidateInfo), parts
	}
	r.flushing = false
	close(r.flushed)
	r.flushed = make(chan struct{})
	return err
}

// entryOf is the entry that announces members: the part most of them share in
// CandidateInfo, and each other one by shard. It returns every member's part too.
func (r *sharedRegistry) entryOf(members map[string]*Election) (sharedEntry, map[string]shardEntry) {
	parts := make(map[string]shardEntry, len(members))
	count := map[shardEntry]int{}
	var info CandidateInfo
	var common shardEntry
	for shard, m := range members {
		i := m.info()
		info = i
		p := shardPart(i)
		parts[shard] = p
		count[p]++
		if count[p] > count[common] {
			common = p
		}
	}
	if len(members) == 0 {
		info = r.c.baseInfo()
		common = shardPart(info)
	}
	entry := sharedEntry{CandidateInfo: common.applyTo(info)}
	for shard, p := range parts {
		if p != common {
			if entry.Shards == nil {
				entry.Shards = map[string]shardEntry{}
			}
			entry.Shards[shard] = p
		}
	}
	return entry, parts
}

// candidates reads the set's registry from the store as shard's own registry would list
// it: with one read, begun after this call, shared by every member that asks meanwhile.
func (r *sharedRegistry) candidates(ctx context.Context, shard string) ([]CandidateInfo, error) {
	entries, err := r.fresh.get(ctx)
	if err != nil {
		return nil, err
	}
	r.note(entries)
	return listFor(entries, shard), nil
}

func (r *sharedRegistry) readStore(ctx context.Context) ([]sharedEntry, error) {
	rctx, cancel := context.WithTimeout(ctx, r.c.requestTimeout)
	defer cancel()
	entries, err := r.c.cfg.Backend.Candidates(rctx, r.group)
	if err != nil {
		return nil, err
	}
	return decodeShared(entries), nil
}

// freshRead is a read that callers share: each gets the result of one that began after it
// asked, and callers that ask while one is on its way share the next one.
type freshRead[T any] struct {
	read func(context.Context) (T, error)

	mu      sync.Mutex
	running chan struct{} // closed when the read on its way ends; nil when none is
	next    *readCall[T]  // the read that callers join, not begun yet
}

type readCall[T any] struct {
	done chan struct{}
	val  T
	err  error
}

// get returns the result of a read that began after get was called. The caller that
// asks for a read runs it, once the one on its way has ended, under its own ctx; a caller
// whose ctx ends stops waiting.
func (f *freshRead[T]) get(ctx context.Context) (T, error) {
	f.mu.Lock()
	call := f.next
	if call != nil {
		f.mu.Unlock()
		select {
		case <-call.done:
			return call.val, call.err
		case <-ctx.Done():
			var zero T
			return zero, ctx.Err()
		}
	}
	call = &readCall[T]{done: make(chan struct{})}
	f.next = call
	before := f.running
	f.mu.Unlock()
	if before != nil {
		<-before // bounded by the request timeout of that read
	}
	f.mu.Lock()
	f.next, f.running = nil, call.done
	f.mu.Unlock()
	call.val, call.err = f.read(ctx)
	f.mu.Lock()
	if f.running == call.done {
		f.running = nil
	}
	f.mu.Unlock()
	close(call.done)
	return call.val, call.err
}
