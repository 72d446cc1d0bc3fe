package elector

import (
	"context"
)

// writeRecord rewrites the key of this instance's term t (its record as it won it, marked
// as handing over once that was announced) if the key is still t's, and moves t's heartbeat
// deadline on from the time the write was sent. Followers see every write through their
// watch; see beatWindow for why that matters. It reports whether the key was still t's.
func (e *Election) writeRecord(ctx context.Context, t *Term) (bool, error) {
	e.writeMu.Lock()
	defer e.writeMu.Unlock()
	rec := t.Leader
	rec.HandingOver = e.handoverAnnounced.Load() == t.Token
	rctx, cancel := context.WithTimeout(ctx, e.c.requestTimeout)
	defer cancel()
	sent := e.c.now()
	ok, err := e.c.cfg.Backend.Update(rctx, e.name, t.Token, rec.encode())
	if ok {
		t.beat.set(sent.Add(beatWindow(t.lease.granted)))
	}
	return ok, err
}

// keepBeating rewrites the key of this instance's term t whenever a renewal of its lease is
// sent, and at once if the term has no heartbeat deadline yet, until the term ends. A
// heartbeat that is still on its way when the next renewal is sent is followed by another
// as soon as it is done; a failed one is tried again with the next renewal. The term stops
// admitting when its heartbeat deadline passes, as when its lease deadline passes.
func (e *Election) keepBeating(t *Term) {
	l := t.lease
	next := l.renewalSent()
	failed := false
	for {
		if failed || t.beat.valid(e.c.now()) {
			select {
			case <-t.end.Done():
				return
			case <-l.lost:
				return
			case <-next:
			}
		}
		next = l.renewalSent()
		ok, err := e.writeRecord(t.end, t)
		switch {
		case t.end.Err() != nil:
			return
		case err != nil:
			e.c.storeFailed("heartbeat", err) // tried again with the next renewal
		case !ok:
			return // the key is no longer this term's: the watch tells the loop
		}
		failed = err != nil
	}
}
