package elector

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"
)

// ErrUnproven is returned (wrapped) by Resign and Transfer when the term cannot let go
// before ctx ends because it has not yet proven every earlier term stopped (see proof):
// letting go would vouch for a term that may still admit. The release goes on in the
// background once the proof is complete.
var ErrUnproven = errors.New("the term has not yet proven every earlier term stopped (a previous leader's deadline, or a failsafe fence), so it cannot let go yet")

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
	if e.resignReason == "" {
		e.resignReason = "resigned"
	}
	// Only this term drains: one the campaign loop wins once the release is through (a
	// hold-off of zero) is a new term, and admits.
	t := e.term.Load()
	if t.lease != nil {
		if e.ending.token != t.Token { // a retry of a failed release keeps the first why
			e.ending = endOfTerm{token: t.Token, why: e.handOverWhyLocked(holdOff)}
		}
		e.handing = t.Token
		e.publishLocked(t.Leader, t.Token, t.lease, "handing over")
	}
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		if t.lease != nil && e.handing == t.Token {
			e.handing = 0
		}
		e.resignReason = ""
		e.mu.Unlock()
	}()
	if t.lease == nil {
		return nil
	}
	// Let what is in flight finish, then let go. Peers learn of the handover from the
	// release itself: a request one of them forwards here meanwhile is refused
	// (NotLeaderHeader; see EnterForwarded), and the peer sends it on to the successor.
	// No write or wait of its own stands between the signal and the release.
	drained, cancelDrain := context.WithTimeout(ctx, time.Duration(e.c.drainTimeout.Load()))
	e.drain(drained)
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
	e.drain(drained)
	cancelDrain()
	// The release acknowledges, and an acknowledgement vouches that nobody admits any
	// more: not before this term's proof is complete. A term still settling lets go once
	// it is (a heartbeat deadline at most a TTL away, a failsafe fence once a member of
	// the older roster answers); if ctx ends first, the release goes on in the background
	// after that wait, and a process that exits meanwhile leaves no acknowledgement.
	if !t.proof.isProven() && e.c.exiting.Load() {
		// The process is leaving: its lease is revoked next, which deletes the key and
		// acknowledges nothing, so the successor proves every earlier term stopped by
		// itself. Waiting here would only hold up the exit, without bound while a
		// failsafe fence goes unanswered.
		heartbeat, failsafe := t.proof.owes()
		e.c.log().Info("leaving without acknowledging: this term has not yet proven every earlier term stopped; the lease's revoke removes the key",
			zap.String("election", e.name), zap.Int64("token", t.Token), zap.Bool("heartbeat_owed", heartbeat), zap.Bool("failsafe_owed", failsafe))
		return ErrUnproven
	}
	if !t.proof.isProven() {
		heartbeat, failsafe := t.proof.owes()
		e.logMove("handing over once every earlier term is proven stopped",
			zap.String("election", e.name), zap.Int64("token", t.Token), zap.Bool("heartbeat_owed", heartbeat),
			zap.Bool("failsafe_owed", failsafe), zap.Duration("heartbeat_at_most", max(0, t.proof.stoppedBy.Sub(e.c.now()))))
		wctx, cancelWait := context.WithCancel(ctx)
		stopAfter := context.AfterFunc(e.c.ctx, cancelWait)
		proven := t.proof.wait(wctx, e.c.now)
		stopAfter()
		cancelWait()
		if !proven {
			e.c.retryRelease(e.name, t.Token, t.lease, t.proof, e.endingOf(t.Token))
			return fmt.Errorf("%w: %w", ErrUnproven, ctx.Err())
		}
	}
	why := e.endingOf(t.Token)
	e.announceStandingOut(ctx, t.lease, why)
	// Not a turn of the set's: the releases of many shards go in one batch.
	rctx, cancel := context.WithTimeout(ctx, e.c.requestTimeout)
	err := e.c.batches.release(rctx, e.name, t.Token, t.lease.id, why)
	cancel()
	if err != nil {
		e.c.storeFailed("release", err)
		// Keep trying in the background: a key left held keeps the fleet leaderless
		// for as long as the lease lives, which would be the whole hold-off.
		e.c.retryRelease(e.name, t.Token, t.lease, nil, why)
		return err
	}
	e.mu.Lock()
	e.letGo = max(e.letGo, t.Token)
	if cur := e.term.Load(); cur.lease != nil && cur.Token == t.Token {
		e.publishLocked(Record{}, 0, nil, e.resignedReasonLocked())
	}
	e.mu.Unlock()
	return nil
}

// announceStandingOut tells the registry, before a release, that this candidate stays out
// of the election after it (a hold-off, or leaving). Every candidate that counts whom to
// yield to once it sees the vacancy (yieldToHigher) then reads the same registry. Left to
// the campaign loop, which announces after the release, it raced the other candidates'
// reads: one that read first waited a step for this candidate, one that read later did
// not, and a candidate of lower priority could campaign as early as one of higher. The
// target of a transfer does not yield, so a transfer skips the round trip. Best effort:
// the campaign loop announces again either way. An instance that is exiting skips it too:
// its lease's revoke follows at once and takes the entry away, and a write per election
// here would hold up the exit of an instance that owns many shards by one for each.
func (e *Election) announceStandingOut(ctx context.Context, l *lease, why string) {
	info := e.info()
	if info.Healthy || why == EndedTransferred || e.c.exiting.Load() {
		return
	}
	if m := e.shared.Load(); m != nil {
		_ = m.reg.announce(ctx, l, e, m.shard)
		return
	}
	rctx, cancel := context.WithTimeout(ctx, e.c.requestTimeout)
	defer cancel()
	_ = e.c.cfg.Backend.Announce(rctx, e.name, e.c.cfg.ID, info.encode(), l.id)
}

