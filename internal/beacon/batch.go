package beacon

import (
	"context"
	"sync"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
)

// Batch is the heartbeats of one lease's keys in a group that one beacon write answers.
// Its methods but Wait are called under the lock of the Batcher that made it.
type Batch[K any] struct {
	Lease elector.LeaseID
	// Keys are the heartbeats, by election: what the store needs to answer each (its
	// term's token, say).
	Keys map[string]K

	// want is how many keys the lease held when the batch began; full is closed when that
	// many have a heartbeat in it.
	want int
	full chan struct{}
	done chan struct{}
	// result and err are the answers, once done is closed.
	result map[string]Answer
	err    error
	// rev is the beacon's revision once its write returned; before that, the answers a
	// store's watch gave at every beacon of the lease are kept, since a watch may show the
	// write before the write's own answer arrives.
	rev  int64
	seen map[int64]map[string]Answer
}

// Resolved reports whether the batch has its answers.
func (b *Batch[K]) Resolved() bool {
	select {
	case <-b.done:
		return true
	default:
		return false
	}
}

// Resolve gives the batch its answers (nil: Unknown for every key), or err; only the
// first call counts.
func (b *Batch[K]) Resolve(result map[string]Answer, err error) {
	if b.Resolved() {
		return
	}
	b.result, b.err = result, err
	close(b.done)
}

// Seen gives the answers that a store's ordered watch found at a beacon of the batch's
// lease written at rev: they resolve the batch if rev is its beacon's, and are kept until
// the batch's beacon is known (Written).
func (b *Batch[K]) Seen(rev int64, answers map[string]Answer) {
	switch {
	case b.rev == rev:
		b.Resolve(answers, nil)
	case b.rev == 0:
		if b.seen == nil {
			b.seen = map[int64]map[string]Answer{}
		}
		b.seen[rev] = answers
	}
}

// Written notes that the batch's beacon was written at rev, and resolves the batch if its
// watch has shown that beacon already; it reports whether it did.
func (b *Batch[K]) Written(rev int64) bool {
	if answers, ok := b.seen[rev]; ok {
		b.Resolve(answers, nil)
		return true
	}
	b.rev = rev
	return false
}

// Wait returns election's answer once the batch has it, or Unknown when ctx ends first.
func (b *Batch[K]) Wait(ctx context.Context, election string) (Answer, error) {
	select {
	case <-b.done:
		return b.result[election], b.err
	case <-ctx.Done():
		return Unknown, ctx.Err()
	}
}

// Batcher writes each lease's beacon one write at a time: the heartbeats that arrive
// while a write is on its way share the next one, which is sent after they arrived (a
// heartbeat may count only on a write sent after it began). A batch is sent once every key
// its lease holds has a heartbeat in it, or Gather after it began.
type Batcher[K any] struct {
	// Mu is the store's lock that guards the batcher and its batches.
	Mu *sync.Mutex
	// Send writes batch's beacon; it, or the store's watch later, resolves the batch. It is
	// called without Mu, for one batch of a lease at a time.
	Send func(batch *Batch[K])
	// Go runs f in a goroutine of the store's (nil: a plain goroutine).
	Go func(f func())
	// Done, when closed, ends the wait for a batch to fill (the store is closing).
	Done <-chan struct{}

	queues map[elector.LeaseID]*queue[K]
}

// queue is one lease's batch to come, and whether a write of the lease's is on its way.
type queue[K any] struct {
	next    *Batch[K]
	sending bool
}

