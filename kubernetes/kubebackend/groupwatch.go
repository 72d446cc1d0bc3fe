package kubebackend

import (
	"context"
	"errors"
	"strconv"
	"strings"

	coordv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/internal/beacon"
)

// The group's stream: one watch of the group's label for every Watch of its elections
// (see beacon.go).

// ringSize is how many events, at least, a group's stream keeps for Watch calls that start
// from a revision it has already passed (every Watch follows a read, a moment earlier).
const ringSize = 8192

// groupEvent is one change the stream showed: of an election object (election set,
// holder nil when vacant), or of a beacon (beacon set).
type groupEvent struct {
	rev      int64
	election string
	obj      *coordv1.Lease // the election object as written; nil when deleted
	holder   *elector.Holder
	beacon   *beaconState
}

// groupStream is one watch of the group's objects and what it has shown.
type groupStream struct {
	cancel context.CancelFunc
	// pos is the revision of the last event processed; every event after dropped is in
	// ring, oldest first.
	pos     int64
	dropped int64
	ring    []groupEvent
	subs    map[string]map[*groupSub]struct{}          // by election
	byLease map[elector.LeaseID]map[*groupSub]struct{} // subscribers whose key the lease holds
	beats   map[elector.LeaseID][]*beacon.Batch[int64] // heartbeats waiting for their beacon
}

// groupSub is one Watch of an election of the group.
type groupSub struct {
	election string
	after    int64           // changes up to after are reported already, or not wanted
	holder   *elector.Holder // the key's holder as of max(after, the stream's pos)
	version  int64           // the key's resourceVersion then (0: no object)
	obj      *coordv1.Lease  // the key's object then
	queue    []elector.Observation
	failed   error
	wake     chan struct{}
}

func (s *groupSub) push(o elector.Observation) {
	s.queue = append(s.queue, o)
	s.poke()
}

func (s *groupSub) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// watchGrouped implements Watch for an election of group g. As the Watch of an election
// alone does, it follows the holder's lease object (reaper.go), clears the key once that
// is gone, and reports the write when the stream brings it.
func (g *group) watchGrouped(ctx context.Context, election string, afterRev int64) <-chan elector.Observation {
	out := make(chan elector.Observation, 1)
	g.b.startReaper()
	runWatch(ctx, g.b, out, func(err error) elector.Observation { return elector.Observation{Err: err} }, func(ctx context.Context) error {
		return g.follow(ctx, election, afterRev, out)
	})
	return out
}

