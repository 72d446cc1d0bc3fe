package elector

import (
	"context"
	"time"
)

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
	t, _, ok := e.EnterAt()
	return t, ok
}

// EnterAt is Enter, and also returns the moment (the election's clock, read once) at which
// the request was admitted or refused: a request can carry when, and until when, its term
// let it in (see Term.Remaining).
func (e *Election) EnterAt() (*Term, time.Time, bool) {
	// Count first, then look: a handover publishes "draining" first, then reads the count.
	// Go's atomics are sequentially consistent, so either this request sees the draining
	// Term and backs out, or the handover sees this request's count and waits for it.
	e.inflight.Add(1)
	t, now := e.term.Load(), e.c.now()
	if t.Leading(now) {
		return t, now, true
	}
	e.Exit() // a drain may be waiting for this very count
	return t, now, false
}

// EnterForwarded is Enter for a request that a peer has forwarded to this instance as to
// the holder of term token, with a mark the caller has verified against MarkKey(token).
// It is admitted only under that very term, once the term has settled (the predecessor
// may still admit until then), and not while it drains: peers learn of a handover only
// from the release, so they go on forwarding here until then, and a drain that admitted
// what they send would not end while the load lasts. A refused request is answered with
// NotLeaderHeader and the peer sends it on to the successor.
func (e *Election) EnterForwarded(token int64) (*Term, bool) {
	t, _, ok := e.EnterForwardedAt(token)
	return t, ok
}

// EnterForwardedAt is EnterForwarded with the moment of the decision, as EnterAt.
func (e *Election) EnterForwardedAt(token int64) (*Term, time.Time, bool) {
	e.inflight.Add(1)
	t, now := e.term.Load(), e.c.now()
	if t.Token == token && t.Leading(now) {
		return t, now, true
	}
	e.Exit()
	return t, now, false
}

// Exit ends a request admitted by Enter. The last one out wakes a drain that waits.
func (e *Election) Exit() {
	if e.inflight.Add(-1) == 0 && e.drainers.Load() > 0 {
		e.wakeDrains()
	}
}

// InFlight is the number of admitted requests that have not finished.
func (e *Election) InFlight() int64 { return e.inflight.Load() }

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
