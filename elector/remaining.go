package elector

import "time"

// Remaining is how long this term may still admit after now if nothing changes (no
// renewal, no heartbeat, no failsafe round): until the earlier of its lease deadline and
// its heartbeat deadline, by the more pessimistic clock, or until the end of a failsafe
// window that keeps it open, if that is later, exactly as Leading decides. It is zero for
// a term that does not hold the key or whose deadlines have passed, and says nothing of
// Draining, Settling or Releasing. Whoever must stop acting for a term by its own
// deadline (a connection admitted under it, say) can set a timer on it and check again
// when it fires: renewals and rounds only move it later.
func (t *Term) Remaining(now time.Time) time.Duration {
	if t.lease == nil || t.beat == nil {
		return 0
	}
	d := min(t.lease.remaining(now), t.beat.remaining(now))
	if t.failsafeOpen(now) {
		d = max(d, t.fs.remaining(now))
	}
	return d
}

// Now is the election's clock (the candidate's Config.Now), which Term.Leading and
// Term.Remaining are to be asked with.
func (e *Election) Now() time.Time { return e.c.now() }
