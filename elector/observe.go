package elector

import (
	"context"

	"go.uber.org/zap"
)

// observe publishes what an observation of the key says, as seen with lease l; watched says
// whether it came through the watch, which shows every change in order, rather than a read.
func (e *Election) observe(o Observation, l *lease, watched bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	old := e.term.Load()
	h := o.Holder
	if h == nil {
		// Seen through the watch, the vacancy comes after every write of the previous
		// holder; through a read, writes since the last one seen may have been missed,
		// and terms may have come and gone unseen since.
		if watched {
			e.prev.vacated = true
		} else {
			e.prev.readSince = true
		}
		reason := "key vacant"
		switch {
		case old.lease != nil && e.handing == old.Token:
			reason = e.resignedReasonLocked() // our own release, seen through the watch first
		case old.lease != nil:
			reason = "key deleted"
		}
		if old.LeaderKnown() || old.lease != nil || old.Reason == "starting" {
			e.publishLocked(Record{}, 0, nil, reason)
		}
		if old.lease != nil && e.handing != old.Token {
			e.acknowledgeEnd(old, endedUnasked(old, e.c.now()))
		}
		return
	}
	rec, err := e.decoded.decode(h.Value)
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
	if mine != nil && h.Token <= e.letGo {
		// A write of a term this instance has released: a watch replaying the term's
		// heartbeats before its delete, or the key back after a store failover lost the
		// release. Let go of it (again): nobody else can win while it stands.
		e.releaseAgainLocked(h.Token, mine)
		return
	}
	if mine == nil {
		e.prev.saw(h, rec, e.c.now(), o.Revision)
		e.noteBeatLocked(h.Token, e.c.now())
		if rec.ID == e.c.cfg.ID && !e.c.ours(h.Lease) && e.previousProcessLocked(old, h, rec) {
			return
		}
	}
	if old.lease == mine && old.Token == h.Token && old.Leader == rec {
		return // nothing new (a heartbeat)
	}
	if e.standAsideFor != "" && rec.ID == e.standAsideFor && !rec.HandingOver {
		e.standAsideFor = "" // the transfer this instance stood aside for is done
	}
	newTerm := mine != nil && (old.lease != mine || old.Token != h.Token)
	if newTerm {
		// A new term of ours. Until its proof is complete (see proof), admit nothing:
		// the key may have been taken from a holder that has not noticed yet (an
		// operator deleted the key or revoked its lease, say), that this instance never
		// saw at all, or that rides out a failsafe beyond the store's reach.
		p := e.proofLocked(h.Token, o, e.c.now(), e.waitTTL(l))
		e.own = ownTerm{token: h.Token, proof: p}
		e.namedPrev = named{token: o.Prev, at: e.c.now()}
		if o.PrevReleased {
			e.heard = endOfTerm{token: o.Prev, why: o.PrevWhy}
		}
		if _, failsafe := p.owes(); failsafe && p.fenceAs == h.Token {
			go e.proveNoFailsafe(p) // a fresh proof; an inherited one is looked for already
		}
		if !p.isProven() {
			e.settling = h.Token
			go e.settle(h.Token, p)
		}
		e.prev = observedTerm{} // over, once this term settles
	}
	var reason string
	switch {
	case mine != nil && old.lease == mine && old.Token == h.Token:
		reason = "leader record updated"
	case mine != nil:
		reason = "elected"
		if v := e.transferHere; v != nil {
			e.transferHere = nil
			go e.clearIntent(e.c.ctx, v)
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
		if t := e.term.Load(); !e.beatWithSet(t) {
			go e.keepBeating(t)
		}
		if e.c.cfg.Failsafe != nil {
			go e.keepFailsafe(e.term.Load())
		} else if e.c.cfg.Fence != nil {
			go e.retireRoster(e.term.Load())
		}
	}
	if old.lease != nil && mine == nil && e.handing != old.Token {
		e.acknowledgeEnd(old, endedUnasked(old, e.c.now()))
	}
}

// previousProcessLocked handles a key held under this instance's own id by a lease that
// no candidacy of this process holds. If the holder advertises this instance's own URL, it
// is this instance's previous process (killed and started again before its lease ran
// out): nobody to forward to, so no leader is published until its key goes, and the term
// is then waited out like any other (settle.go). It reports whether it handled the key
// that way; otherwise two instances share an id, which is logged. e.mu is held.
func (e *Election) previousProcessLocked(old *Term, h *Holder, rec Record) bool {
	if rec.URL != e.c.cfg.URL {
		if old.Token != h.Token {
			e.c.log().Error("another instance holds this election under the same instance_id but advertises another URL; the lease decides, so this one stays a follower: give every instance its own instance_id",
				zap.String("election", e.name), zap.String("instance_id", rec.ID), zap.String("their_url", rec.URL), zap.Int64("their_lease", int64(h.Lease)))
		}
		return false
	}
	if old.Reason == ReasonPreviousProcess {
		return true // a heartbeat of the same term
	}
	e.c.log().Warn("the election key is held by this instance's previous process (same instance_id and URL, another lease): no leader until its lease runs out, at most a ttl",
		zap.String("election", e.name), zap.String("instance_id", rec.ID), zap.Int64("token", h.Token), zap.Int64("their_lease", int64(h.Lease)))
	e.publishLocked(Record{}, 0, nil, ReasonPreviousProcess)
	return true
}

// ReasonPreviousProcess is the reason of a Term with no leader because the key is held by
// this instance's previous process, which did not let go before it ended.
const ReasonPreviousProcess = "key held by this instance's previous process; waiting for its lease to end"

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
		Draining:  held != nil && token == e.handing,
		Settling:  held != nil && token == e.settling,
		Releasing: held != nil && token == e.releasing,
		Reason:    reason,
		At:        e.c.now(),
		lease:     held,
		end:       ended,
	}
	var endOld context.CancelFunc
	switch {
	case held != nil && old.lease == held && old.Token == token:
		t.end, t.beat, t.proof, t.fs = old.end, old.beat, old.proof, old.fs // the same term goes on
	default:
		endOld, e.endTerm = e.endTerm, nil
		if held != nil {
			t.end, e.endTerm = context.WithCancel(context.Background())
			// The campaign that created the key was the term's first heartbeat.
			t.beat, t.fs = &deadline{}, &deadline{}
			t.proof = nothingOwed
			if e.own.token == token {
				t.proof = e.own.proof
			}
			if c := e.campaign; !c.sent.IsZero() && c.rec.MarkKey == leader.MarkKey {
				t.beat.set(c.sent.Add(beatWindow(held.granted)))
			}
		}
	}
	// Who held the key before: the history forgets it once this instance's term settles.
	before := e.other.rec.ID
	e.noteHistoryLocked(old, t)
	e.noteFailsafeLocked(t)
	e.term.Store(t)
	if endOld != nil {
		// Only now that the new Term is current: code that wakes on the old term's end
		// and asks who leads must not hear "this instance".
		endOld()
	}
	close(e.changed)
	e.changed = make(chan struct{})
	if m := e.shared.Load(); m != nil {
		m.reg.kickPreempts(m.shard) // the set's preempt loop looks at the new term
	}
	if o := e.c.observe(); o != nil {
		o.TermChanged(e, old, t)
	}

	e.logTermLocked(old, t, held, before, reason)
}

