package elector

import (
	"context"
	"time"

	"go.uber.org/zap"
)

// writeRecord rewrites the key of this instance's term t (its record as it won it) if the
// key is still t's, and moves t's heartbeat deadline on from the time the write was sent. Followers see every write through their
// watch; see beatWindow for why that matters. It reports whether the key was still t's.
// A store that groups the election's heartbeats (HeartbeatGrouper) writes one beacon for
// all the keys the lease holds in the group instead, sent after this call began.
func (e *Election) writeRecord(ctx context.Context, t *Term) (bool, error) {
	e.writeMu.Lock()
	defer e.writeMu.Unlock()
	rec := t.Leader
	rctx, cancel := context.WithTimeout(ctx, e.c.requestTimeout)
	defer cancel()
	sent := e.c.now()
	ok, err := e.c.cfg.Backend.Update(rctx, e.name, t.Token, e.encoded.encode(rec))
	if ok {
		t.beat.set(sent.Add(beatWindow(t.lease.granted)))
	}
	return ok, err
}

// keepBeating rewrites the key of this instance's term t whenever a renewal of its lease is
// sent, and at once if the term has no heartbeat deadline yet, until the term ends. A
// heartbeat that is still on its way when the next renewal is sent is followed by another
// as soon as it is done; a failed one is tried again with the next renewal. The term stops
// admitting when its heartbeat deadline passes, as when its lease deadline passes.
func (e *Election) keepBeating(t *Term) {
	l := t.lease
	next := l.renewalSent()
	failed := false
	for {
		if now := e.c.now(); failed || t.beat.valid(now) {
			// The term is over when its heartbeat deadline passes (writes of the key fail
			// while renewals of the lease succeed: a full disk, a permission taken away).
			// A timer for the deadline as it is now: without failsafe the deadline only
			// moves later (with every heartbeat), so it is looked at again when the
			// timer fires. A failsafe's part of it may be cut short by a refusal, and
			// a test's clock may jump: their deadlines are polled. A shard set's held
			// shards have this loop each where the store cannot batch heartbeats (else
			// their set's loop: sharedbeat.go), and a poll every 100 ms cost a fleet 10
			// wake-ups a second per held shard for nothing.
			wait := max(t.beatHorizon(now), time.Millisecond)
			if !e.c.realClock || e.c.cfg.Failsafe != nil {
				wait = min(wait, 100*time.Millisecond)
			}
			beatOver := time.NewTimer(wait)
			select {
			case <-t.end.Done():
				beatOver.Stop()
				return
			case <-l.lost:
				beatOver.Stop()
				return
			case <-next:
				beatOver.Stop()
			case <-beatOver.C:
				if t.beatHorizon(e.c.now()) <= 0 && e.heartbeatLost(t) {
					return
				}
				continue
			}
		}
		next = l.renewalSent()
		ok, err := e.writeRecord(t.end, t)
		switch {
		case t.end.Err() != nil:
			return
		case err != nil:
			e.c.storeFailed("heartbeat", err) // tried again with the next renewal
		case !ok:
			e.keyGone(t)
			return
		}
		failed = err != nil
	}
}

// keyGone ends this instance's term t when a heartbeat found its key no longer t's (an
// operator deleted it, or its lease was revoked). The watch would say so too, but it may
// lag or have lost the event on a loaded host, and until then the term would go on
// admitting for up to a beatWindow; the store's answer is proof enough to stop. The
// campaign loop is asked to read the key again rather than wait for its watch. A term
// whose own handover deleted the key ends there instead.
func (e *Election) keyGone(t *Term) {
	e.mu.Lock()
	if cur := e.term.Load(); cur.lease == t.lease && cur.Token == t.Token && e.handing != t.Token {
		e.publishLocked(Record{}, 0, nil, "key deleted")
		e.acknowledgeEnd(t, endedUnasked(t, e.c.now())) // if the store takes it, the successor need not wait
	}
	e.mu.Unlock()
	e.kick()
}

// heartbeatLost ends this instance's term t once its heartbeat deadline has passed: it
// admits nothing any more either way, and a key held without heartbeats keeps every other
// instance out for as long as the lease lives. The lease is given up (and revoked), which
// takes the key, and the keys of the candidate's other elections, with it; a key that
// cannot be written can still go with its lease, and this instance holds off for a
// quarter ttl. It reports whether t was still the current term. A term whose first
// heartbeat has not been sent yet is not over.
func (e *Election) heartbeatLost(t *Term) bool {
	e.mu.Lock()
	cur := e.term.Load()
	if cur.lease != t.lease || cur.Token != t.Token || t.beat.mono.Load() == 0 {
		e.mu.Unlock()
		return cur.lease != t.lease || cur.Token != t.Token
	}
	e.publishLocked(Record{}, 0, nil, ReasonHeartbeatLost)
	e.acknowledgeEnd(t, EndedDeadlineMissed) // if the store takes it, the successor need not wait
	// Whatever kept this instance's writes from the store (a full disk, a slow link) may
	// well still be there: it stays out for a moment, so that a peer that saw the key go
	// wins it rather than this instance again, whose new lease would be granted at once
	// and whose next term would end the same way. Alone, it campaigns again after the
	// moment.
	if until := e.c.now().Add(e.c.cfg.TTL / 4); until.After(e.holdUntil) {
		e.holdUntil = until
	}
	e.mu.Unlock()
	e.c.log().Warn("term over: no heartbeat reached the store before the heartbeat deadline; giving up the lease so that another instance can lead",
		zap.String("election", e.name), zap.Int64("token", t.Token))
	t.lease.giveUpBecause(ReasonHeartbeatLost)
	return true
}

// ReasonHeartbeatLost is why a term ends when its key could not be rewritten in time.
const ReasonHeartbeatLost = "heartbeat deadline passed"
