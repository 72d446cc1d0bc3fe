package pgbackend

import (
	"context"
	"time"

	"golang.org/x/time/rate"

	"github.com/caddyleader/caddy-leader/elector"
)

// PostgreSQL keeps no history of a row, so a watch reads the key's current state again
// whenever it may have changed and reports it when it differs from the last one reported:
//   - at once when a NOTIFY names the election's key (every insert, update or delete of its
//     row, an operator's too, fires one), but never more often than notificationReads
//     allows: a notification is a reason to look, and anyone who can connect can send one;
//   - when the holder's lease is due to expire by the server's clock, since nothing is
//     written then;
//   - at least every poll interval, because notifications are lost while the listener
//     reconnects and never come through a pooler in transaction mode.
//
// Changes that follow each other faster than a read can thus be reported as the last of
// them; Backend's contract allows that, except for the last write before a vacancy. A
// follower counts a vanished holder's deadline from the last write it saw through the
// watch; a heartbeat written just before an operator's DELETE, both between two reads,
// would leave it counting from an older one while the holder still admits. So a read
// that finds the key vacant also finds the key as it was last written (the row whose
// lease expired, or what the vacated trigger saved), and when that write is not the one
// last reported, the watch reports it first, then the vacancy. When even that is unknown
// (the row went by TRUNCATE, say), it reports the holder it last reported once more: the
// follower then counts from the read that found the key gone, which is later than any
// write before it.

// reported is a state a watch, a campaign or a read of this backend reported, with the
// revision of the key's last write it reflects (reading.rowRev).
type reported struct {
	obs    elector.Observation
	rowRev int64
}

// recentReports is how many reported states per election remember keeps, so that a watch
// started from any of them (two elections of one name during a reload, each watching)
// knows what its caller saw.
const recentReports = 8

// remember notes s as reported for election.
func (b *Backend) remember(election string, s reported) {
	b.lastMu.Lock()
	defer b.lastMu.Unlock()
	recent := append(b.last[election], s)
	if len(recent) > recentReports {
		recent = recent[len(recent)-recentReports:]
	}
	b.last[election] = recent
}

// baseline returns the state this backend reported at afterRev, if it did.
func (b *Backend) baseline(election string, afterRev int64) (reported, bool) {
	b.lastMu.Lock()
	defer b.lastMu.Unlock()
	for _, s := range b.last[election] {
		if s.obs.Revision == afterRev {
			return s, true
		}
	}
	return reported{}, false
}

// Watch implements elector.Backend. Without a baseline (afterRev is not a revision this
// backend reported for the election, say another client's), a key whose row was last
// written at or before afterRev counts as already seen in that state, and anything else is
// reported. The watches of a group's elections share one read of the group (groupwatch.go).
func (b *Backend) Watch(ctx context.Context, election string, afterRev int64) <-chan elector.Observation {
	if g := b.groupOf(election); g != nil {
		return b.watchGrouped(ctx, g, election, afterRev, func() {})
	}
	out := make(chan elector.Observation, 1)
	see := b.keyWatch(election, afterRev, func(o elector.Observation) bool { return send(ctx, out, o) })
	broken := func(err error) { send(ctx, out, elector.Observation{Err: err}) }
	b.follow(ctx, topic{election, keyTopic}, broken,
		func(ctx context.Context, _ wakeup) (time.Duration, bool) {
			r, err := b.read(ctx, election, 0)
			if err != nil {
				if ctx.Err() == nil {
					send(ctx, out, elector.Observation{Err: err})
				}
				return 0, false
			}
			return r.remaining, see(r)
		}, func() { close(out) })
	return out
}

// WatchWaking implements elector.WakingWatcher: a grouped election's watch wakes its
// reader from the group's one feed; another's is passed on by a goroutine that does.
func (b *Backend) WatchWaking(ctx context.Context, election string, seen elector.Observation, wake func()) <-chan elector.Observation {
	if g := b.groupOf(election); g != nil {
		return b.watchGrouped(ctx, g, election, seen.Revision, wake)
	}
	return elector.PassOnWaking(ctx, b.Watch(ctx, election, seen.Revision), wake)
}

var _ elector.WakingWatcher = (*Backend)(nil)

// watchGrouped is Watch for an election of group g, from the group's feed; wake is called
// after each observation queued and when the watch closes.
func (b *Backend) watchGrouped(ctx context.Context, g *group, election string, afterRev int64, wake func()) <-chan elector.Observation {
	out := make(chan elector.Observation, groupWatchBuffer)
	put := func(o elector.Observation) bool {
		if !offer(out, o) {
			return false
		}
		wake()
		return true
	}
	see := b.keyWatch(election, afterRev, put)
	// A read that finds the key as the last one did has nothing new for this watch (news
	// reports nothing twice); most of a set's keys are, at every read, since a read
	// comes at every owner's beacon and only that owner's keys have beaten.
	var (
		last         groupKey
		lastOK, seen bool
	)
	// The read that serves this watch first reads its key after the watch began, however
	// little else it reads (groupkeys.go).
	g.keyNews.mark(election, false)
	g.keys.followKey(ctx, election, func(err error) { put(elector.Observation{Err: err}) }, func(keys groupKeys) bool {
		key, ok := keys.keys[election]
		if seen && key.sameAs(ok, last, lastOK) {
			return true
		}
		seen, last, lastOK = true, key, ok
		return see(keys.reading(election))
	}, func() {
		close(out)
		wake()
	})
	return out
}

