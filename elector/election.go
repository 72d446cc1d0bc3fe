package elector

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// Election is one named election as seen by one candidate: it campaigns for the key, holds
// it, notices losing it, resigns it, and observes who else holds it.
//
// State flows one way: the campaign loop reads the store and publishes immutable Terms; the
// hot path (Enter, Check) loads the newest Term and reads the clock, and never waits on the
// store.
type Election struct {
	c    *Candidate
	name string

	term     atomic.Pointer[Term]
	inflight atomic.Int64 // admitted gated requests that have not finished
	// lastForwarded is when (Unix ns) a forwarded request last arrived during a handover.
	lastForwarded atomic.Int64
	// markKeys holds the MarkKeys of this instance's latest terms, newest first, so that
	// a forwarded request can be told from a forged one even when it arrives after the
	// term it was forwarded to has ended (it is then refused, not forwarded again).
	markKeys atomic.Pointer[[]termMarkKey]

	mu        sync.Mutex         // serialises publishing and the fields below
	changed   chan struct{}      // closed and replaced on every published change
	endTerm   context.CancelFunc // ends the Context of the term this instance holds
	handing   bool               // handing over: hold the key without admitting
	holdUntil time.Time          // campaign no sooner than this (after a resign)
	// standAsideFor names the instance a transfer goes to; until it is done (or times
	// out) this instance does not campaign.
	standAsideFor string
	// resignReason is the reason published when a resign lets go of the key.
	resignReason string
	// prev is the last term held by someone else that this instance saw, and settling
	// the token of this instance's own term while it waits for prev to be over.
	prev     observedTerm
	settling int64
	// campaign is the newest campaign request this instance sent: the record it wrote
	// and when it sent it. A term it wins starts its heartbeat deadline from there.
	campaign struct {
		rec  Record
		sent time.Time
	}
	// writeMu serialises this instance's writes of its own election key (heartbeats and the
	// handover announcement), so that a heartbeat never undoes the announcement.
	writeMu sync.Mutex
	// handoverAnnounced is the token of this instance's term whose handover has been
	// announced: its heartbeats keep the record's HandingOver mark.
	handoverAnnounced atomic.Int64
	// releasing is the token of this instance's term whose release has begun: that term
	// admits nothing any more (see Term.Releasing).
	releasing int64
	// transferHere is set while a transfer to this instance is pending: winning the key
	// completes it, and the intent is then cleared so that the others campaign again.
	transferHere bool

	announced LeaseID // the lease under which this candidate last announced itself (loop only)

	users     int // guarded by c.mu
	startOnce sync.Once
	stopOnce  sync.Once
	cancel    context.CancelFunc
	done      chan struct{}
	resync    chan struct{} // buffered: asks the loop to read the key again now
}

func newElection(c *Candidate, name string) *Election {
	e := &Election{
		c:       c,
		name:    name,
		changed: make(chan struct{}),
		done:    make(chan struct{}),
		resync:  make(chan struct{}, 1),
	}
	e.term.Store(&Term{Election: name, Self: c.cfg.ID, Reason: "starting", At: c.now(), end: ended})
	return e
}

// Name is the election's name.
func (e *Election) Name() string { return e.name }

// Candidate is the candidate taking part in this election.
func (e *Election) Candidate() *Candidate { return e.c }

// Term returns the newest snapshot of the election.
func (e *Election) Term() *Term { return e.term.Load() }

// Changed returns a channel that is closed at the next change of the election's Term.
func (e *Election) Changed() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.changed
}

// Check reports whether this instance may act as leader right now, with the Term it decided
// on. It does not count the request as in flight; use Enter for requests that a handover
// must wait for.
func (e *Election) Check() (*Term, bool) {
	t := e.term.Load()
	return t, t.Leading(e.c.now())
}

// Enter is Check for a request that will run under leadership: when it admits, the request is
// counted as in flight until the caller calls Exit, and a handover waits for it.
func (e *Election) Enter() (*Term, bool) {
	// Count first, then look: a handover publishes "draining" first, then reads the count.
	// Go's atomics are sequentially consistent, so either this request sees the draining
	// Term and backs out, or the handover sees this request's count and waits for it.
	e.inflight.Add(1)
	t := e.term.Load()
	if t.Leading(e.c.now()) {
		return t, true
	}
	e.inflight.Add(-1)
	return t, false
}

