package elector

import (
	"context"
	"time"
)

// run is the campaign loop: take the key if nobody holds it, else watch it until it is
// deleted, and start over whenever the lease or the watch is lost.
func (e *Election) run(ctx context.Context) {
	defer close(e.done)
	retry := newBackoff(100*time.Millisecond, min(5*time.Second, e.c.cfg.TTL))
	for {
		l := e.c.waitLease(ctx)
		if l == nil {
			return
		}
		e.announce(ctx, l)
		obs, heldOffRead, err := e.read(ctx, l)
		if err == nil {
			retry.reset()
			e.observe(obs, l, false)
			if t := e.term.Load(); t.lease != nil {
				if _, held := e.heldOff(); held || t.Releasing {
					// A resign whose release failed: keep trying to let go.
					_ = e.handOver(ctx, 0)
				}
			}
			err = e.follow(ctx, l, obs, heldOffRead)
		}
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			e.c.storeFailed("campaign", err)
			e.lostContact(l)
			if !e.pause(ctx, l, retry) {
				return
			}
		}
	}
}

// read campaigns for the key, or only looks at it while held off after a resign or when
// this candidate never campaigns (priority 0). A candidate of lower priority yields first
// (see yieldToHigher), unless a transfer names it. It reports whether it only looked
// because of a hold-off.
func (e *Election) read(ctx context.Context, l *lease) (Observation, bool, error) {
	vacated := e.vacated
	e.vacated = nil
	if _, held := e.heldOff(); held || e.c.Priority() == 0 || e.failsafeHolding() {
		rctx, cancel := e.request(ctx, e.c.requestTimeout)
		defer cancel()
		obs, err := e.c.cfg.Backend.Observe(rctx, e.name)
		return obs, held, err
	}
	if m := e.shared.Load(); m != nil {
		m.reg.awaitFleet(ctx)
	}
	// A transfer's target takes the key at once: it was named, the others stand aside,
	// and the read of the registry that a yield needs would be one more store round trip
	// in the handover.
	if !e.transferTarget() {
		if obs, taken := e.yieldToHigher(ctx, vacated); taken {
			return obs, false, nil
		}
	}
	campaign := e.c.cfg.Backend.Campaign
	var rctx context.Context
	var cancel context.CancelFunc
	if e.shared.Load() != nil && e.c.batches.batchesClaims() {
		// A shard's claim goes in a batch with the claims its set asks meanwhile (one
		// request for hundreds at a start) and takes no turn: the batches go one at a
		// time. It counts as sent before it waits for its batch, so a term it wins starts
		// its heartbeat deadline earlier, never later.
		campaign = e.c.batches.claim
		rctx, cancel = context.WithTimeout(ctx, e.c.requestTimeout)
	} else {
		rctx, cancel = e.request(ctx, e.c.requestTimeout) // after the yield, which may wait
	}
	defer cancel()
	rec := Record{ID: e.c.cfg.ID, URL: e.c.cfg.URL, Since: time.Now(), MarkKey: newMarkKey(), TTL: l.granted}
	e.mu.Lock()
	e.campaign.rec, e.campaign.sent = rec, e.c.now()
	e.mu.Unlock()
	obs, err := campaign(rctx, e.name, rec.encode(), l.id)
	return obs, false, err
}

// follow watches the key from after the observation seen and publishes what it sees. It returns nil when the
// loop should read the key again now (key deleted, lease lost, hold-off over, resync asked),
// or the error that broke the watch. heldOffRead says whether the read before it only
// looked at the key because of a hold-off.
func (e *Election) follow(ctx context.Context, l *lease, seen Observation, heldOffRead bool) error {
	d, held := e.heldOff()
	if heldOffRead && !held {
		return nil // the hold-off ended since the read only looked: campaign now
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	changes := e.watch(wctx, seen)

	var holdOver <-chan time.Time
	if held && d < forever/2 {
		t := time.NewTimer(d)
		defer t.Stop()
		holdOver = t.C
	}
	silent := time.NewTimer(e.silenceLeft())
	defer silent.Stop()
	// Once the holder's silence has run out, an Expire that does not go through (a
	// stalled watch while the holder still writes, a store that fails) is tried again
	// after a backoff, not every time the timer's floor allows.
	expireRetry := newBackoff(50*time.Millisecond, max(50*time.Millisecond, e.c.cfg.TTL/4))
	for {
		select {
		case <-silent.C:
			done := e.expireSilent(ctx)
			next := e.silenceLeft()
			switch {
			case done:
				expireRetry.reset()
			case next <= time.Millisecond:
				next = expireRetry.step() // still overdue after a failed Expire: no spin
			}
			silent.Reset(next)
		case <-ctx.Done():
			return nil
		case <-l.lost:
			// Renewals failed for a whole lease (or the store dropped it): what the
			// watch showed may be stale too, until the key is read again.
			e.loseLease(l)
			e.lostContact(l)
			return nil
		case <-holdOver:
			return nil
		case <-e.resync:
			return nil
		case o, ok := <-changes:
			if !ok {
				return errWatchClosed
			}
			if o.Err != nil {
				return o.Err
			}
			e.observe(o, l, true)
			if o.Holder == nil {
				e.vacated = &o
				return nil // vacant: campaign at once
			}
			expireRetry.reset()
			silent.Reset(e.silenceLeft()) // since Go 1.23 a Reset timer delivers no stale tick
		}
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
