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
	if mine != nil && h.Token <= e.letGo {
		return // a replayed write of a term this instance has released; its delete follows
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
		e.startProofLocked(h.Token)
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
		if e.c.cfg.Failsafe != nil {
			go e.keepFailsafe(e.term.Load())
		}
	}
	if old.lease != nil && mine == nil && !e.handing {
		e.acknowledgeEnd(old)
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
		Settling:  held != nil && (token == e.settling || token == e.fs.proving),
		Releasing: held != nil && token == e.releasing,
		Reason:    reason,
		At:        e.c.now(),
		lease:     held,
		end:       ended,
	}
	switch {
	case held != nil && old.lease == held && old.Token == token:
		t.end, t.beat, t.fs = old.end, old.beat, old.fs // the same term goes on
	default:
		if e.endTerm != nil {
			e.endTerm()
			e.endTerm = nil
		}
		if held != nil {
			t.end, e.endTerm = context.WithCancel(context.Background())
			// The campaign that created the key was the term's first heartbeat.
			t.beat, t.fs = &deadline{}, &deadline{}
			if c := e.campaign; !c.sent.IsZero() && c.rec.MarkKey == leader.MarkKey {
				t.beat.set(c.sent.Add(beatWindow(held.granted)))
			}
		}
	}
	e.noteHistoryLocked(old, t)
	e.noteFailsafeLocked(t)
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