// EnterForwarded is Enter for a request that a peer has forwarded to this instance as to
// the holder of term token, with a mark the caller has verified against MarkKey(token).
// It is admitted only under that very term, and only once the term has settled (the
// predecessor may still admit until then); but it is admitted while the term drains too
// (the handover waits for it), since the peer has committed it here and may not send it
// anywhere else. Once the term's release has begun, nothing is admitted.
func (e *Election) EnterForwarded(token int64) (*Term, bool) {
	e.inflight.Add(1)
	t := e.term.Load()
	if t.lease != nil && t.Token == token && !t.Settling && !t.Releasing && t.inTime(e.c.now()) {
		if t.Draining {
			e.lastForwarded.Store(time.Now().UnixNano())
		}
		return t, true
	}
	e.inflight.Add(-1)
	return t, false
}

// termMarkKey is the MarkKey of one term of this instance.
type termMarkKey struct {
	token int64
	key   []byte
}

// keptMarkKeys is how many of its latest terms' MarkKeys an instance keeps.
const keptMarkKeys = 4

// MarkKey returns the MarkKey of this instance's own term token, if that is one of its
// latest terms: the secret a forwarded request's mark must be made with. It reads one
// atomic pointer and never waits.
func (e *Election) MarkKey(token int64) ([]byte, bool) {
	if keys := e.markKeys.Load(); keys != nil {
		for _, k := range *keys {
			if k.token == token {
				return k.key, true
			}
		}
	}
	return nil, false
}

// rememberMarkKeyLocked notes the MarkKey of this instance's term token. e.mu is held.
func (e *Election) rememberMarkKeyLocked(token int64, key string) {
	var keys []termMarkKey
	if old := e.markKeys.Load(); old != nil {
		keys = *old
	}
	if key == "" || len(keys) > 0 && keys[0].token == token {
		return
	}
	next := append([]termMarkKey{{token: token, key: []byte(key)}}, keys[:min(len(keys), keptMarkKeys-1)]...)
	e.markKeys.Store(&next)
}

// WaitSettled waits until requests can go somewhere (see Term.Settled) and returns that
// Term, or returns the newest Term and false when ctx ends first. It is how a gated
// request holds while no leader is known or a handover is under way.
func (e *Election) WaitSettled(ctx context.Context) (*Term, bool) {
	for {
		changed := e.Changed()
		t := e.term.Load()
		if t.Settled(e.c.now()) {
			return t, true
		}
		select {
		case <-ctx.Done():
			return e.term.Load(), false
		case <-changed:
		}
	}
}

// Healthy reports whether this instance is a working candidate of the election: it takes
// part (it has not left), and the store has confirmed its lease recently enough that the
// lease deadline is still ahead. A health check for a load balancer that should send
// traffic to every instance able to take over can use it.
func (e *Election) Healthy() bool {
	select {
	case <-e.done:
		return false // stopped
	default:
	}
	e.mu.Lock()
	leaving := e.holdUntil.Sub(e.c.now()) > forever/2
	e.mu.Unlock()
	if leaving {
		return false
	}
	e.c.mu.Lock()
	l := e.c.current
	e.c.mu.Unlock()
	return l != nil && l.valid(e.c.now())
}

// Exit ends a request admitted by Enter.
func (e *Election) Exit() { e.inflight.Add(-1) }

// InFlight is the number of admitted requests that have not finished.
func (e *Election) InFlight() int64 { return e.inflight.Load() }

// Start makes the election campaign (as soon as the candidate has a lease). Idempotent.
func (e *Election) Start() {
	e.startOnce.Do(func() {
		// Close waits for the loop, so it is registered under the same lock that Close
		// takes to mark the candidate closed.
		e.c.mu.Lock()
		defer e.c.mu.Unlock()
		if e.c.closed {
			return
		}
		ctx, cancel := context.WithCancel(e.c.ctx)
		e.mu.Lock()
		e.cancel = cancel
		e.mu.Unlock()
		e.c.loops.Add(2)
		go func() {
			defer e.c.loops.Done()
			e.run(ctx)
		}()
		go func() {
			defer e.c.loops.Done()
			e.followIntents(ctx)
		}()
	})
}

