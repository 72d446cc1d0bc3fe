package elector

import (
	"context"
	"sync"
	"time"
)

// A shard set's held terms are kept alive from one loop per set and lease, not a loop per
// held shard, when the store carries many heartbeats in one request (HeartbeatBatcher): at
// every renewal the loop sends every held key's heartbeat in one UpdateAll, and it keeps
// one timer, for the earliest heartbeat deadline. An instance holding 800 shards of a set
// woke 800 loops at every renewal, each with a timer and a request of its own; that was a
// third of an idle instance's CPU. Each term's heartbeat, deadline and end are what
// keepBeating gives a plain election's term.

// setBeats is a set's terms that beat together, by lease.
type setBeats struct {
	mu     sync.Mutex
	leases map[*lease]*leaseBeats
}

// leaseBeats is the set's terms held under one lease, and its loop's state.
type leaseBeats struct {
	terms  map[*Election]*beatingTerm
	kick   chan struct{} // a term was added
	closed bool          // the loop has ended: a term added now needs a new one
}

// beatingTerm is a held term in its set's loop; failed is touched by the loop alone.
type beatingTerm struct {
	e      *Election
	t      *Term
	failed bool // its last heartbeat failed: the next goes with the next renewal
}

// beatWithSet hands t's heartbeats to its set's loop, and reports false when e beats on
// its own (not a set's shard, or a store that cannot batch them).
func (e *Election) beatWithSet(t *Term) bool {
	m := e.shared.Load()
	hb, ok := e.c.cfg.Backend.(HeartbeatBatcher)
	if m == nil || !ok {
		return false
	}
	m.reg.beats.add(m.reg.c, e, t, hb)
	return true
}

// add adds term t of e to the loop of t's lease, starting that loop if it has none.
func (s *setBeats) add(c *Candidate, e *Election, t *Term, hb HeartbeatBatcher) {
	s.mu.Lock()
	defer s.mu.Unlock()
	lb := s.leases[t.lease]
	if lb == nil || lb.closed {
		lb = &leaseBeats{terms: map[*Election]*beatingTerm{}, kick: make(chan struct{}, 1)}
		if s.leases == nil {
			s.leases = map[*lease]*leaseBeats{}
		}
		s.leases[t.lease] = lb
		c.loops.Add(1)
		go func() {
			defer c.loops.Done()
			s.run(c, t.lease, lb, hb)
		}()
	}
	lb.terms[e] = &beatingTerm{e: e, t: t}
	select {
	case lb.kick <- struct{}{}:
	default:
	}
}

// close ends lb's loop: it forgets lb, and a term added later starts a new loop.
func (s *setBeats) close(l *lease, lb *leaseBeats) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closeLocked(l, lb)
}

// closeLocked is close with s.mu held.
func (s *setBeats) closeLocked(l *lease, lb *leaseBeats) {
	lb.closed = true
	if s.leases[l] == lb {
		delete(s.leases, l)
	}
}

