package elector

import (
	"context"
	"time"

	"go.uber.org/zap"
)

// A holder that crashed, froze or lost the store stops admitting a heartbeat window after
// its last heartbeat, but its key stays until the store expires its lease: etcd notices an
// expired lease up to half a second late and needs a write to delete its keys. A follower
// that has seen no write of the key for a whole TTL knows the holder has stopped, and
// deletes the key itself, guarded so that it never deletes a key written since it looked
// (Backend.Expire). Failover after a crash then takes a TTL after the holder's last
// heartbeat, however the store reaps leases.

// silenceLeft is how long until the holder of the key, as this instance last saw it, has
// been silent for a whole TTL; a long time when another instance holds nothing or this
// instance holds the key. At most a second: the clock may be a test's.
func (e *Election) silenceLeft() time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	t := e.term.Load()
	if t.lease != nil || e.prev.token == 0 || e.prev.token != t.Token {
		return time.Hour
	}
	left := e.prev.silentBy(e.c.cfg.TTL).Sub(e.c.now())
	return min(max(left, time.Millisecond), time.Second)
}

// expireSilent deletes the key of a holder that has been silent for a whole TTL (see
// above). It reports whether it did, or had nothing to do yet.
func (e *Election) expireSilent(ctx context.Context) bool {
	e.mu.Lock()
	p, t := e.prev, e.term.Load()
	e.mu.Unlock()
	if t.lease != nil || p.token == 0 || p.token != t.Token || e.c.now().Before(p.silentBy(e.c.cfg.TTL)) {
		return true
	}
	if e.failsafeHolding() {
		return false // the holder is silent because the store was away, and this peer vouches for it
	}
	rctx, cancel := e.request(ctx, e.c.requestTimeout)
	defer cancel()
	expired, err := e.c.cfg.Backend.Expire(rctx, e.name, p.token, p.rev)
	switch {
	case err != nil:
		e.c.storeFailed("expire", err)
	case expired:
		// Its heartbeat deadline has passed; a failsafe it may ride beyond the store's
		// reach is the next term's to fence (see proof).
		e.logMove("deleted the key of a leader silent for a whole ttl; its heartbeat deadline has passed",
			zap.String("election", e.name), zap.String("leader", t.Leader.ID), zap.Int64("token", p.token))
		if m := e.moveLog.Load(); m != nil {
			m.expired(t.Leader.ID)
		}
	}
	return expired
}