// Resign hands leadership over if this instance holds it: no new gated request is admitted,
// admitted ones get up to DrainTimeout to finish, then the key is deleted so that a follower
// takes over at once. This instance does not campaign again for holdOff (or longer, if an
// earlier resign asked for more). It blocks until the
// key is released or ctx ends; resigning a follower only sets the hold-off.
func (e *Election) Resign(ctx context.Context, holdOff time.Duration) error {
	err := e.handOver(ctx, holdOff)
	e.kick()
	return err
}

func (e *Election) handOver(ctx context.Context, holdOff time.Duration) error {
	e.mu.Lock()
	// A handover never shortens a hold-off already set: the campaign loop retries a
	// failed release with none of its own, and an instance that is leaving for good
	// must not campaign again once that release goes through.
	if until := e.c.now().Add(holdOff); until.After(e.holdUntil) {
		e.holdUntil = until
	}
	e.handing = true
	if e.resignReason == "" {
		e.resignReason = "resigned"
	}
	t := e.term.Load()
	if t.lease != nil {
		e.publishLocked(t.Leader, t.Token, t.lease, "handing over")
	}
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.handing = false
		e.resignReason = ""
		e.mu.Unlock()
	}()
	if t.lease == nil {
		return nil
	}
	// Tell the fleet first, so that peers stop forwarding here and hold their requests
	// for the successor; then let what is in flight (and what peers forwarded just
	// before they heard) finish; then let go.
	announced := e.announceHandover(ctx, t)
	drained, cancelDrain := context.WithTimeout(ctx, time.Duration(e.c.drainTimeout.Load())+handoverGrace)
	e.drain(drained, announced)
	// The release acknowledges the end of the term in the same transaction, and the
	// successor starts as soon as it sees that: close the term to every request first,
	// forwarded ones included, and for good, so that neither a failed release nor a lost
	// answer leaves it admitting. A forwarded request admitted between the drain's last
	// look and the close is waited for too (within the same drain timeout).
	e.mu.Lock()
	e.releasing = t.Token
	if cur := e.term.Load(); cur.lease == t.lease && cur.Token == t.Token {
		e.publishLocked(cur.Leader, cur.Token, cur.lease, "releasing")
	}
	e.mu.Unlock()
	e.drain(drained, time.Time{})
	cancelDrain()
	rctx, cancel := context.WithTimeout(ctx, e.c.requestTimeout)
	err := e.c.cfg.Backend.Release(rctx, e.name, t.Token, t.lease.id)
	cancel()
	if err != nil {
		e.c.storeFailed("release", err)
		return err
	}
	e.mu.Lock()
	if cur := e.term.Load(); cur.lease != nil && cur.Token == t.Token {
		e.publishLocked(Record{}, 0, nil, e.resignedReasonLocked())
	}
	e.mu.Unlock()
	return nil
}

// handoverGrace is how long a leader that announced its handover keeps accepting requests
// that peers forwarded before they heard of it: the announcement reaches peers through
// their etcd watch in about one round trip, and a request they sent just before is at most
// one network hop behind it. The grace starts again with every forwarded request that
// still arrives, so a slow peer extends it (up to DrainTimeout).
const handoverGrace = 25 * time.Millisecond

// announceHandover marks the leader record as handing over. It returns when the mark was
// written, or the zero time if it could not be (the handover then goes on without it).
func (e *Election) announceHandover(ctx context.Context, t *Term) time.Time {
	e.handoverAnnounced.Store(t.Token)
	if ok, err := e.writeRecord(ctx, t); err != nil || !ok {
		return time.Time{}
	}
	return time.Now()
}

// writeRecord rewrites the key of this instance's term t (its record as it won it, marked
// as handing over once that was announced) if the key is still t's, and moves t's heartbeat
// deadline on from the time the write was sent. Followers see every write through their
// watch; see beatWindow for why that matters. It reports whether the key was still t's.
func (e *Election) writeRecord(ctx context.Context, t *Term) (bool, error) {
	e.writeMu.Lock()
	defer e.writeMu.Unlock()
	rec := t.Leader
	rec.HandingOver = e.handoverAnnounced.Load() == t.Token
	rctx, cancel := context.WithTimeout(ctx, e.c.requestTimeout)
	defer cancel()
	sent := e.c.now()
	ok, err := e.c.cfg.Backend.Update(rctx, e.name, t.Token, rec.encode())
	if ok {
		t.beat.set(sent.Add(beatWindow(t.lease.granted)))
	}
	return ok, err
}

