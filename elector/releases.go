package elector

import (
	"context"
	"sync"
	"time"
)

// releases sends a candidate's releases through the store's Batcher, where the store has
// one: a release asked for while another is on its way waits, with every other asked for
// meanwhile, and they all go in one batch when that one is answered (group commit). A
// release that finds none on its way goes at once, alone, as the single Backend call, so a
// plain election's handover is what it was. It serves a shard set's SIGTERM, when hundreds
// of shards hand over at once and their releases were as many requests. Nothing waits on a
// timer, and no goroutine is kept: a batch is sent by one that ends when nothing is left.
type releases struct {
	backend Backend
	batch   Batcher // nil: the store does not batch, and every release goes alone

	mu      sync.Mutex
	busy    bool // a release or a batch is on its way
	pending []*pendingRelease
}

type pendingRelease struct {
	ctx   context.Context
	term  HeldTerm
	lease LeaseID
	why   string
	err   error
	done  chan struct{}
}

func newReleases(b Backend) *releases {
	r := &releases{backend: b}
	r.batch, _ = b.(Batcher)
	return r
}

// release is Backend.Release, batched with the releases asked for meanwhile.
func (r *releases) release(ctx context.Context, election string, token int64, lease LeaseID, why string) error {
	if r.batch == nil {
		return r.backend.Release(ctx, election, token, lease, why)
	}
	r.mu.Lock()
	if !r.busy {
		r.busy = true
		r.mu.Unlock()
		err := r.backend.Release(ctx, election, token, lease, why)
		r.next()
		return err
	}
	p := &pendingRelease{ctx: ctx, term: HeldTerm{Election: election, Token: token}, lease: lease, why: why, done: make(chan struct{})}
	r.pending = append(r.pending, p)
	r.mu.Unlock()
	select {
	case <-p.done:
		return p.err
	case <-ctx.Done():
		// The batch may still carry it: as after any request its context ended, the
		// caller does not know whether it took effect.
		return ctx.Err()
	}
}

// next, once a release or a batch is answered, sends what waited meanwhile from a
// goroutine of its own, or marks the group idle.
func (r *releases) next() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.pending) == 0 {
		r.busy = false
		return
	}
	go r.flush()
}

// flush sends batches until nothing waits.
func (r *releases) flush() {
	for {
		r.mu.Lock()
		if len(r.pending) == 0 {
			r.busy = false
			r.mu.Unlock()
			return
		}
		batch, rest := takeBatch(r.pending)
		r.pending = rest
		r.mu.Unlock()
		r.send(batch)
	}
}

// takeBatch splits off the first batch of pending: the releases under the first one's
// lease and for its why, each election once, in the order they came; the rest wait.
func takeBatch(pending []*pendingRelease) (batch, rest []*pendingRelease) {
	first := pending[0]
	seen := make(map[string]bool, len(pending))
	for _, p := range pending {
		if p.lease != first.lease || p.why != first.why || seen[p.term.Election] {
			rest = append(rest, p)
			continue
		}
		seen[p.term.Election] = true
		batch = append(batch, p)
	}
	return batch, rest
}

// send makes one batch, under a context that lasts until the latest of its callers'
// deadlines (a caller whose own context ends sooner has returned already).
func (r *releases) send(batch []*pendingRelease) {
	ctx, cancel := context.WithCancel(context.Background())
	if latest, ok := latestDeadline(batch); ok {
		cancel()
		ctx, cancel = context.WithDeadline(context.Background(), latest)
	}
	defer cancel()
	terms := make([]HeldTerm, len(batch))
	for i, p := range batch {
		terms[i] = p.term
	}
	err := r.batch.ReleaseAll(ctx, terms, batch[0].lease, batch[0].why)
	for _, p := range batch {
		p.err = err
		close(p.done)
	}
}

// latestDeadline is the latest of the batch's callers' deadlines; ok is false when one of
// them has none.
func latestDeadline(batch []*pendingRelease) (latest time.Time, ok bool) {
	for _, p := range batch {
		d, has := p.ctx.Deadline()
		if !has {
			return time.Time{}, false
		}
		if d.After(latest) {
			latest = d
		}
	}
	return latest, true
}
