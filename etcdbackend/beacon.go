package etcdbackend

import (
	"context"
	"errors"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/internal/beacon"
)

// Grouped heartbeats (elector.HeartbeatGrouper). The elections of a group (a shard set,
// <group>.<n>) live under one key prefix, and so does one beacon key per lease,
// <group>./beacons/<lease>, bound to the lease. A heartbeat of a key that holds the value
// last written puts the lease's beacon instead of the key: one put per lease and renewal
// for all the keys the lease holds in the group.
//
// One etcd watch of the prefix per group (a groupStream) shows the keys and the beacons in
// revision order. It serves every Watch of the group's elections, reporting a beacon as a
// change of each key its lease holds, and it tells a heartbeat whether its key was still
// the term's at the beacon's revision: the beacon proves the key alive only if the key was
// not deleted before it, and the ordered stream shows exactly that, without reading the
// keys. Expire compares the beacon's mod revision with the key's.

// GroupHeartbeats implements elector.HeartbeatGrouper.
func (b *Backend) GroupHeartbeats(name string) {
	b.groups.Join(name, func() *group {
		g := &group{b: b, name: name, prefix: b.Key(name + ".")}
		g.beats = beacon.Batcher[int64]{Mu: &g.mu, Send: g.sendBeacon}
		return g
	})
}

// groupOf returns the group of election, nil if it has none.
func (b *Backend) groupOf(election string) *group { return b.groups.Of(election) }

// ringSize is how many events, at least, a group's stream keeps for Watch calls that start from a
// revision it has already passed (every Watch follows a read, a moment earlier).
const ringSize = 16384

// beaconTimeout bounds one put of a beacon.
const beaconTimeout = 5 * time.Second

type group struct {
	b      *Backend
	name   string
	prefix string // of every key of the group's elections and of its beacons

	mu    sync.Mutex
	st    *groupStream          // nil while no Watch of the group runs
	beats beacon.Batcher[int64] // heartbeats by lease: election -> token
}

func (g *group) beaconKey(lease elector.LeaseID) string {
	return g.prefix + "/beacons/" + leaseHex(lease)
}

func leaseHex(id elector.LeaseID) string { return strconv.FormatInt(int64(id), 16) }

// groupEvent is one change the stream showed: of an election's key (holder nil when
// deleted), or a beacon put (election empty).
type groupEvent struct {
	rev      int64
	election string
	holder   *elector.Holder
	lease    elector.LeaseID // of the beacon
}

// groupStream is one watch of the group's prefix and what it has shown.
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

// groupSub is one Watch of an election of the group. The stream hands it what it shows
// straight into out, under g.mu: a set's thousands of watches need no goroutine each, and
// each change wakes only the campaign loop that reads it.
type groupSub struct {
	election string
	after    int64           // changes up to after are reported already, or not wanted
	holder   *elector.Holder // the key's holder as of max(after, the stream's pos)
	out      chan elector.Observation
	closed   bool   // out is closed; g.mu guards it
	wake     func() // tells the reader there is news on out, if it asked (WatchWaking)
}

// subBuffer is how many observations a watch holds for its reader. A reader that falls
// further behind on a change of its key has its watch closed, and reads the key again.
const subBuffer = 8

// push hands o to the reader (g.mu is held). A beacon that finds the buffer full is
// dropped: an observation of the same holder is still queued before it (the holder's own
// put, or an earlier beacon; a change of the key is never dropped), and the reader takes
// that one later than this beacon arrived, so it counts the holder heard from no earlier
// than this beacon would have; an Expire made on the older revision is refused by the
// guard (the beacon is newer). A change of the key that finds it full closes the watch.
func (s *groupSub) push(o elector.Observation, beacon bool) {
	if s.closed {
		return
	}
	select {
	case s.out <- o:
		s.woken()
	default:
		if !beacon {
			s.close(nil)
		}
	}
}

func (s *groupSub) woken() {
	if s.wake != nil {
		s.wake()
	}
}

// close ends the watch, with err first if there is room for it (g.mu is held).
func (s *groupSub) close(err error) {
	if s.closed {
		return
	}
	if err != nil {
		select {
		case s.out <- elector.Observation{Err: err}:
		default: // the reader finds the watch closed instead, and reads the key again
		}
	}
	s.closed = true
	close(s.out)
	s.woken()
}

