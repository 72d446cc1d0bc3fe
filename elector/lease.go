package elector

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// clockBase anchors monotonic readings: deadlines are stored as nanoseconds since it, which
// Go computes from the monotonic clock when both times carry a monotonic reading.
var clockBase = time.Now()

// lease is one lease of the candidate, shared by all its elections, and the local deadline up
// to which this instance may act on it.
//
// The safety argument: a renewal request is sent at local time s and handled by the store at
// some later time; the store then keeps the lease (and the election keys bound to it) alive
// for at least the granted TTL from that later moment. So s + TTL is a lower bound on the
// lease's expiry, and s + TTL - margin stays a lower bound even if this host's clock runs a
// little slower than the store's. Nobody else can create the key before the lease expires,
// so while both of this host's clocks say the deadline is ahead, no other instance leads,
// unless an operator deletes the key or revokes the lease: beatWindow covers that.
//
// The deadline is kept on two clocks and admission needs both ahead: the monotonic clock
// ignores wall-clock steps, and the wall clock keeps counting while a suspended machine's
// monotonic clock may not. A clock stepping the wrong way can only make us step down early.
type lease struct {
	deadline
	id LeaseID
	// granted is the TTL the store granted when the lease was created.
	granted time.Duration

	// lost is closed when the candidate gives the lease up: it is lostCtx's Done, so that
	// a waiting follower can be woken by it without a goroutine (follower.go).
	lost     <-chan struct{}
	lostCtx  context.Context
	giveUpFn context.CancelFunc
	// rewound is set when the lease was given up because the store went back in time.
	rewound atomic.Bool
	// why says why the lease was given up by its user rather than the lease loop.
	why atomic.Pointer[string]

	sendMu sync.Mutex
	sent   chan struct{} // closed (and replaced) whenever a renewal is sent
}

func newLease(id LeaseID, granted time.Duration) *lease {
	l := &lease{id: id, granted: granted, sent: make(chan struct{})}
	l.lostCtx, l.giveUpFn = context.WithCancel(context.Background())
	l.lost = l.lostCtx.Done()
	return l
}

// extend moves the deadline to sent + granted - margin, where sent is the local time at
// which the request that granted or renewed the lease was sent.
func (l *lease) extend(sent time.Time, granted, margin time.Duration) {
	l.set(sent.Add(granted - margin))
	// A renewal in flight when the lease was given up (after a rewind, say) must not
	// make it valid again. giveUp closes lost before it clears, so either this sees lost
	// closed, or giveUp's clear comes after this set.
	select {
	case <-l.lost:
		l.clear()
	default:
	}
}

// renewing tells whoever waits on renewalSent that a renewal is being sent now.
func (l *lease) renewing() {
	l.sendMu.Lock()
	close(l.sent)
	l.sent = make(chan struct{})
	l.sendMu.Unlock()
}

// renewalSent returns a channel that is closed when the next renewal is sent.
func (l *lease) renewalSent() <-chan struct{} {
	l.sendMu.Lock()
	defer l.sendMu.Unlock()
	return l.sent
}

// giveUp makes the lease invalid at once and tells every election that uses it.
func (l *lease) giveUp() {
	l.giveUpFn()
	l.clear()
}

// giveUpBecause is giveUp by a user of the lease, which says why.
func (l *lease) giveUpBecause(reason string) {
	l.why.CompareAndSwap(nil, &reason)
	l.giveUp()
}

// deadline is a moment kept on both clocks (nanoseconds: monotonic since clockBase, and Unix
// wall time); zero until set. Each half is written atomically; a reader mixing two writes'
// values still sees two deadlines that were each valid.
type deadline struct {
	mono atomic.Int64
	wall atomic.Int64
}

func (d *deadline) set(until time.Time) {
	d.mono.Store(int64(until.Sub(clockBase)))
	d.wall.Store(until.UnixNano())
}

func (d *deadline) clear() {
	d.mono.Store(0)
	d.wall.Store(0)
}

// valid reports whether now is still before the deadline on both clocks.
func (d *deadline) valid(now time.Time) bool {
	return int64(now.Sub(clockBase)) < d.mono.Load() && now.UnixNano() < d.wall.Load()
}

// remaining is how long the deadline is still ahead of now (by the more pessimistic clock),
// or zero once it has passed.
func (d *deadline) remaining(now time.Time) time.Duration {
	mono := time.Duration(d.mono.Load() - int64(now.Sub(clockBase)))
	wall := time.Duration(d.wall.Load() - now.UnixNano())
	return max(0, min(mono, wall))
}

// safetyMargin is subtracted from every lease deadline. Clock rates of two healthy hosts
// differ by well under 0.1%; a tenth of the TTL also absorbs scheduling delays between reading
// the clock and sending the request.
func safetyMargin(ttl time.Duration) time.Duration {
	return ttl / 10
}

// beatWindow is how long after sending a heartbeat (a write of its election key that every
// follower sees, see Election.keepBeating) a leader may still admit: as long as after
// sending a renewal. A successor that takes the key without the old holder's
// acknowledgement waits until the receipt of the old holder's last heartbeat + beatWindow +
// safetyMargin, the TTL: an operator's lease revoke makes the key vanish while the holder's
// lease deadline is still ahead, and the heartbeat is the one thing both sides see.
// Heartbeats are sent together with renewals, so after a crash this bound ends within a
// round trip of the lease's expiry, and failover is not slowed.
func beatWindow(ttl time.Duration) time.Duration {
	return ttl - safetyMargin(ttl)
}
