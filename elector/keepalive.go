package elector

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"
)

// waitLease blocks until there is a usable lease and returns it, or nil once ctx ends.
func (c *Candidate) waitLease(ctx context.Context) *lease {
	for {
		c.mu.Lock()
		l, wake := c.current, c.leaseWake
		c.mu.Unlock()
		if l != nil {
			return l
		}
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
		}
	}
}

// processLeases holds the leases of every candidate in this process. When a reload changes
// how an instance campaigns (its ttl, say), the new candidacy starts while the old one still
// holds the key under the same instance id; that is a handover, not a duplicate id.
var processLeases sync.Map // LeaseID -> *Candidate

func (c *Candidate) setLease(l *lease) {
	c.mu.Lock()
	if c.current != nil {
		processLeases.Delete(c.current.id)
	}
	if l != nil {
		processLeases.Store(l.id, c)
	}
	if c.current != nil && l == nil {
		c.abandoned = c.current.id
	}
	c.current = l
	close(c.leaseWake)
	c.leaseWake = make(chan struct{})
	c.mu.Unlock()
}

// own reports whether id is this candidate's lease, current or just given up: under
// either, this candidate admits nothing it does not know about.
func (c *Candidate) own(id LeaseID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return (c.current != nil && c.current.id == id) || c.abandoned == id
}

// ours reports whether id is a lease of this process: this candidate's own, or another
// candidacy's of this process that is being replaced (not a duplicate instance_id).
func (c *Candidate) ours(id LeaseID) bool {
	if c.own(id) {
		return true
	}
	_, sibling := processLeases.Load(id)
	return sibling
}

// LeaseRemaining is how long the current lease's deadline is ahead; zero without a lease.
func (c *Candidate) LeaseRemaining() time.Duration {
	c.mu.Lock()
	l := c.current
	c.mu.Unlock()
	if l == nil {
		return 0
	}
	return l.remaining(c.now())
}

// LastContact is when the store last confirmed this candidate's lease (zero if never).
func (c *Candidate) LastContact() time.Time {
	if ns := c.lastContact.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// keepLease is the lease loop: grant a lease, renew it every TTL/3 for as long as the store
// confirms it in time, and when it cannot, give it up and start over.
func (c *Candidate) keepLease(ctx context.Context) {
	retry := newBackoff(100*time.Millisecond, min(5*time.Second, c.cfg.TTL))
	for {
		sent := c.now()
		rctx, cancel := context.WithTimeout(ctx, c.requestTimeout)
		id, granted, err := c.cfg.Backend.Grant(rctx, c.cfg.TTL)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if errors.Is(err, ErrStoreRewound) {
				// The lease came from a store gone back in time; the next one is of its
				// new history.
				c.log().Warn("lease granted by a rewound store dropped; asking for another", zap.String("self", c.cfg.ID), zap.Error(err))
			} else {
				c.storeFailed("grant", err)
			}
			if !retry.wait(ctx) {
				return
			}
			continue
		}
		c.storeContacted()
		retry.reset()
		l := newLease(id, granted)
		l.extend(sent, granted, safetyMargin(granted))
		c.setLease(l)
		c.log().Debug("lease granted", zap.Int64("lease", int64(id)), zap.Duration("ttl", granted))

		reason := c.renew(ctx, l, granted, sent)
		if ctx.Err() != nil {
			return // Close revokes the lease itself, after draining
		}
		logLost := c.log().Warn
		if reason == reasonRewound {
			logLost = c.log().Error
		}
		logLost("lease lost", zap.String("self", c.cfg.ID), zap.Int64("lease", int64(id)), zap.String("reason", reason))
		l.giveUp()
		c.setLease(nil)
		// Revoking deletes our keys now rather than at expiry, so that the fleet does not
		// wait out the TTL; if the store is unreachable the lease expires by itself.
		go func() {
			rctx, cancel := context.WithTimeout(ctx, c.requestTimeout)
			defer cancel()
			_ = c.cfg.Backend.Revoke(rctx, id)
		}()
	}
}

// reasonRewound is why a lease is given up when the store went back in time: whatever it
// confirmed before, this lease included, belongs to a history the store no longer has.
const reasonRewound = "the store's revision went backwards (restored from a snapshot?)"

// renew keeps l alive until it cannot, and returns why it stopped ("" when ctx ended).
func (c *Candidate) renew(ctx context.Context, l *lease, ttl time.Duration, sent time.Time) string {
	interval := ttl / 3
	retryAfter := max(100*time.Millisecond, ttl/20)
	next := sent.Add(interval)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		now := c.now()
		if l.rewound.Load() {
			return reasonRewound
		}
		if why := l.why.Load(); why != nil {
			return *why
		}
		// A failsafe keeps the lease past its deadline (leaseHorizon), trying to renew it.
		horizon := c.leaseHorizon(l, now)
		if horizon <= 0 {
			return "no renewal succeeded before the lease deadline"
		}
		timer.Reset(min(next.Sub(now), horizon))
		select {
		case <-ctx.Done():
			return ""
		case <-l.lost:
			continue // given up elsewhere: say why above
		case <-timer.C:
		}
		sent = c.now()
		horizon = c.leaseHorizon(l, sent)
		if horizon <= 0 {
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, min(c.requestTimeout, horizon))
		l.renewing()
		granted, err := c.cfg.Backend.Renew(rctx, l.id)
		cancel()
		switch {
		case ctx.Err() != nil:
			return ""
		case errors.Is(err, ErrLeaseNotFound):
			return "lease expired in the store"
		case errors.Is(err, ErrStoreRewound):
			return reasonRewound
		case err != nil:
			c.storeFailed("renew", err)
			next = c.now().Add(retryAfter)
		default:
			c.storeContacted()
			l.extend(sent, granted, safetyMargin(granted))
			next = sent.Add(interval)
		}
	}
}