// keepBeating rewrites the key of this instance's term t after every renewal of its lease,
// and at once if the term has no heartbeat deadline yet, until the term ends. A failed
// heartbeat is tried again at the next renewal; the term stops admitting when its
// heartbeat deadline passes, as when its lease deadline passes.
func (e *Election) keepBeating(t *Term) {
	l := t.lease
	for {
		renewed := l.renewals()
		if t.beat.valid(e.c.now()) {
			select {
			case <-t.end.Done():
				return
			case <-l.lost:
				return
			case <-renewed:
			}
		}
		ok, err := e.writeRecord(t.end, t)
		switch {
		case t.end.Err() != nil:
			return
		case err != nil:
			e.c.storeFailed("heartbeat", err)
			select { // not at once again: wait for the next renewal
			case <-t.end.Done():
				return
			case <-l.lost:
				return
			case <-renewed:
			case <-l.renewals():
			}
		case !ok:
			return // the key is no longer this term's: the watch tells the loop
		}
	}
}

// resignedReasonLocked is why a handover let go of the key: resigned or transferred.
func (e *Election) resignedReasonLocked() string {
	if e.resignReason != "" {
		return e.resignReason
	}
	return "resigned"
}

// drain waits until no admitted request is in flight and the grace after the handover was
// announced has passed, or DrainTimeout or ctx ends.
func (e *Election) drain(ctx context.Context, announced time.Time) {
	// quiet reports whether peers have had the grace to stop forwarding here.
	quiet := func() bool {
		if announced.IsZero() {
			return true
		}
		last := max(announced.UnixNano(), e.lastForwarded.Load())
		return time.Since(time.Unix(0, last)) >= handoverGrace
	}
	if e.inflight.Load() <= 0 && quiet() {
		return
	}
	deadline := time.NewTimer(time.Duration(e.c.drainTimeout.Load()))
	defer deadline.Stop()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for e.inflight.Load() > 0 || !quiet() {
		select {
		case <-ctx.Done():
			return
		case <-deadline.C:
			e.c.log().Warn("drain timeout: releasing leadership with gated requests still in flight",
				zap.String("election", e.name), zap.Int64("in_flight", e.inflight.Load()))
			return
		case <-tick.C:
		}
	}
}

// stop hands leadership over for good and ends the campaign loop. If the release fails, it
// is retried in the background: the candidate's lease lives on for its other elections, and
// the key bound to it would otherwise keep every other instance out for good.
func (e *Election) stop() {
	e.stopOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), e.c.HandoverTimeout())
		defer cancel()
		held := e.term.Load()
		err := e.handOver(ctx, forever)
		e.mu.Lock()
		stopLoop := e.cancel
		e.mu.Unlock()
		if stopLoop != nil {
			stopLoop()
			<-e.done
		}
		e.publishAlone("election no longer configured")
		if err != nil && held.lease != nil {
			e.c.retryRelease(e.name, held.Token, held.lease)
		}
	})
}

// kick asks the campaign loop to read the key again without waiting for the watch.
func (e *Election) kick() {
	select {
	case e.resync <- struct{}{}:
	default:
	}
}

// heldOff reports whether this instance must stay out of the election now, and for how
// long at most (forever while it stands aside for a transfer, which kick ends).
func (e *Election) heldOff() (time.Duration, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.standAsideFor != "" {
		return forever, true
	}
	d := e.holdUntil.Sub(e.c.now())
	return d, d > 0
}

// run is the campaign loop: take the key if nobody holds it, else watch it until it is
// deleted, and start over whenever the lease or the watch is lost.
func (e *Election) run(ctx context.Context) {
	defer close(e.done)
	retry := newBackoff(100*time.Millisecond, min(5*time.Second, e.c.cfg.TTL))
	for {
		l := e.c.waitLease(ctx)
		if l == nil {
			return
		}
		e.announce(ctx, l)
		obs, err := e.read(ctx, l)
		if err == nil {
			retry.reset()
			e.observe(obs, l, false)
			if t := e.term.Load(); t.lease != nil {
				if _, held := e.heldOff(); held || t.Releasing {
					// A resign whose release failed: keep trying to let go.
					_ = e.handOver(ctx, 0)
				}
			}
			err = e.follow(ctx, l, obs.Revision)
		}
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			e.c.storeFailed("campaign", err)
			e.lostContact(l)
			if !e.pause(ctx, l, retry) {
				return
			}
		}
	}
}