// run is the loop of lease l's terms: it beats a term at once when it has no heartbeat
// deadline yet or its deadline is near, every term whenever a renewal of l is sent, and
// ends a term whose deadline passed; it ends with l, or when it has no term left.
func (s *setBeats) run(c *Candidate, l *lease, lb *leaseBeats, hb HeartbeatBatcher) {
	defer s.close(l, lb)
	next := l.renewalSent()
	// soon is how near its deadline a term is beaten without waiting for the next
	// renewal: half a beat window, more than the renewals' interval (a third of the ttl).
	soon := beatWindow(l.granted) / 2
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := c.now()
		wait := time.Duration(-1)
		var due, all []*beatingTerm
		s.mu.Lock()
		for e, bt := range lb.terms {
			if bt.t.end.Err() != nil {
				delete(lb.terms, e)
				continue
			}
			all = append(all, bt)
			h := bt.t.beatHorizon(now)
			if !bt.failed && (!bt.t.beat.valid(now) || h <= soon) {
				// A new term, one whose deadline a test's clock jumped past, or one whose
				// deadline comes before the next renewal may: a term won by a claim
				// answered late, whose first heartbeat deadline counts from the claim's
				// sending. Waiting for the renewal ended such terms at a cold start of
				// 4,096 shards, and with them the lease and every shard it held.
				due = append(due, bt)
				continue
			}
			if !bt.failed {
				h -= soon // beat it once its deadline is that near
			}
			if wait < 0 || h < wait {
				wait = h
			}
		}
		if len(lb.terms) == 0 {
			s.closeLocked(l, lb) // under the lock: a term added from now starts a new loop
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		if len(due) > 0 {
			s.beat(c, lb, due, hb)
			continue
		}
		// As in keepBeating: a failsafe's part of a deadline may be cut short, and a
		// test's clock may jump, so those deadlines are polled.
		wait = max(wait, time.Millisecond)
		if !c.realClock || c.cfg.Failsafe != nil {
			wait = min(wait, 100*time.Millisecond)
		}
		timer.Reset(wait) // since Go 1.23, Reset drops a value the timer had not delivered
		select {
		case <-c.ctx.Done():
			return
		case <-l.lost:
			return
		case <-lb.kick:
		case <-next:
			next = l.renewalSent()
			s.beat(c, lb, all, hb)
		case <-timer.C:
			now := c.now()
			for _, bt := range all {
				if bt.t.beatHorizon(now) <= 0 && bt.e.heartbeatLost(bt.t) {
					s.drop(lb, bt)
				}
			}
		}
	}
}

// drop removes bt from lb, unless a newer term of its election took its place.
func (s *setBeats) drop(lb *leaseBeats, bt *beatingTerm) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if lb.terms[bt.e] == bt {
		delete(lb.terms, bt.e)
	}
}

// beat sends the heartbeats of terms in one UpdateAll, as writeRecord sends one: under
// each election's write lock, with the deadline counted from before the request. A term
// whose lock is taken (a write of its record on its way) is beaten alone after the rest.
func (s *setBeats) beat(c *Candidate, lb *leaseBeats, terms []*beatingTerm, hb HeartbeatBatcher) {
	updates := make([]KeyUpdate, 0, len(terms))
	locked := make([]*beatingTerm, 0, len(terms))
	var alone []*beatingTerm
	for _, bt := range terms {
		if bt.t.end.Err() != nil {
			continue
		}
		if !bt.e.writeMu.TryLock() {
			alone = append(alone, bt)
			continue
		}
		updates = append(updates, KeyUpdate{Election: bt.e.name, Token: bt.t.Token, Value: bt.e.encoded.encode(bt.t.Leader)})
		locked = append(locked, bt)
	}
	if len(updates) > 0 {
		ctx, cancel := context.WithTimeout(c.ctx, c.requestTimeout)
		sent := c.now()
		results := hb.UpdateAll(ctx, updates)
		cancel()
		for i, bt := range locked {
			if results[i].Updated {
				bt.t.beat.set(sent.Add(beatWindow(bt.t.lease.granted)))
			}
			bt.e.writeMu.Unlock()
		}
		for i, bt := range locked {
			s.beaten(lb, bt, results[i].Updated, results[i].Err)
		}
	}
	for _, bt := range alone {
		ok, err := bt.e.writeRecord(bt.t.end, bt.t)
		s.beaten(lb, bt, ok, err)
	}
}

// beaten acts on the answer to bt's heartbeat as keepBeating does.
func (s *setBeats) beaten(lb *leaseBeats, bt *beatingTerm, ok bool, err error) {
	switch {
	case bt.t.end.Err() != nil:
		s.drop(lb, bt)
	case err != nil:
		bt.e.c.storeFailed("heartbeat", err) // tried again with the next renewal
		bt.failed = true
	case !ok:
		bt.e.keyGone(bt.t)
		s.drop(lb, bt)
	default:
		bt.failed = false
	}
}
