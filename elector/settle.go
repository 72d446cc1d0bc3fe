package elector

import (
	"context"
	"sync"
	"time"
)

// observedTerm is what this instance knows of a term held by another instance.
type observedTerm struct {
	token int64
	lease LeaseID
	ttl   time.Duration // the TTL its record gave; zero if it gave none
	// seen is when this instance last saw the term's key (a write of its holder), at
	// store revision rev, and vacated whether it then saw, through the watch, the key go
	// away.
	seen    time.Time
	rev     int64
	vacated bool
}

// saw notes an observation at store revision rev, at now, of the key held by h with
// record rec.
func (p *observedTerm) saw(h *Holder, rec Record, now time.Time, rev int64) {
	if p.token != h.Token {
		*p = observedTerm{token: h.Token, lease: h.Lease, ttl: rec.TTL}
	}
	p.seen, p.rev, p.vacated = now, rev, false
}

// silentBy is when the holder has certainly stopped admitting if the write this instance
// saw last (at rev) was its last: a heartbeat admits for beatWindow after it was sent, and
// it was sent before it was seen.
func (p observedTerm) silentBy(fallbackTTL time.Duration) time.Time {
	ttl := p.ttl
	if ttl <= 0 {
		ttl = fallbackTTL
	}
	return p.seen.Add(beatWindow(ttl) + safetyMargin(ttl))
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
	if p.vacated {
		return p.silentBy(fallbackTTL)
	}
	return now.Add(beatWindow(ttl) + safetyMargin(ttl))
}

// unseenStoppedBy is when every term that held the key before now, and that this instance
// never saw, has certainly stopped admitting: its holder's last heartbeat was sent before
// its key went away, so before now, and it admits for at most beatWindow after that. The
// holder's TTL is unknown; a fleet shares one (see docs/safety.md), so ttl stands in.
func unseenStoppedBy(now time.Time, ttl time.Duration) time.Time {
	return now.Add(beatWindow(ttl) + safetyMargin(ttl))
}

// ReasonPredecessorTimedOut is the reason of a Term that began admitting because its
// predecessor's heartbeat deadline passed without an acknowledgement (it crashed, was cut
// off, or lost its lease to an operator before it could say it stopped).
const ReasonPredecessorTimedOut = "elected; the previous leader's deadline passed"

// ReasonUnseenWaitedOut is the reason of a Term that began admitting once a TTL had passed
// since it found the key vacant, because it could not name or hear from the term before it
// (a fleet starting cold, a store gone back in time).
const ReasonUnseenWaitedOut = "elected; waited a ttl for any earlier term it could not see"

// predecessor is what a term of this instance must know before it admits: that every term
// before it has stopped admitting. It is proven when the term before it acknowledged its
// end (Released), or once stoppedBy has passed on this host's clocks. A term that ends
// before it is proven hands its predecessor on to whatever comes after it: this instance's
// next term waits for the same one, and an acknowledgement of the unproven term (a
// release, a handover) waits until stoppedBy, so that it never vouches for a moment at
// which the predecessor may still admit. Shared by every snapshot of the term.
type predecessor struct {
	token     int64 // the term to hear from; 0 when its token is unknown
	stoppedBy time.Time

	once   sync.Once
	proven chan struct{} // closed once the predecessor is known to have stopped
}

func newPredecessor(token int64, stoppedBy time.Time) *predecessor {
	return &predecessor{token: token, stoppedBy: stoppedBy, proven: make(chan struct{})}
}

// provenPredecessor is the predecessor of a term that has nothing to wait for.
var provenPredecessor = func() *predecessor {
	p := newPredecessor(0, time.Time{})
	p.prove()
	return p
}()

func (p *predecessor) prove() { p.once.Do(func() { close(p.proven) }) }

// isProven reports whether the predecessor is known to have stopped.
func (p *predecessor) isProven() bool {
	select {
	case <-p.proven:
		return true
	default:
		return false
	}
}

// wait blocks until the predecessor is known to have stopped, by its acknowledgement or by
// its deadline on this host's clock (now reads it), or until ctx ends; it reports whether it
// is known. It never asks the store: the term's settle loop does.
func (p *predecessor) wait(ctx context.Context, now func() time.Time) bool {
	for !p.isProven() {
		left := p.stoppedBy.Sub(now())
		if left <= 0 {
			p.prove()
			return true
		}
		// A short poll rather than one timer: the clock that counts may be a test's.
		timer := time.NewTimer(min(left, 100*time.Millisecond))
		select {
		case <-ctx.Done():
			timer.Stop()
			return false
		case <-p.proven:
		case <-timer.C:
		}
		timer.Stop()
	}
	return true
}