// read campaigns for the key, or only looks at it while held off after a resign.
func (e *Election) read(ctx context.Context, l *lease) (Observation, error) {
	rctx, cancel := context.WithTimeout(ctx, e.c.requestTimeout)
	defer cancel()
	if _, held := e.heldOff(); held {
		return e.c.cfg.Backend.Observe(rctx, e.name)
	}
	rec := Record{ID: e.c.cfg.ID, URL: e.c.cfg.URL, Since: time.Now(), MarkKey: newMarkKey(), TTL: l.granted}
	e.mu.Lock()
	e.campaign.rec, e.campaign.sent = rec, e.c.now()
	e.mu.Unlock()
	return e.c.cfg.Backend.Campaign(rctx, e.name, rec.encode(), l.id)
}

// follow watches the key from after rev and publishes what it sees. It returns nil when the
// loop should read the key again now (key deleted, lease lost, hold-off over, resync asked),
// or the error that broke the watch.
func (e *Election) follow(ctx context.Context, l *lease, rev int64) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	changes := e.c.cfg.Backend.Watch(wctx, e.name, rev)

	var holdOver <-chan time.Time
	if d, held := e.heldOff(); held && d < forever/2 {
		t := time.NewTimer(d)
		defer t.Stop()
		holdOver = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-l.lost:
			// Renewals failed for a whole lease (or the store dropped it): what the
			// watch showed may be stale too, until the key is read again.
			e.loseLease(l)
			e.lostContact(l)
			return nil
		case <-holdOver:
			return nil
		case <-e.resync:
			return nil
		case o, ok := <-changes:
			if !ok {
				return errWatchClosed
			}
			if o.Err != nil {
				return o.Err
			}
			e.observe(o, l, true)
			if o.Holder == nil {
				return nil // vacant: campaign at once
			}
		}
	}
}

type watchClosed struct{}

func (watchClosed) Error() string { return "watch closed by the store" }

var errWatchClosed error = watchClosed{}

// pause waits out one backoff step after a failed read; it returns false if ctx ended. If
// the lease is lost meanwhile, leadership is given up, and the leader forgotten, at once
// rather than after the wait.
func (e *Election) pause(ctx context.Context, l *lease, retry *backoff) bool {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-l.lost:
			e.loseLease(l)
			e.lostContact(l)
		case <-wctx.Done():
		}
	}()
	return retry.wait(ctx)
}

// observe publishes what an observation of the key says, as seen with lease l; watched says
// whether it came through the watch, which shows every change in order, rather than a read.
func (e *Election) observe(o Observation, l *lease, watched bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	old := e.term.Load()
	h := o.Holder
	if h == nil {
		// Seen through the watch, the vacancy comes after every write of the previous
		// holder; through a read, writes since the last one seen may have been missed.
		e.prev.vacated = watched
		reason := "key vacant"
		switch {
		case old.lease != nil && e.handing:
			reason = e.resignedReasonLocked() // our own release, seen through the watch first
		case old.lease != nil:
			reason = "key deleted"
		}
		if old.LeaderKnown() || old.lease != nil || old.Reason == "starting" {
			e.publishLocked(Record{}, 0, nil, reason)
		}
		if old.lease != nil && !e.handing {
			e.acknowledgeEnd(old)
		}
		return
	}
	rec, err := decodeRecord(h.Value)
	if err != nil {
		e.c.log().Warn("election key holds a value this plugin did not write",
			zap.String("election", e.name), zap.Error(err))
		rec = Record{ID: "?"}
	}
	var mine *lease
	select {
	case <-l.lost:
	default:
		if h.Lease == l.id {
			mine = l
		}
	}
	if mine == nil && rec.ID == e.c.cfg.ID && !e.c.ours(h.Lease) {
		e.c.log().Error("another process holds this election under the same instance_id; the lease decides, so this one stays a follower: give every instance its own instance_id",
			zap.String("election", e.name), zap.String("instance_id", rec.ID), zap.Int64("their_lease", int64(h.Lease)))
	}
	if mine == nil {
		e.prev.saw(h, rec, e.c.now())
	}
	if old.lease == mine && old.Token == h.Token && old.Leader == rec {
		return // nothing new (a heartbeat)
	}
	if e.standAsideFor != "" && rec.ID == e.standAsideFor && !rec.HandingOver {
		e.standAsideFor = "" // the transfer this instance stood aside for is done
	}
	newTerm := mine != nil && (old.lease != mine || old.Token != h.Token)
	if newTerm {
		// A new term of ours. If the key was taken from a holder that may not have
		// noticed yet (an operator deleted the key or revoked its lease, say), admit
		// nothing until it is confirmed to have stopped.
		if p := e.prev; p.token != 0 && p.token != h.Token && !e.c.own(p.lease) {
			e.settling = h.Token
			go e.settle(h.Token, p.token, p.stoppedBy(e.c.now(), max(e.c.cfg.TTL, l.granted)))
		}
		e.prev = observedTerm{} // over, once this term settles
	}
	var reason string
	switch {
	case mine != nil && old.lease == mine && old.Token == h.Token:
		reason = "leader record updated"
	case mine != nil:
		reason = "elected"
		if e.transferHere {
			e.transferHere = false
			go e.clearIntent(e.c.ctx)
		}
	case old.lease != nil:
		reason = "key taken over"
	case old.Token == h.Token && rec.HandingOver:
		reason = "leader handing over"
	case old.Token == h.Token:
		reason = "leader record updated"
	default:
		reason = "new leader observed"
	}
	e.publishLocked(rec, h.Token, mine, reason)
	if newTerm {
		go e.keepBeating(e.term.Load())
	}
	if old.lease != nil && mine == nil && !e.handing {
		e.acknowledgeEnd(old)
	}
}