func (g *group) follow(ctx context.Context, election string, afterRev int64, out chan<- elector.Observation) error {
	send := func(o elector.Observation) error {
		select {
		case out <- o:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	sub := &groupSub{election: election, wake: make(chan struct{}, 1)}
	if afterRev <= 0 {
		o, obj, err := g.b.read(ctx, election)
		if err != nil {
			return err
		}
		if err := send(o); err != nil {
			return err
		}
		afterRev = o.Revision
		sub.setObj(g.b, obj)
	} else if err := g.objectAt(ctx, sub, afterRev); err != nil {
		return err
	}
	sub.after = afterRev
	g.join(sub)
	defer g.leave(sub)
	var (
		followed elector.LeaseID
		gone     <-chan struct{}
		isGone   bool
		cleared  string // the resourceVersion of the object last cleared for a gone lease
	)
	for {
		g.mu.Lock()
		queue, failed, obj := sub.queue, sub.failed, sub.obj
		lease := elector.LeaseID(0)
		if sub.holder != nil {
			lease = sub.holder.Lease
		}
		sub.queue = nil
		g.mu.Unlock()
		if lease != followed {
			followed, gone, isGone = lease, nil, false
			if lease != 0 {
				gone = g.b.reaper.gone(ctx, g.b.leaseName(lease))
			}
		}
		for _, o := range queue {
			if o.Holder != nil && isGone && o.Holder.Lease == followed {
				continue // held by a lease that is gone: cleared below
			}
			if err := send(o); err != nil {
				return err
			}
		}
		if failed != nil {
			return failed
		}
		if isGone && obj != nil && obj.ResourceVersion != cleared {
			// The holder's lease went: clear the key if nobody changed it since, and
			// report the write when the stream brings it.
			cleared = obj.ResourceVersion
			if _, err := g.b.vacate(ctx, obj); err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
				return g.b.describe("update", err)
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-sub.wake:
		case <-gone:
			gone, isGone = nil, true
		}
	}
}

func (s *groupSub) setObj(b *Backend, obj *coordv1.Lease) {
	s.obj, s.holder, s.version = obj, b.holderOf(obj), 0
	if obj != nil {
		s.version, _ = parseRV(obj.ResourceVersion)
	}
}

// objectAt reads the election's object as it was at revision rev, into sub: the object a
// read or a campaign of this backend found at that very revision (the watch of a campaign
// loop's pass starts where its read ended), or else a list at rev.
func (g *group) objectAt(ctx context.Context, sub *groupSub, rev int64) error {
	if obj, ok := g.objectSeen(sub.election, rev); ok {
		sub.setObj(g.b, obj)
		return nil
	}
	leases, err := g.b.client()
	if err != nil {
		return err
	}
	opts := namedOpts(g.b.electionName(sub.election))
	opts.ResourceVersion, opts.ResourceVersionMatch = strconv.FormatInt(rev, 10), metav1.ResourceVersionMatchExact
	list, err := leases.List(ctx, opts)
	if apierrors.IsGone(err) || apierrors.IsResourceExpired(err) {
		return errWatchGap
	}
	if err != nil {
		return g.b.describe("list", err)
	}
	var obj *coordv1.Lease
	if len(list.Items) > 0 {
		obj = &list.Items[0]
	}
	sub.setObj(g.b, obj)
	return nil
}

// join adds sub to the stream, starting one from sub.after if none runs, and queues what
// the stream showed after sub.after.
func (g *group) join(sub *groupSub) {
	g.mu.Lock()
	defer g.mu.Unlock()
	st := g.st
	switch {
	case st == nil:
		st = g.startLocked(sub.after)
	case sub.after < st.dropped:
		// Watches start in the order their reads ended, not always the order of the
		// reads: watch again from the older revision, for everyone.
		st = g.restartLocked(st, sub.after)
	}
	for _, ev := range st.ring {
		g.applyLocked(st, sub, ev)
	}
	if st.subs[sub.election] == nil {
		st.subs[sub.election] = map[*groupSub]struct{}{}
	}
	st.subs[sub.election][sub] = struct{}{}
	st.index(sub, nil, sub.holder)
}

// leave removes sub; the stream stops with its last subscriber.
func (g *group) leave(sub *groupSub) {
	g.mu.Lock()
	defer g.mu.Unlock()
	st := g.st
	if st == nil || st.subs[sub.election] == nil {
		return
	}
	if _, ok := st.subs[sub.election][sub]; !ok {
		return
	}
	delete(st.subs[sub.election], sub)
	if len(st.subs[sub.election]) == 0 {
		delete(st.subs, sub.election)
	}
	st.index(sub, sub.holder, nil)
	if len(st.subs) == 0 {
		g.stopLocked(st, nil)
	}
}

// index moves sub from the set of the lease that held its key (from) to the set of the
// one that holds it now (to).
func (st *groupStream) index(sub *groupSub, from, to *elector.Holder) {
	if from != nil {
		if set := st.byLease[from.Lease]; set != nil {
			delete(set, sub)
			if len(set) == 0 {
				delete(st.byLease, from.Lease)
			}
		}
	}
	if to != nil {
		if st.byLease[to.Lease] == nil {
			st.byLease[to.Lease] = map[*groupSub]struct{}{}
		}
		st.byLease[to.Lease][sub] = struct{}{}
	}
}

// applyLocked queues what ev means to sub, if anything: a change of its key, or a beacon
// that counts for the key as its lease holds it.
func (g *group) applyLocked(st *groupStream, sub *groupSub, ev groupEvent) {
	if ev.rev <= sub.after {
		return
	}
	switch {
	case ev.election == sub.election:
		st.index(sub, sub.holder, ev.holder)
		sub.obj, sub.holder, sub.version = ev.obj, ev.holder, ev.rev
		sub.push(elector.Observation{Revision: ev.rev, Holder: ev.holder})
	case ev.beacon != nil && sub.holder != nil && sub.holder.Lease == ev.beacon.lease && ev.beacon.counts(sub.election, sub.version):
		sub.push(elector.Observation{Revision: ev.rev, Holder: sub.holder})
	default:
		return
	}
	sub.after = ev.rev
}

// movedPast reports whether the stream has shown election's key written after version.
func (st *groupStream) movedPast(election string, version int64) bool {
	for sub := range st.subs[election] {
		if sub.version > version {
			return true
		}
	}
	return false
}

// restartLocked replaces st with a stream from after the revision from, older than st's
// first, and moves st's subscribers over; each has seen what st showed it (sub.after), and
// the new stream shows it only what comes after. Heartbeats waiting for st write their
// keys instead.
func (g *group) restartLocked(st *groupStream, from int64) *groupStream {
	subs, byLease := st.subs, st.byLease
	st.subs, st.byLease = nil, nil
	g.stopLocked(st, nil)
	next := g.startLocked(from)
	next.subs, next.byLease = subs, byLease
	return next
}

// startLocked starts a watch of the group's objects from after the revision after. The
// API server's 410 Gone breaks it with errWatchGap, as it breaks the Watch of an election
// alone: a stream that resumed from a fresh list would merge a vacancy with heartbeats
// nobody saw.
func (g *group) startLocked(after int64) *groupStream {
	ctx, cancel := context.WithCancel(g.b.ctx)
	st := &groupStream{
		cancel: cancel, pos: after, dropped: after,
		subs:    map[string]map[*groupSub]struct{}{},
		byLease: map[elector.LeaseID]map[*groupSub]struct{}{},
		beats:   map[elector.LeaseID][]*beacon.Batch[int64]{},
	}
	g.st = st
	go func() {
		err := errors.New("kubernetes: the group's watch ended")
		if leases, cerr := g.b.client(); cerr != nil {
			err = cerr
		} else if werr := g.b.watchOn(ctx, leases, g.selector(), after, watchGap, func(ctx context.Context, ch <-chan event, from int64) (int64, error) {
			return g.events(ctx, st, ch, from)
		}); werr != nil && ctx.Err() == nil {
			err = werr
		}
		g.mu.Lock()
		g.stopLocked(st, err)
		g.mu.Unlock()
	}()
	return st
}

// events handles one watch's events until it ends; it returns the revision to resume from.
func (g *group) events(ctx context.Context, st *groupStream, ch <-chan event, from int64) (int64, error) {
	for {
		select {
		case <-ctx.Done():
			return from, ctx.Err()
		case ev, ok := <-ch:
			if ended, next, err := g.b.watchEnded(ctx, ev, ok, from, watchGap); ended {
				return next, err
			}
			from = max(from, ev.rev)
			if ev.obj == nil {
				continue // a bookmark
			}
			if ge, ok := g.event(ev); ok {
				g.process(st, ge)
			}
		}
	}
}

// event converts a watch event of the group's objects; ok is false for an object that is
// neither an election of the group nor a beacon.
func (g *group) event(ev event) (groupEvent, bool) {
	if ev.obj.Labels[labelKind] == kindBeacon {
		if ev.deleted {
			return groupEvent{}, false // with its lease, after its keys were cleared
		}
		bc, ok := decodeBeacon(ev.obj)
		return groupEvent{rev: ev.rev, beacon: &bc}, ok
	}
	election := ev.obj.Annotations[annElection]
	if ev.obj.Labels[labelKind] != kindElection || !strings.HasPrefix(election, g.name+".") || g.b.electionName(election) != ev.obj.Name {
		return groupEvent{}, false
	}
	ge := groupEvent{rev: ev.rev, election: election}
	if !ev.deleted {
		ge.obj, ge.holder = ev.obj, g.b.holderOf(ev.obj)
	}
	return ge, true
}

// process applies ev to the subscribers and the waiting heartbeats.
func (g *group) process(st *groupStream, ev groupEvent) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.st != st {
		return
	}
	st.ring = append(st.ring, ev)
	if n := len(st.ring); n > 2*ringSize {
		st.dropped = st.ring[n-ringSize-1].rev
		st.ring = append(st.ring[:0], st.ring[n-ringSize:]...)
	}
	st.pos = ev.rev
	if ev.election != "" {
		for sub := range st.subs[ev.election] {
			g.applyLocked(st, sub, ev)
		}
		return
	}
	if !ev.beacon.holders {
		return // an Expire's write: no heartbeat
	}
	lease := ev.beacon.lease
	for _, batch := range st.beats[lease] {
		batch.Seen(ev.rev, st.judge(batch, ev)) // before the beacon moves sub.after
	}
	st.dropResolved(lease)
	for sub := range st.byLease[lease] {
		g.applyLocked(st, sub, ev)
	}
}

// judge answers each heartbeat of batch as of the beacon ev, from the subscribers of its
// key that have followed it since before the beacon: a term's key is its term's from its
// token until it is cleared, once, and the beacon vouches for it only if it counts for the
// key's version then.
func (st *groupStream) judge(batch *beacon.Batch[int64], ev groupEvent) map[string]beacon.Answer {
	answers := make(map[string]beacon.Answer, len(batch.Keys))
	for election, token := range batch.Keys {
		answer := beacon.Unknown
		for sub := range st.subs[election] {
			if sub.after >= ev.rev {
				continue // its state is the key's after the beacon
			}
			if sub.holder != nil && sub.holder.Token == token && sub.holder.Lease == batch.Lease {
				if ev.beacon.counts(election, sub.version) {
					answer = beacon.Held
				}
			} else {
				answer = beacon.Gone
			}
			break
		}
		answers[election] = answer
	}
	return answers
}

// heldBy counts the keys lease holds among those watched here.
func (st *groupStream) heldBy(lease elector.LeaseID) int {
	keys := map[string]bool{}
	for sub := range st.byLease[lease] {
		keys[sub.election] = true
	}
	return max(len(keys), 1)
}

func (st *groupStream) dropResolved(lease elector.LeaseID) {
	batches := st.beats[lease][:0]
	for _, b := range st.beats[lease] {
		if !b.Resolved() {
			batches = append(batches, b)
		}
	}
	if len(batches) == 0 {
		delete(st.beats, lease)
	} else {
		st.beats[lease] = batches
	}
}

// stopLocked ends st: its subscribers are told err (nothing if nil: they have all left),
// and the heartbeats waiting for it are answered "unknown", which makes them write their
// keys instead.
func (g *group) stopLocked(st *groupStream, err error) {
	if g.st != st {
		return
	}
	g.st = nil
	st.cancel()
	for _, subs := range st.subs {
		for sub := range subs {
			sub.failed = err
			sub.poke()
		}
	}
	for _, batches := range st.beats {
		for _, batch := range batches {
			batch.Resolve(nil, nil)
		}
	}
}

// seenObject is an election's object as a read or a write of this backend found it, at
// the store's revision rev, in the history of epoch (see revisions).
type seenObject struct {
	rev   int64
	epoch uint64
	obj   *coordv1.Lease // nil: no object; never changed once noted
}

// noteObject remembers obj as election's object at revision rev, found by a request that
// started at mark at, for the next Watch of a grouped election from rev (objectAt).
func (b *Backend) noteObject(at mark, election string, rev int64, obj *coordv1.Lease) {
	g := b.groupOf(election)
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.seen == nil {
		g.seen = map[string]seenObject{}
	}
	if cur, ok := g.seen[election]; ok && cur.epoch == at.epoch && cur.rev > rev {
		return // a later one is noted already
	}
	g.seen[election] = seenObject{rev: rev, epoch: at.epoch, obj: obj}
}

// objectSeen returns election's object at revision rev if a read or a write of this
// backend found it at exactly that revision, in the current history.
func (g *group) objectSeen(election string, rev int64) (*coordv1.Lease, bool) {
	epoch := g.b.revs.mark().epoch
	g.mu.Lock()
	defer g.mu.Unlock()
	s, ok := g.seen[election]
	if !ok || s.rev != rev || s.epoch != epoch {
		return nil, false
	}
	return s.obj, true
}
