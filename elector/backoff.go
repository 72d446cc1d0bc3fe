package elector

import (
	"context"
	"math/rand/v2"
	"time"
)

// backoff spaces out retries against an unreachable or failing store: exponential from min,
// capped at max, with full jitter so that a fleet that lost the store together does not return
// together.
type backoff struct {
	min, max time.Duration
	next     time.Duration
}

func newBackoff(min, max time.Duration) *backoff {
	return &backoff{min: min, max: max, next: min}
}

// wait sleeps for the next jittered interval; it returns false if ctx ended first.
func (b *backoff) wait(ctx context.Context) bool {
	return b.waitAtMost(ctx, b.max)
}

// waitAtMost is wait, but sleeps no longer than limit: for a retry that must also notice a
// deadline of its own.
func (b *backoff) waitAtMost(ctx context.Context, limit time.Duration) bool {
	t := time.NewTimer(min(b.step(), max(0, limit)))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// step returns the next jittered interval without sleeping, for a timer of the caller's.
func (b *backoff) step() time.Duration {
	d := b.next/2 + rand.N(b.next/2+1)
	b.next = min(b.next*2, b.max)
	return d
}

// reset starts the next series of retries from min again, after a success.
func (b *backoff) reset() { b.next = b.min }