// observedTerm is what this instance knows of a term held by another instance.
type observedTerm struct {
	token int64
	lease LeaseID
	ttl   time.Duration // the TTL its record gave; zero if it gave none
	// seen is when this instance last saw the term's key (a write of its holder), and
	// vacated whether it then saw, through the watch, the key go away.
	seen    time.Time
	vacated bool
}

// saw notes an observation, at now, of the key held by h with record rec.
func (p *observedTerm) saw(h *Holder, rec Record, now time.Time) {
	if p.token != h.Token {
		*p = observedTerm{token: h.Token, lease: h.Lease, ttl: rec.TTL}
	}
	p.seen, p.vacated = now, false
}

// stoppedBy is when the holder of the term has certainly stopped admitting, by this host's
// clock, judged at now when the key has just been taken from it; fallbackTTL stands in for
// a record that gave no TTL. The holder admits for at most beatWindow after sending its
// last heartbeat, and that write reached this instance no earlier than it was sent. If the
// key's going away was seen through the watch, every heartbeat before it was seen too, so
// the last one seen is the last one sent; otherwise the last may have been missed, but it
// was sent before the key went away, so before now.
func (p observedTerm) stoppedBy(now time.Time, fallbackTTL time.Duration) time.Time {
	ttl := p.ttl
	if ttl <= 0 {
		ttl = fallbackTTL
	}
	from := now
	if p.vacated {
		from = p.seen
	}
	return from.Add(beatWindow(ttl) + safetyMargin(ttl))
}

// loseLease steps down because the lease under which the key was held is gone.
func (e *Election) loseLease(l *lease) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if t := e.term.Load(); t.lease == l {
		e.publishLocked(Record{}, 0, nil, "lease lost")
	}
}