// groupWatchBuffer is how many reports a watch of a group's rows holds for its reader: the
// feed hands them over without waiting, and ends the watch of a reader that falls further
// behind (it then reads again).
const groupWatchBuffer = 8

// keyWatch returns what a watch of election from afterRev does with each read of the key:
// report with put what is new (see news), and say whether to go on (put's answer).
func (b *Backend) keyWatch(election string, afterRev int64, put func(elector.Observation) bool) func(reading) bool {
	base, known := b.baseline(election, afterRev)
	return func(r reading) bool {
		switch {
		case known:
		case r.obs.Holder != nil && r.rowRev <= afterRev:
			// Not written since afterRev: the caller saw this state already.
			base, known = reported{r.obs, r.rowRev}, true
		case r.last != nil && r.rowRev <= afterRev:
			// Last written before afterRev: the caller saw that write.
			base, known = reported{elector.Observation{Revision: afterRev, Holder: r.last}, r.rowRev}, true
		}
		for _, s := range news(base, known, r) {
			if !put(s.obs) {
				return false
			}
			b.remember(election, s)
			base, known = s, true
		}
		return true
	}
}

// news is what a watch that last reported base (if known) reports of read r, in order.
func news(base reported, known bool, r reading) []reported {
	now := reported{r.obs, r.rowRev}
	h, was := r.obs.Holder, base.obs.Holder
	switch {
	case h != nil:
		if known && was != nil && h.Token == was.Token && h.Lease == was.Lease && r.rowRev == base.rowRev {
			return nil
		}
		return []reported{now}
	case known && was == nil && r.rowRev == base.rowRev:
		return nil // vacant still, after the same last write
	case known && was != nil && r.last != nil && r.last.Token == was.Token && r.rowRev == base.rowRev:
		return []reported{now} // its last write was reported
	case r.last != nil:
		return []reported{{elector.Observation{Revision: r.lastAt, Holder: r.last}, r.rowRev}, now}
	case known && was != nil:
		return []reported{{elector.Observation{Revision: r.lastAt, Holder: was}, base.rowRev}, now}
	default:
		return []reported{now}
	}
}

// notificationReads bounds the looks that notifications make one watch take: a burst of a
// few (a handover's delete and insert, a heartbeat), then one every 20 ms at most. Real
// changes come nowhere near it; a flood of forged NOTIFYs costs each watch 50 reads a
// second, not one per notification.
func notificationReads() *rate.Limiter { return rate.NewLimiter(rate.Every(20*time.Millisecond), 4) }

// wakeup is why a watch looks at its rows.
type wakeup struct {
	// asked is set when the watch starts and when a notification about its topic came
	// (the listener sends one to every watch when it has reconnected, since some may have
	// been lost); a look that is not asked was woken by the timer alone. A notification
	// only ever makes the watch look: what it finds decides.
	asked bool
}

// follow looks at t's rows in a goroutine of the backend: once at the start, then again
// on every notification about t (within notificationReads), every poll interval, and a
// little past the moment look says something expires (0: nothing does), until look
// returns false or ctx or the backend ends; then it calls done. broken is told if the
// backend is not ready to start with.
func (b *Backend) follow(ctx context.Context, t topic, broken func(error),
	look func(ctx context.Context, why wakeup) (time.Duration, bool), done func()) {
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		defer done()
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		stop := context.AfterFunc(b.ctx, cancel)
		defer stop()
		sub, unsubscribe := b.listener.subscribe(t, nil)
		defer unsubscribe()
		if err := b.ready(ctx); err != nil {
			broken(err)
			return
		}
		reads := notificationReads()
		for asked := true; ; {
			expiry, ok := look(ctx, wakeup{asked: asked})
			if !ok {
				return
			}
			if asked, ok = b.sleep(ctx, sub.wake, expiry, reads); !ok {
				return
			}
		}
	}()
}

// sleep waits for a notification (then for reads to allow one more look), the poll
// interval, or (if expiry > 0) a little past the holder's lease expiry, whichever comes
// first. It reports whether a notification woke it, and false once ctx ends.
func (b *Backend) sleep(ctx context.Context, wake <-chan struct{}, expiry time.Duration, reads *rate.Limiter) (notified, ok bool) {
	d := time.Duration(b.poll.Load())
	if expiry > 0 {
		// The server's clock decides; a few milliseconds more make sure it has passed.
		d = min(d, expiry+5*time.Millisecond)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false, false
	case <-wake:
		return true, reads.Wait(ctx) == nil
	case <-t.C:
		return false, true
	}
}

func send[T any](ctx context.Context, out chan<- T, v T) bool {
	select {
	case out <- v:
		return true
	case <-ctx.Done():
		return false
	}
}