// logTermLocked logs the change from old to t, a term held under held (nil: not held by
// this instance) after a term of before's (an instance id, "" if none is known): at INFO
// for a plain election, at DEBUG for a shard, whose moves its set's MoveLog sums up
// instead. e.mu is held.
func (e *Election) logTermLocked(old, t *Term, held *lease, before, reason string) {
	moves := e.moveLog.Load()
	var msg string
	switch {
	case held != nil && t.Settling && old.lease == nil:
		msg = "won the election; waiting for the previous leader to stop"
	case held != nil && !t.Settling && (old.lease == nil || old.Settling):
		msg = "became leader"
		if moves != nil {
			moves.took(before)
		}
	case held == nil && old.lease != nil:
		msg = "stepped down"
		if moves != nil && !old.Settling {
			to := t.Leader.ID
			if to == t.Self {
				to = "" // its own key, not released yet: the taker comes later
			}
			moves.gave(e.name, to)
		}
	case t.Draining && !old.Draining:
		msg = "handing leadership over"
	case t.Leader.ID != old.Leader.ID || t.Token != old.Token:
		msg = "leader changed"
		if moves != nil {
			moves.ledBy(e.name, t.Leader.ID)
		}
	default:
		return
	}
	e.logMove(msg, zap.String("election", e.name), zap.String("self", t.Self),
		zap.String("leader", t.Leader.ID), zap.Int64("token", t.Token), zap.String("reason", reason))
}
