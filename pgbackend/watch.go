package pgbackend

import (
	"context"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
)

// PostgreSQL keeps no history of a row, so a watch reads the key's current state again
// whenever it may have changed and reports it when it differs from the last one reported:
//   - at once when a NOTIFY names the election (every insert, update or delete of its row,
//     an operator's too, fires one);
//   - when the holder's lease is due to expire by the server's clock, since nothing is
//     written then;
//   - at least every poll interval, because notifications are lost while the listener
//     reconnects and never come through a pooler in transaction mode.
//
// Changes that follow each other faster than a read can thus be reported as the last of
// them; Backend's contract allows that.

// remember notes o as the newest observation of election that this backend reported.
func (b *Backend) remember(election string, o elector.Observation) {
	b.lastMu.Lock()
	defer b.lastMu.Unlock()
	if cur, ok := b.last[election]; !ok || o.Revision >= cur.Revision {
		b.last[election] = o
	}
}

// baseline returns the state the caller saw at afterRev, if this backend reported it.
func (b *Backend) baseline(election string, afterRev int64) (elector.Observation, bool) {
	b.lastMu.Lock()
	defer b.lastMu.Unlock()
	o, ok := b.last[election]
	return o, ok && o.Revision == afterRev
}

// Watch implements elector.Backend. Without a baseline (afterRev is not a revision this
// backend reported for the election, say another client's), a held key whose row was last
// written at or before afterRev counts as already seen, and anything else is reported.
func (b *Backend) Watch(ctx context.Context, election string, afterRev int64) <-chan elector.Observation {
	out := make(chan elector.Observation, 1)
	base, known := b.baseline(election, afterRev)
	baseRev := int64(0)
	if known && base.Holder != nil {
		baseRev = -1 // the row's revision is not in an Observation: any read differs
	}
	b.follow(ctx, election, func(err error) { send(ctx, out, elector.Observation{Err: err}) },
		func(ctx context.Context) (time.Duration, bool) {
			r, err := b.read(ctx, election, 0)
			if err != nil {
				if ctx.Err() == nil {
					send(ctx, out, elector.Observation{Err: err})
				}
				return 0, false
			}
			if !known && r.obs.Holder != nil && r.rowRev <= afterRev {
				// Not written since afterRev: the caller saw this state already.
				base, baseRev, known = r.obs, r.rowRev, true
			}
			if !known || changed(base, baseRev, r) {
				if !send(ctx, out, r.obs) {
					return 0, false
				}
				b.remember(election, r.obs)
				base, baseRev, known = r.obs, r.rowRev, true
			}
			return r.remaining, true
		}, func() { close(out) })
	return out
}

// follow looks at an election's rows in a goroutine of the backend: once at the start,
// then again on every notification for the election, every poll interval, and a little
// past the moment look says something expires (0: nothing does), until look returns false
// or ctx or the backend ends; then it calls done. broken is told if the backend is not
// ready to start with.
func (b *Backend) follow(ctx context.Context, election string, broken func(error),
	look func(ctx context.Context) (time.Duration, bool), done func()) {
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		defer done()
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		stop := context.AfterFunc(b.ctx, cancel)
		defer stop()
		wake, unsubscribe := b.listener.subscribe(election)
		defer unsubscribe()
		if err := b.ready(ctx); err != nil {
			broken(err)
			return
		}
		for {
			expiry, ok := look(ctx)
			if !ok || !b.sleep(ctx, wake, expiry) {
				return
			}
		}
	}()
}

// changed reports whether r differs from the state last reported (base, whose row revision
// is baseRev, or -1 if unknown).
func changed(base elector.Observation, baseRev int64, r reading) bool {
	h := r.obs.Holder
	switch {
	case base.Holder == nil || h == nil:
		return (base.Holder == nil) != (h == nil)
	case baseRev == -1:
		// Known only from Campaign or Observe, which do not tell the row's revision: an
		// Update since (a heartbeat rewrites the same value) cannot be told from no change,
		// so the read is reported, and the watch has a row revision to compare from then on.
		return true
	default:
		return h.Token != base.Holder.Token || h.Lease != base.Holder.Lease || r.rowRev != baseRev
	}
}

// sleep waits for a notification, the poll interval, or (if expiry > 0) a little past the
// holder's lease expiry, whichever comes first; it returns false once ctx ends.
func (b *Backend) sleep(ctx context.Context, wake <-chan struct{}, expiry time.Duration) bool {
	d := time.Duration(b.poll.Load())
	if expiry > 0 {
		// The server's clock decides; a few milliseconds more make sure it has passed.
		d = min(d, expiry+5*time.Millisecond)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-wake:
		return true
	case <-t.C:
		return true
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
