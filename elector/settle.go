package elector

import (
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
	// readSince is set when a read found the key vacant after the watch showed it go:
	// terms may have come and gone unseen in between, unless the store names this term
	// as the one before the next (Observation.Prev).
	readSince bool
}

// saw notes an observation at store revision rev, at now, of the key held by h with
// record rec.
func (p *observedTerm) saw(h *Holder, rec Record, now time.Time, rev int64) {
	if p.token != h.Token {
		*p = observedTerm{token: h.Token, lease: h.Lease, ttl: rec.TTL}
	}
	p.seen, p.rev, p.vacated, p.readSince = now, rev, false, false
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
// a record that gave no TTL, and named says whether the store named this term as the one
// before the new one. The holder admits for at most beatWindow after sending its last
// heartbeat, and that write reached this instance no earlier than it was sent. If the
// key's going away was seen through the watch, every heartbeat before it was seen too, so
// the last one seen is the last one sent (a candidate that watched the key stay vacant
// for a TTL owes nothing more); otherwise the last may have been missed, but it was sent
// before the key went away, so before now.
func (p observedTerm) stoppedBy(now time.Time, fallbackTTL time.Duration, named bool) time.Time {
	ttl := max(p.ttl, fallbackTTL)
	if p.vacated && (!p.readSince || named) {
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

// proofLocked decides what the new term token of this instance, just won with observation
// o at now, owes before it admits (see proof). The store names the term before it (o.Prev)
// where it can; without that, the term this instance last saw held by someone else is
// taken for it, as it most likely is. A term this instance cannot account for is waited
// out: a holder it never saw stopped admitting at most a TTL after the key was found
// vacant. A term that follows this instance's own inherits that term's proof, whatever it
// still owes. e.mu is held.
func (e *Election) proofLocked(token int64, o Observation, now time.Time, ttl time.Duration) *proof {
	seen, own := e.prev, e.own
	seenOther := seen.token != 0 && seen.token != token && !e.c.own(seen.lease)
	switch {
	case o.Prev == 0:
		// The store's answer names no term before this one: none ever held the key, the
		// store does not say, or the campaign was applied but its answer lost and the
		// retry found the key already held under this lease. Any number of terms may have
		// come and gone since the last one seen or held here (another won, admitted and
		// lost its key meanwhile): owe what a term that saw nothing owes, never what the
		// last one this process happened to see would.
		return e.freshProof(token, 0, unseenStoppedBy(now, ttl))
	case seenOther && o.Prev > seen.token && o.Prev != own.token:
		// A newer term than the last one seen came and went unseen (a short one, between
		// two polls of a watch, or while the watch was down): as for a term never seen,
		// its acknowledgement (a handover leaves one, if a moment after the key goes) proves
		// it stopped, and it vouches for every term before it, the one seen among them.
		if o.PrevReleased {
			return e.freshProof(token, 0, time.Time{})
		}
		return e.freshProof(token, o.Prev, unseenStoppedBy(now, ttl))
	case seenOther && o.Prev != seen.token:
		// The store names an older term than the last one seen (it went back in time, and
		// an old acknowledgement proves nothing of the term seen), or this instance's own
		// after the one seen. Wait both out.
		return e.freshProof(token, 0, unseenStoppedBy(now, ttl))
	case o.Prev == own.token:
		// This instance's own term came last: it stopped admitting before it campaigned
		// again, but what that term still owed, this one owes too.
		if own.proof != nil && !own.proof.isProven() {
			return own.proof
		}
		return e.freshProof(token, 0, time.Time{})
	case seenOther && o.PrevReleased:
		// Prev is the term seen, and it acknowledged its end, which it does only once
		// its own proof is complete: it vouches for every term before it.
		return e.freshProof(token, 0, time.Time{})
	case seenOther:
		return e.freshProof(token, seen.token, seen.stoppedBy(now, ttl, o.Prev == seen.token))
	case seen.token != 0 && seen.token != token && o.Prev == seen.token:
		return e.freshProof(token, 0, time.Time{}) // a term under this candidate's own lease
	case o.PrevReleased:
		return e.freshProof(token, 0, time.Time{}) // never seen, but it acknowledged its end
	default:
		// Never seen: ask for its acknowledgement (a clean shutdown leaves one), and
		// otherwise wait it out.
		return e.freshProof(token, o.Prev, unseenStoppedBy(now, ttl))
	}
}

// freshProof returns a new proof for term token, which owes a heartbeat proof for the term
// pred until stoppedBy unless stoppedBy is zero. A candidate in failsafe mode always owes
// the failsafe proof too: it may have confirmed another term itself. A candidate without
// it, but with a fence transport, owes it only along with a heartbeat proof: a term that
// acknowledged its end completed its own proof first, so nothing before it rides a
// failsafe.
func (e *Election) freshProof(token, pred int64, stoppedBy time.Time) *proof {
	heartbeat := !stoppedBy.IsZero()
	failsafe := e.c.cfg.Failsafe != nil || e.c.cfg.Fence != nil && heartbeat
	return newProof(token, pred, stoppedBy, heartbeat, failsafe)
}

// ownTerm is the latest term this instance held, for its successor (most likely this
// instance again, after an operator deleted the key or the lease was lost).
type ownTerm struct {
	token int64
	proof *proof
}

// settlePollCap is the longest a settle waits between two asks for the acknowledgement it
// waits for. An acknowledgement that lands late (the old leader heard of its end late, or
// drained long requests) is found quickly while it is most likely, by asks that double
// from 10 ms, and then within a quarter of the ttl: about a dozen asks in a ttl, not one
// every 100 ms (in etcd each is a write), which a fleet that restarts after its last
// terms' acknowledgements expired pays for every shard at once, for a whole ttl.
func settlePollCap(ttl time.Duration) time.Duration {
	return max(100*time.Millisecond, ttl/4)
}

// settle waits until term token's proof p is complete, then lets the term admit; it looks
// for the heartbeat obligation's acknowledgement itself. The previous holder acknowledges
// as soon as its watch shows it the key is gone, its admitted requests are done and its
// own proof is complete. If it cannot (it is cut off, or its lease was revoked under it),
// its heartbeat deadline runs out by stoppedBy (see observedTerm.stoppedBy). Either way
// there is no moment at which both admit. The lease's absence proves nothing: a revoked
// lease vanishes while its holder's deadline is still ahead, and the store cannot tell
// revoked from expired. It returns when the term ends unsettled: whatever comes next
// carries p on.
func (e *Election) settle(token int64, p *proof) {
	retry := newBackoff(10*time.Millisecond, settlePollCap(e.c.cfg.TTL))
	for {
		heartbeat, _ := p.owes()
		var (
			err      error
			released bool
			why      string
		)
		if heartbeat && p.token != 0 {
			rctx, cancel := e.request(e.c.ctx, min(e.c.requestTimeout, max(10*time.Millisecond, p.stoppedBy.Sub(e.c.now()))))
			released, why, err = e.c.cfg.Backend.Released(rctx, e.name, p.token, 0)
			cancel()
			if released {
				p.heartbeatProven("elected")
			}
		}
		if heartbeat && !e.c.now().Before(p.stoppedBy) {
			p.heartbeatProven(p.timedOutReason())
		}
		changed := e.Changed()
		e.mu.Lock()
		if released {
			e.heard = endOfTerm{token: p.token, why: why} // for the history (see history.go)
		}
		if e.settling != token {
			e.mu.Unlock()
			return // the term ended meanwhile; whoever comes next carries p on
		}
		if p.isProven() {
			e.settling = 0
			if cur := e.term.Load(); cur.lease != nil && cur.Token == token {
				e.publishLocked(cur.Leader, cur.Token, cur.lease, p.why())
			}
			e.mu.Unlock()
			return
		}
		e.mu.Unlock()
		if err != nil {
			e.c.storeFailed("settle", err)
		}
		if heartbeat, _ = p.owes(); heartbeat {
			if !retry.waitAtMost(e.c.ctx, p.stoppedBy.Sub(e.c.now())) {
				return
			}
			continue
		}
		select { // only the failsafe proof is owed: proveNoFailsafe finds it
		case <-p.proven:
		case <-changed:
		case <-e.c.ctx.Done():
			return
		}
	}
}