// predecessorLocked decides what the new term token of this instance, just won with
// observation o at now, must wait for before it admits. The store names the term before
// it (o.Prev) where it can; without that, the term this instance last saw held by someone
// else is taken for it, as it most likely is. A term this instance cannot account for is
// waited out: a holder it never saw stopped admitting at most a TTL after the key was
// found vacant. e.mu is held.
func (e *Election) predecessorLocked(token int64, o Observation, now time.Time, ttl time.Duration) *predecessor {
	seen, own := e.prev, e.own
	seenOther := seen.token != 0 && seen.token != token && !e.c.own(seen.lease)
	switch {
	case o.Prev != 0 && seenOther && o.Prev != seen.token:
		// The store names another term than the last one seen: one came and went unseen
		// (a newer Prev), or the store went back in time (an older one, whose old
		// acknowledgement proves nothing of the term seen). Wait both out.
		return newPredecessor(0, unseenStoppedBy(now, ttl))
	case o.Prev != 0 && o.Prev == own.token, o.Prev == 0 && seen.token == 0 && own.token != 0 && own.lastSeen:
		// This instance's own term came last: it stopped admitting before it campaigned
		// again, but what that term still waited for, this one waits for too.
		if own.pred != nil && !own.pred.isProven() {
			return own.pred
		}
		return provenPredecessor
	case seenOther && o.PrevReleased:
		return provenPredecessor // Prev is the term seen, and it acknowledged its end
	case seenOther:
		return newPredecessor(seen.token, seen.stoppedBy(now, ttl))
	case seen.token != 0 && seen.token != token && (o.Prev == 0 || o.Prev == seen.token):
		return provenPredecessor // a term under this candidate's own lease
	case o.PrevReleased:
		return provenPredecessor // never seen, but it acknowledged its end
	default:
		// Never seen: ask for its acknowledgement (a clean shutdown leaves one), and
		// otherwise wait it out.
		return newPredecessor(o.Prev, unseenStoppedBy(now, ttl))
	}
}

// ownTerm is the latest term this instance held, for its successor (most likely this
// instance again, after an operator deleted the key or the lease was lost).
type ownTerm struct {
	token int64
	pred  *predecessor
	// lastSeen is set while nothing of another holder was seen since this term ended.
	lastSeen bool
}

// settle waits until the predecessor of this instance's term token is known to have
// stopped, then lets the term admit. The previous holder acknowledges as soon as its watch
// shows it the key is gone and its admitted requests are done. If it cannot (it is cut
// off, or its lease was revoked under it), its heartbeat deadline runs out by stoppedBy
// (see observedTerm.stoppedBy). Either way there is no moment at which both admit. The
// lease's absence proves nothing: a revoked lease vanishes while its holder's deadline is
// still ahead, and the store cannot tell revoked from expired.
func (e *Election) settle(token int64, p *predecessor) {
	retry := newBackoff(10*time.Millisecond, 250*time.Millisecond)
	for {
		released := p.isProven()
		var err error
		if !released && p.token != 0 {
			rctx, cancel := context.WithTimeout(e.c.ctx, min(e.c.requestTimeout, max(10*time.Millisecond, p.stoppedBy.Sub(e.c.now()))))
			released, err = e.c.cfg.Backend.Released(rctx, e.name, p.token, 0)
			cancel()
		}
		reason := "elected"
		if !released && !e.c.now().Before(p.stoppedBy) {
			released, err, reason = true, nil, ReasonPredecessorTimedOut
			if p.token == 0 {
				reason = ReasonUnseenWaitedOut
			}
		}
		if released {
			p.prove()
		}
		e.mu.Lock()
		if e.settling != token {
			e.mu.Unlock()
			return // the term ended meanwhile; whoever comes next waits for p
		}
		if released {
			e.settling = 0
			if cur := e.term.Load(); cur.lease != nil && cur.Token == token {
				e.publishLocked(cur.Leader, cur.Token, cur.lease, reason)
			}
			e.mu.Unlock()
			return
		}
		e.mu.Unlock()
		if err != nil {
			e.c.storeFailed("settle", err)
		}
		if !retry.waitAtMost(e.c.ctx, p.stoppedBy.Sub(e.c.now())) {
			return
		}
	}
}
