package elector

import (
	"context"
	"time"
)

// run is the campaign loop: take the key if nobody holds it, else watch it until it is
// deleted, and start over whenever the lease or the watch is lost. Its caller counted it in
// c.loops; it counts itself done when ctx ends.
func (e *Election) run(ctx context.Context) {
	e.campaignFrom(ctx, newBackoff(100*time.Millisecond, min(5*time.Second, e.c.cfg.TTL)), nil, nil)
}

// campaignFrom is the campaign loop, carried on from following f first if f is not nil,
// or else from the end of a follow that returned err. When the follow parks
// (follower.go) it returns at once; the follow's next news carries the loop on.
func (e *Election) campaignFrom(ctx context.Context, retry *backoff, f *follower, err error) {
	for {
		if f != nil {
			if err = f.loop(false); err == errParked {
				return
			}
			f = nil
		}
		if ctx.Err() != nil || err == errLoopOver {
			e.loopOver()
			return
		}
		if err != nil {
			e.c.storeFailed("campaign", err)
			e.lostContact(e.lastLease)
			if !e.pause(ctx, e.lastLease, retry) {
				e.loopOver()
				return
			}
		}
		f, err = e.pass(ctx, retry)
	}
}

// loopOver tells whoever waits that the campaign loop ended.
func (e *Election) loopOver() {
	close(e.done)
	e.c.loops.Done()
}

// pass waits for a lease, campaigns (or looks at the key) and starts following it; it
// returns the follow, or the error that broke the pass (errLoopOver once ctx ended).
func (e *Election) pass(ctx context.Context, retry *backoff) (*follower, error) {
	l := e.c.waitLease(ctx)
	if l == nil {
		return nil, errLoopOver
	}
	e.lastLease = l
	// This pass reads the key, which is what a resync asks for: one asked before (a
	// placement set before Start, say) must not end the follow this pass starts. It made
	// every shard of a set claim its key a second time right after winning it.
	select {
	case <-e.resync:
	default:
	}
	e.announce(ctx, l)
	obs, heldOffRead, err := e.read(ctx, l)
	if err != nil {
		return nil, err
	}
	retry.reset()
	e.observe(obs, l, false)
	if t := e.term.Load(); t.lease != nil {
		if _, held := e.heldOff(); held || t.Releasing {
			// A resign whose release failed: keep trying to let go.
			_ = e.handOver(ctx, 0)
		}
	}
	d, held := e.heldOff()
	if heldOffRead && !held {
		return nil, nil // the hold-off ended since the read only looked: campaign now
	}
	if !held {
		d = 0
	}
	f := e.newFollower(ctx, l, obs, d)
	f.retry = retry
	return f, nil
}

// errLoopOver ends the campaign loop: its context ended while it waited for a lease.
var errLoopOver = loopOver{}

type loopOver struct{}

func (loopOver) Error() string { return "campaign loop over" }

// read campaigns for the key, or only looks at it while held off after a resign or when
// this candidate never campaigns (priority 0). A candidate of lower priority yields first
// (see yieldToHigher), unless a transfer names it. It reports whether it only looked
// because of a hold-off.
func (e *Election) read(ctx context.Context, l *lease) (Observation, bool, error) {
	vacated := e.vacated
	e.vacated = nil
	if _, held := e.heldOff(); held || e.c.Priority() == 0 || e.failsafeHolding() {
		obs, err := e.readKey(ctx)
		return obs, held, err
	}
	if m := e.shared.Load(); m != nil {
		m.reg.awaitFleet(ctx)
	}
	// A transfer's target takes the key at once: it was named, the others stand aside,
	// and the read of the registry that a yield needs would be one more store round trip
	// in the handover.
	if !e.transferTarget() {
		obs, taken, err := e.yieldToHigher(ctx, vacated)
		if err != nil || taken {
			return obs, false, err
		}
	}
	rec := Record{ID: e.c.cfg.ID, URL: e.c.cfg.URL, Since: time.Now(), MarkKey: newMarkKey(), TTL: l.granted}
	e.mu.Lock()
	e.campaign.rec, e.campaign.sent = rec, e.c.now()
	e.mu.Unlock()
	campaign := e.c.cfg.Backend.Campaign
	var rctx context.Context
	var cancel context.CancelFunc
	if e.shared.Load() != nil && e.c.batches.batchesClaims() {
		// A shard's claim goes in a batch with the claims its set asks meanwhile (one
		// request for hundreds at a start or a SIGTERM) and takes no turn: the batches go
		// one at a time, each bounded from its sending, so the claim waits for its
		// batch's answer however long the batches before took. A term it wins counts its
		// first heartbeat from the moment its batch was sent: before the store wrote the
		// key, as a claim sent alone counts from before its request.
		campaign = func(ctx context.Context, election string, value []byte, lease LeaseID) (Observation, error) {
			return e.c.batches.claim(ctx, election, value, lease, func() { e.claimSending(rec) })
		}
		rctx, cancel = ctx, func() {}
	} else {
		rctx, cancel = e.request(ctx, e.c.requestTimeout) // after the yield, which may wait
	}
	defer cancel()
	obs, err := campaign(rctx, e.name, rec.encode(), l.id)
	return obs, false, err
}

// claimSending notes that the campaign for rec is being sent now: its term's first
// heartbeat counts from here (see observe), not from before its wait for a batch.
func (e *Election) claimSending(rec Record) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.campaign.rec.MarkKey == rec.MarkKey {
		e.campaign.sent = e.c.now()
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

// loseLease steps down because the lease under which the key was held is gone.
func (e *Election) loseLease(l *lease) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if t := e.term.Load(); t.lease == l {
		e.publishLocked(Record{}, 0, nil, "lease lost")
		e.acknowledgeEnd(t, EndedDeadlineMissed) // if the store takes it, the successor need not wait
	}
}

// lostContact forgets the leader once the key cannot be read and this instance has been out
// of touch with the store for a whole lease (l is no longer valid). Before that, the leader
// last seen most likely still leads: a brief outage, such as the store electing a new leader of its own,
// should not leave redirects and forwarded requests without a target. After it, a stale
// leader is worse than none. A key held under a still-valid lease stays held.
func (e *Election) lostContact(l *lease) {
	if l.valid(e.c.now()) || e.failsafeHolding() {
		return // pause and follow call again when l is given up; a failsafe keeps the leader
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if t := e.term.Load(); t.lease == nil && t.LeaderKnown() {
		e.publishLocked(Record{}, 0, nil, "store unreachable")
	}
}

// watch watches the key from after the observation seen, as Backend.Watch does.
func (e *Election) watch(ctx context.Context, seen Observation) <-chan Observation {
	if sw, ok := e.c.cfg.Backend.(SeenWatcher); ok {
		return sw.WatchSeen(ctx, e.name, seen)
	}
	return e.c.cfg.Backend.Watch(ctx, e.name, seen.Revision)
}