// watchGrouped implements Watch for an election of group g. The holder of the key at
// afterRev is seen's, when the caller gives the observation it made there (known), or
// else read. The watch ends when ctx does. wake, if not nil, is called after each
// observation queued and when the watch closes (elector.WakingWatcher).
func (g *group) watchGrouped(ctx context.Context, election string, afterRev int64, seen *elector.Observation, wake func()) <-chan elector.Observation {
	sub := &groupSub{election: election, after: afterRev, out: make(chan elector.Observation, subBuffer), wake: wake}
	subscribe := func(h *elector.Holder) {
		sub.holder = h
		g.join(sub)
		context.AfterFunc(ctx, func() { g.leave(sub) })
	}
	if seen != nil {
		subscribe(seen.Holder)
		return sub.out
	}
	go func() {
		h, err := g.holderAt(ctx, election, afterRev)
		if err != nil {
			g.mu.Lock()
			sub.close(err)
			g.mu.Unlock()
			return
		}
		subscribe(h)
	}()
	return sub.out
}

// holderAt reads who held election's key at revision rev.
func (g *group) holderAt(ctx context.Context, election string, rev int64) (*elector.Holder, error) {
	cli, err := g.b.client(ctx)
	if err != nil {
		return nil, err
	}
	at := g.b.mark()
	resp, err := cli.Get(leaderCtx(ctx), g.b.Key(election), clientv3.WithRev(rev))
	if err != nil {
		return nil, g.b.describe(err)
	}
	if err := g.b.checked(at, resp.Header); err != nil {
		return nil, err
	}
	o, err := g.b.termChecked(at, election, observation(rev, resp.Kvs))
	return o.Holder, err
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
	// Only the events after sub.after can be news to it, and the ring is in revision
	// order: a set's moves start hundreds of watches while the ring holds thousands of
	// events: a scan of the whole ring for each took a sixth to a quarter of the CPU of
	// the instances taking a SIGTERMed owner's shards over.
	from := sort.Search(len(st.ring), func(i int) bool { return st.ring[i].rev > sub.after })
	for _, ev := range st.ring[from:] {
		g.applyLocked(st, sub, ev)
	}
	if st.subs[sub.election] == nil {
		st.subs[sub.election] = map[*groupSub]struct{}{}
	}
	st.subs[sub.election][sub] = struct{}{}
	st.index(sub, nil, sub.holder)
}

// leave removes sub and closes it; the stream stops with its last subscriber.
func (g *group) leave(sub *groupSub) {
	g.mu.Lock()
	defer g.mu.Unlock()
	sub.close(nil)
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

// applyLocked queues what ev means to sub, if anything: a change of its key, or a beacon of
// the lease that holds it.
func (g *group) applyLocked(st *groupStream, sub *groupSub, ev groupEvent) {
	if ev.rev <= sub.after {
		return
	}
	switch {
	case ev.election == sub.election:
		st.index(sub, sub.holder, ev.holder)
		sub.holder = ev.holder
		sub.push(elector.Observation{Revision: ev.rev, Holder: ev.holder}, false)
	case ev.election == "" && sub.holder != nil && sub.holder.Lease == ev.lease:
		sub.push(elector.Observation{Revision: ev.rev, Holder: sub.holder}, true)
	default:
		return
	}
	sub.after = ev.rev
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

// startLocked starts a watch of the group's prefix from after the revision after.
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
		broken := make(chan error, 1)
		watchKey(ctx, g.b, g.prefix, after, broken,
			func(at mark, evs []*clientv3.Event) ([]error, error) {
				events, err := g.events(at, evs)
				g.process(st, events)
				return nil, err
			},
			func(err error) error { return err },
			clientv3.WithPrefix())
		err := errors.New("etcd watch closed")
		select {
		case err = <-broken:
		default:
		}
		g.mu.Lock()
		g.stopLocked(st, err)
		g.mu.Unlock()
	}()
	return st
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
			sub.close(err)
		}
	}
	for _, batches := range st.beats {
		for _, batch := range batches {
			batch.Resolve(nil, nil)
		}
	}
}

// events converts a watch response's events of the group's keys and beacons; it stops at
// the first that fails the rewind checks and returns those before it with the error.
func (g *group) events(at mark, evs []*clientv3.Event) ([]groupEvent, error) {
	out := make([]groupEvent, 0, len(evs))
	for _, ev := range evs {
		rest := string(ev.Kv.Key[len(g.prefix):])
		switch {
		case strings.HasPrefix(rest, "/beacons/"):
			if ev.Type != clientv3.EventTypePut {
				continue // revoked with its lease, whose keys go in the same revision
			}
			id, err := strconv.ParseInt(strings.TrimPrefix(rest, "/beacons/"), 16, 64)
			if err != nil {
				continue
			}
			out = append(out, groupEvent{rev: ev.Kv.ModRevision, lease: elector.LeaseID(id)})
		case rest != "" && !strings.Contains(rest, "/"):
			election := g.name + "." + rest
			o := elector.Observation{Revision: ev.Kv.ModRevision}
			if ev.Type == clientv3.EventTypePut {
				o.Holder = holder(ev.Kv)
			}
			o, err := g.b.termChecked(at, election, o)
			if err != nil {
				return out, err
			}
			out = append(out, groupEvent{rev: o.Revision, election: election, holder: o.Holder})
		}
	}
	return out, nil
}