// resignedReasonLocked is why a handover let go of the key: resigned or transferred.
func (e *Election) resignedReasonLocked() string {
	if e.resignReason != "" {
		return e.resignReason
	}
	return "resigned"
}

// handOverWhyLocked is why a handover with holdOff lets go of the key, as its release
// says: a transfer, an instance leaving (a shutdown, or an election a reload dropped,
// which hand over for good), or else a resign. e.mu is held.
func (e *Election) handOverWhyLocked(holdOff time.Duration) string {
	switch {
	case e.resignReason == "transferred":
		return EndedTransferred
	case e.c.exiting.Load() || holdOff >= forever:
		return EndedHandedOver
	default:
		return EndedResigned
	}
}

// endingOf is why this instance let go of its term token, as its release says: an
// instance that cannot tell (a term released again after the release was lost) says it
// handed over.
func (e *Election) endingOf(token int64) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.endingOfLocked(token)
}

func (e *Election) endingOfLocked(token int64) string {
	if e.ending.token == token {
		return e.ending.why
	}
	return EndedHandedOver
}

// drain waits until no admitted request is in flight, or DrainTimeout or ctx ends. It
// does not poll: hundreds of shard elections draining at once would be a busy loop. The
// last request out wakes it (Exit), and the order of the atomics makes that certain: a
// drain counts itself among the drainers before it reads the count, and Exit lowers the
// count before it reads the drainers, so either the drain reads zero or Exit sees it
// waiting. A request that enters and backs out during the drain (it sees the handover)
// goes through Exit too.
func (e *Election) drain(ctx context.Context) {
	if e.inflight.Load() <= 0 {
		return
	}
	e.drainers.Add(1)
	defer e.drainers.Add(-1)
	deadline := time.NewTimer(time.Duration(e.c.drainTimeout.Load()))
	defer deadline.Stop()
	for {
		e.drainedMu.Lock()
		wake := e.drained
		e.drainedMu.Unlock()
		if e.inflight.Load() <= 0 {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-deadline.C:
			e.c.log().Warn("drain timeout: releasing leadership with gated requests still in flight",
				zap.String("election", e.name), zap.Int64("in_flight", e.inflight.Load()))
			return
		case <-wake:
		}
	}
}

// wakeDrains wakes every drain waiting for the in-flight count to reach zero.
func (e *Election) wakeDrains() {
	e.drainedMu.Lock()
	close(e.drained)
	e.drained = make(chan struct{})
	e.drainedMu.Unlock()
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
		if m := e.shared.Load(); m != nil {
			m.reg.leave(e, m.shard)
		}
		e.publishAlone("election no longer configured")
		if err != nil && held.lease != nil {
			e.c.retryRelease(e.name, held.Token, held.lease, held.proof, e.endingOf(held.Token))
		}
	})
}

// acknowledgeEnd records, once this instance's admitted requests of the ended term are
// done, that it stopped acting as leader of that term, and why (an Ended* value), so that
// a successor that is waiting (see settle) may start. e.mu is held.
func (e *Election) acknowledgeEnd(ended *Term, why string) {
	e.ending = endOfTerm{token: ended.Token, why: why}
	go func() {
		// An acknowledgement vouches that nobody admits: a term that never settled
		// completes its proof first (see proof), however long that takes.
		if ended.proof != nil && !ended.proof.wait(e.c.ctx, e.c.now) {
			return
		}
		ctx, cancel := context.WithTimeout(e.c.ctx, e.c.HandoverTimeout())
		defer cancel()
		e.drain(ctx)
		retry := newBackoff(50*time.Millisecond, time.Second)
		for {
			rctx, rcancel := e.request(ctx, e.c.requestTimeout)
			err := e.c.cfg.Backend.Acknowledge(rctx, e.name, ended.Token, ended.lease.id, why)
			rcancel()
			if err == nil || !retry.wait(ctx) {
				return
			}
		}
	}()
}

// endedUnasked is why term t of this instance, which it did not let go of itself, ended
// when it saw that at now: its key was deleted (or its lease revoked) while both of its
// deadlines were still ahead, or else it had missed its deadline.
func endedUnasked(t *Term, now time.Time) string {
	if t.lease.valid(now) && t.beat.valid(now) {
		return EndedKeyDeleted
	}
	return EndedDeadlineMissed
}

// releaseAgainLocked deletes, in the background, the key of term token that this instance
// has released already and now sees again, once per sighting that finds no such release
// under way. e.mu is held.
func (e *Election) releaseAgainLocked(token int64, l *lease) {
	if e.releasingAgain == token {
		return
	}
	e.releasingAgain = token
	why := e.endingOfLocked(token)
	// Counted with the candidate's loops, so that Close waits for it: it runs inside a
	// campaign loop's pass (the count is above zero), and its failure, logged after
	// Close returned, would outlive the process's last word (and a test's).
	e.c.loops.Add(1)
	go func() {
		defer e.c.loops.Done()
		defer func() {
			e.mu.Lock()
			if e.releasingAgain == token {
				e.releasingAgain = 0
			}
			e.mu.Unlock()
		}()
		rctx, cancel := context.WithTimeout(e.c.ctx, e.c.requestTimeout)
		defer cancel()
		if err := e.c.batches.release(rctx, e.name, token, l.id, why); err != nil {
			e.c.storeFailed("release", err)
			e.c.retryRelease(e.name, token, l, nil, why)
		}
	}()
}