// Add adds the heartbeat key of election to lease's next batch and returns that batch;
// want is how many keys the lease holds in the group, asked when a batch begins. The
// caller holds Mu.
func (bt *Batcher[K]) Add(lease elector.LeaseID, election string, key K, want func() int) *Batch[K] {
	if bt.queues == nil {
		bt.queues = map[elector.LeaseID]*queue[K]{}
	}
	q := bt.queues[lease]
	if q == nil {
		q = &queue[K]{}
		bt.queues[lease] = q
	}
	if q.next == nil {
		q.next = &Batch[K]{Lease: lease, Keys: map[string]K{}, want: max(want(), 1),
			full: make(chan struct{}), done: make(chan struct{})}
	}
	batch := q.next
	// A heartbeat added again (retried while its batch waits) only replaces its key: it
	// counted toward full when first added, and full is closed once.
	_, again := batch.Keys[election]
	batch.Keys[election] = key
	if !again && len(batch.Keys) == batch.want {
		close(batch.full) // every key the lease holds is in: no need to wait for more
	}
	if !q.sending {
		q.sending = true
		if bt.Go != nil {
			bt.Go(func() { bt.run(lease, q) })
		} else {
			go bt.run(lease, q)
		}
	}
	return batch
}

// run sends lease's batches in turn, until none waits.
func (bt *Batcher[K]) run(lease elector.LeaseID, q *queue[K]) {
	for {
		bt.Mu.Lock()
		next := q.next
		bt.Mu.Unlock()
		if next != nil {
			gather := time.NewTimer(Gather)
			select {
			case <-next.full:
			case <-gather.C:
			case <-bt.Done:
			}
			gather.Stop()
		}
		bt.Mu.Lock()
		batch := q.next
		q.next = nil
		if batch == nil {
			q.sending = false
			delete(bt.queues, lease)
			bt.Mu.Unlock()
			return
		}
		bt.Mu.Unlock()
		bt.Send(batch)
	}
}

// UpdateAll is elector.HeartbeatBatcher's UpdateAll for a store whose grouped heartbeats
// go in beacons. join adds an update's heartbeat to its lease's next beacon and returns the
// batch (nil when no beacon can carry it: not a heartbeat, or nothing here watches the
// key); every heartbeat is added before any is waited for, so that one write carries all
// of a lease's. An update no beacon decided is rewrite's (Update's write of the key), at
// most parallel at once.
func UpdateAll[K any](ctx context.Context, updates []elector.KeyUpdate, join func(elector.KeyUpdate) *Batch[K],
	rewrite func(ctx context.Context, election string, token int64, value []byte) (bool, error), parallel int) []elector.UpdateResult {
	out := make([]elector.UpdateResult, len(updates))
	batches := make([]*Batch[K], len(updates))
	for i, u := range updates {
		batches[i] = join(u)
	}
	var rest []int
	for i, batch := range batches {
		if batch == nil {
			rest = append(rest, i)
			continue
		}
		answer, err := batch.Wait(ctx, updates[i].Election)
		if updated, decided := answer.Decided(); decided || err != nil {
			out[i] = elector.UpdateResult{Updated: updated && err == nil, Err: err}
			continue
		}
		rest = append(rest, i)
	}
	if len(rest) == 0 {
		return out
	}
	alone := make([]elector.KeyUpdate, len(rest))
	for j, i := range rest {
		alone[j] = updates[i]
	}
	for j, r := range elector.UpdateEach(ctx, alone, parallel, rewrite) {
		out[rest[j]] = r
	}
	return out
}

// Heartbeats is UpdateAll's join for a store that notes its writes in written and keeps
// its groups in groups: an update joins its lease's next beacon (add, nil when the beacon
// cannot carry it) if it is a heartbeat (the value its term wrote last) of a grouped key.
func Heartbeats[G any](groups *Groups[G], written *Written, add func(g *G, election string, token int64, lease elector.LeaseID) *Batch[int64]) func(elector.KeyUpdate) *Batch[int64] {
	return func(u elector.KeyUpdate) *Batch[int64] {
		if g := groups.Of(u.Election); g != nil {
			if lease, ok := written.Heartbeat(u.Election, u.Token, u.Value); ok {
				return add(g, u.Election, u.Token, lease)
			}
		}
		return nil
	}
}