// process applies events, in order, to the subscribers and the waiting heartbeats.
func (g *group) process(st *groupStream, events []groupEvent) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.st != st {
		return
	}
	for _, ev := range events {
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
			continue
		}
		for _, batch := range st.beats[ev.lease] {
			batch.Seen(ev.rev, st.judge(batch, ev.rev)) // before the beacon moves sub.after
		}
		st.dropResolved(ev.lease)
		for sub := range st.byLease[ev.lease] {
			g.applyLocked(st, sub, ev)
		}
	}
}

// judge answers each heartbeat of batch as of the beacon at rev, from the subscribers of
// its key: a term's key is its term's from its token until it is deleted, once.
func (st *groupStream) judge(batch *beacon.Batch[int64], rev int64) map[string]beacon.Answer {
	answers := make(map[string]beacon.Answer, len(batch.Keys))
	for election, token := range batch.Keys {
		answer := beacon.Unknown
		for sub := range st.subs[election] {
			switch {
			case sub.holder != nil && sub.holder.Token == token && sub.holder.Lease == batch.Lease:
				answer = beacon.Held
			case sub.after < rev && answer == beacon.Unknown:
				answer = beacon.Gone // its state is the key's just before rev
			}
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

// beat answers a heartbeat of election's term token, held under lease, with a beacon.
func (g *group) beat(ctx context.Context, election string, token int64, lease elector.LeaseID) (beacon.Answer, error) {
	batch := g.addBeat(election, token, lease)
	if batch == nil {
		return beacon.Unknown, nil // nothing here watches the key: write it
	}
	return batch.Wait(ctx, election)
}

// addBeat adds a heartbeat of election's term token, held under lease, to the lease's next
// beacon and returns its batch; nil when nothing here watches the key (it must be written).
func (g *group) addBeat(election string, token int64, lease elector.LeaseID) *beacon.Batch[int64] {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.st == nil || len(g.st.subs[election]) == 0 {
		return nil
	}
	st := g.st
	return g.beats.Add(lease, election, token, func() int { return st.heldBy(lease) })
}

// sendBeacon puts batch's beacon; the stream answers its heartbeats when it shows the
// beacon (groupStream.judge).
func (g *group) sendBeacon(batch *beacon.Batch[int64]) {
	lease := batch.Lease
	g.mu.Lock()
	st := g.st
	if st == nil {
		batch.Resolve(nil, nil)
		g.mu.Unlock()
		return
	}
	st.beats[lease] = append(st.beats[lease], batch)
	g.mu.Unlock()

	rev, err := g.putBeacon(lease)

	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case err != nil:
		batch.Resolve(nil, err)
	case batch.Written(rev):
	case g.st != st || st.pos >= rev:
		batch.Resolve(nil, nil) // the stream broke, or passed the beacon unseen
	}
	if g.st == st {
		st.dropResolved(lease)
	}
}

// putBeacon writes lease's beacon and returns the revision of the write.
func (g *group) putBeacon(lease elector.LeaseID) (int64, error) {
	ctx, cancel := context.WithTimeout(g.b.ctx, beaconTimeout)
	defer cancel()
	cli, err := g.b.client(ctx)
	if err != nil {
		return 0, err
	}
	at := g.b.mark()
	resp, err := cli.Put(leaderCtx(ctx), g.beaconKey(lease), "", clientv3.WithLease(clientv3.LeaseID(lease)))
	if err != nil {
		return 0, g.b.describe(mapLeaseErr(err))
	}
	if err := g.b.checked(at, resp.Header); err != nil {
		return 0, err
	}
	return resp.Header.Revision, nil
}

// expireGuard is the comparison Expire adds for a key of group g: its holder's beacon
// unwritten since rev. It reads the key for its lease; ok is false if the key is no
// longer the term token's.
func (g *group) expireGuard(ctx context.Context, cli *clientv3.Client, election string, token, rev int64) (cmp clientv3.Cmp, ok bool, err error) {
	at := g.b.mark()
	resp, err := cli.Get(leaderCtx(ctx), g.b.Key(election))
	if err != nil {
		return cmp, false, g.b.describe(err)
	}
	if err := g.b.checked(at, resp.Header); err != nil {
		return cmp, false, err
	}
	if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != token {
		return cmp, false, nil
	}
	return clientv3.Compare(clientv3.ModRevision(g.beaconKey(elector.LeaseID(resp.Kvs[0].Lease))), "<", rev+1), true, nil
}

var (
	_ elector.HeartbeatGrouper = (*Backend)(nil)
	_ elector.HeartbeatBatcher = (*Backend)(nil)
)
