package elector

import (
	"context"
	"time"
)

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

// ReasonPredecessorTimedOut is the reason of a Term that began admitting because its
// predecessor's heartbeat deadline passed without an acknowledgement (it crashed, was cut
// off, or lost its lease to an operator before it could say it stopped).
const ReasonPredecessorTimedOut = "elected; the previous leader's deadline passed"

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
		reason := "elected"
		if !released && !e.c.now().Before(stoppedBy) {
			released, err, reason = true, nil, ReasonPredecessorTimedOut
		}
		e.mu.Lock()
		if e.settling != token {
			e.mu.Unlock()
			return // the term ended meanwhile
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
		if !retry.waitAtMost(e.c.ctx, stoppedBy.Sub(e.c.now())) {
			return
		}
	}
}
