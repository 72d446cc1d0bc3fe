package elector

import (
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
// so while both of this host's clocks say the deadline is ahead, no other instance leads.
//
// The deadline is kept on two clocks and admission needs both ahead: the monotonic clock
// ignores wall-clock steps, and the wall clock keeps counting while a suspended machine's
// monotonic clock may not. A clock stepping the wrong way can only make us step down early.
type lease struct {
	id LeaseID
	// Deadlines in nanoseconds (monotonic since clockBase, and Unix wall time). Zero once
	// the lease is given up. Each is written atomically; a reader mixing two renewals'
	// values still sees two deadlines of this lease, both valid.
	monoDeadline atomic.Int64
	wallDeadline atomic.Int64

	lostOnce sync.Once
	// lost is closed when the candidate gives the lease up.
	lost chan struct{}
}

func newLease(id LeaseID) *lease {
	return &lease{id: id, lost: make(chan struct{})}
}

// extend moves the deadline to sent + granted - margin, where sent is the local time at
// which the request that granted or renewed the lease was sent.
func (l *lease) extend(sent time.Time, granted, margin time.Duration) {
	until := sent.Add(granted - margin)
	l.monoDeadline.Store(int64(until.Sub(clockBase)))
	l.wallDeadline.Store(until.UnixNano())
}

// valid reports whether now is still before the lease's deadline on both clocks.
func (l *lease) valid(now time.Time) bool {
	return int64(now.Sub(clockBase)) < l.monoDeadline.Load() && now.UnixNano() < l.wallDeadline.Load()
}

// remaining is how long the deadline is still ahead of now (by the more pessimistic clock),
// or zero once it has passed.
func (l *lease) remaining(now time.Time) time.Duration {
	mono := time.Duration(l.monoDeadline.Load() - int64(now.Sub(clockBase)))
	wall := time.Duration(l.wallDeadline.Load() - now.UnixNano())
	return max(0, min(mono, wall))
}

// giveUp makes the lease invalid at once and tells every election that uses it.
func (l *lease) giveUp() {
	l.lostOnce.Do(func() {
		l.monoDeadline.Store(0)
		l.wallDeadline.Store(0)
		close(l.lost)
	})
}

// safetyMargin is subtracted from every lease deadline. Clock rates of two healthy hosts
// differ by well under 0.1%; a tenth of the TTL also absorbs scheduling delays between reading
// the clock and sending the request.
func safetyMargin(ttl time.Duration) time.Duration {
	return ttl / 10
}