// lostContact forgets the leader once the key cannot be read and this instance has been out
// of touch with the store for a whole lease (l is no longer valid). Before that, the leader
// last seen most likely still leads: a brief outage, such as etcd electing a new raft leader,
// should not leave redirects and forwarded requests without a target. After it, a stale
// leader is worse than none. A key held under a still-valid lease stays held.
func (e *Election) lostContact(l *lease) {
	if l.valid(e.c.now()) {
		return // pause and follow call again when l is given up
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if t := e.term.Load(); t.lease == nil && t.LeaderKnown() {
		e.publishLocked(Record{}, 0, nil, "etcd unreachable")
	}
}

// publishAlone publishes that this instance neither holds nor knows anything any more.
func (e *Election) publishAlone(reason string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.publishLocked(Record{}, 0, nil, reason)
}

// publishLocked makes a new Term current and wakes whoever waits for a change. e.mu is held.
func (e *Election) publishLocked(leader Record, token int64, held *lease, reason string) {
	old := e.term.Load()
	if held == nil {
		e.settling = 0 // no term of ours to settle (or release) any more
		e.releasing = 0
	} else {
		e.rememberMarkKeyLocked(token, leader.MarkKey)
	}
	t := &Term{
		Election:  e.name,
		Self:      e.c.cfg.ID,
		Leader:    leader,
		Token:     token,
		Draining:  held != nil && e.handing,
		Settling:  held != nil && token == e.settling,
		Releasing: held != nil && token == e.releasing,
		Reason:    reason,
		At:        e.c.now(),
		lease:     held,
		end:       ended,
	}
	switch {
	case held != nil && old.lease == held && old.Token == token:
		t.end, t.beat = old.end, old.beat // the same term goes on
	default:
		if e.endTerm != nil {
			e.endTerm()
			e.endTerm = nil
		}
		if held != nil {
			t.end, e.endTerm = context.WithCancel(context.Background())
			// The campaign that created the key was the term's first heartbeat.
			t.beat = &deadline{}
			if c := e.campaign; !c.sent.IsZero() && c.rec.MarkKey == leader.MarkKey {
				t.beat.set(c.sent.Add(beatWindow(held.granted)))
			}
		}
	}
	e.term.Store(t)
	close(e.changed)
	e.changed = make(chan struct{})
	if o := e.c.observe(); o != nil {
		o.TermChanged(e, old, t)
	}

	log := e.c.log()
	fields := []zap.Field{
		zap.String("election", e.name), zap.String("self", t.Self),
		zap.String("leader", t.Leader.ID), zap.Int64("token", t.Token), zap.String("reason", reason),
	}
	switch {
	case held != nil && t.Settling && old.lease == nil:
		log.Info("won the election; waiting for the previous leader to stop", fields...)
	case held != nil && !t.Settling && (old.lease == nil || old.Settling):
		log.Info("became leader", fields...)
	case held == nil && old.lease != nil:
		log.Info("stepped down", fields...)
	case t.Draining && !old.Draining:
		log.Info("handing leadership over", fields...)
	case t.Leader.ID != old.Leader.ID || t.Token != old.Token:
		log.Info("leader changed", fields...)
	}
}

// settle waits until the holder of the previous term (prevToken) is known to have stopped,
// then lets this instance's term (token) admit. The previous holder acknowledges as soon as
// its watch shows it the key is gone and its admitted requests are done. If it cannot (it
// is cut off, or its lease was revoked under it), its heartbeat deadline runs out by
// stoppedBy (see observedTerm.stoppedBy). Either way there is no moment at which both
// admit. The lease's absence proves nothing: a revoked lease vanishes while its holder's
// deadline is still ahead, and the store cannot tell revoked from expired.
func (e *Election) settle(token, prevToken int64, stoppedBy time.Time) {
	retry := newBackoff(10*time.Millisecond, 250*time.Millisecond)
	for {
		rctx, cancel := context.WithTimeout(e.c.ctx, min(e.c.requestTimeout, max(10*time.Millisecond, stoppedBy.Sub(e.c.now()))))
		released, err := e.c.cfg.Backend.Released(rctx, e.name, prevToken, 0)
		cancel()
		if !released && !e.c.now().Before(stoppedBy) {
			released, err = true, nil
		}
		e.mu.Lock()
		if e.settling != token {
			e.mu.Unlock()
			return // the term ended meanwhile
		}
		if released {
			e.settling = 0
			if cur := e.term.Load(); cur.lease != nil && cur.Token == token {
				e.publishLocked(cur.Leader, cur.Token, cur.lease, "elected")
			}
			e.mu.Unlock()
			return
		}
		e.mu.Unlock()
		if err != nil {
			e.c.storeFailed("settle", err)
		}
		if !retry.waitAtMost(e.c.ctx, stoppedBy.Sub(e.c.now())) {
			return
		}
	}
}

// acknowledgeEnd records, once this instance's admitted requests of the ended term are
// done, that it stopped acting as leader of that term, so that a successor that is
// waiting (see settle) may start.
func (e *Election) acknowledgeEnd(ended *Term) {
	go func() {
		ctx, cancel := context.WithTimeout(e.c.ctx, e.c.HandoverTimeout())
		defer cancel()
		e.drain(ctx, time.Time{})
		retry := newBackoff(50*time.Millisecond, time.Second)
		for {
			rctx, rcancel := context.WithTimeout(ctx, e.c.requestTimeout)
			err := e.c.cfg.Backend.Acknowledge(rctx, e.name, ended.Token, ended.lease.id)
			rcancel()
			if err == nil || !retry.wait(ctx) {
				return
			}
		}
	}()
}
