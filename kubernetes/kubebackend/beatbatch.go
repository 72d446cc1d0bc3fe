package kubebackend

import (
	"context"
	"errors"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
)

// How the heartbeats of one lease's keys in a group share a beacon write (beacon.go).

// A heartbeat's answer from the beacon: its key was the term's at the beacon's revision,
// certainly was not, or the stream cannot tell (no Watch of the key from before it, or
// the beacon does not count for the key); then the key is written instead.
type beatAnswer uint8

const (
	beatUnknown beatAnswer = iota
	beatHeld
	beatGone
)

// beatBatch is the heartbeats one beacon write answers.
type beatBatch struct {
	lease elector.LeaseID
	keys  map[string]int64 // election -> token
	// rev is the beacon's revision once the write returned; before that, the answers at
	// every beacon of the lease the stream showed are kept, since the stream may show the
	// write before its answer arrives.
	rev     int64
	answers map[int64]map[string]beatAnswer
	// want is how many keys the lease held when the batch began; full is closed when that
	// many have a heartbeat in it.
	want   int
	full   chan struct{}
	done   chan struct{}
	result map[string]beatAnswer
	err    error
}

func (b *beatBatch) resolved() bool {
	select {
	case <-b.done:
		return true
	default:
		return false
	}
}

func (b *beatBatch) resolve(result map[string]beatAnswer, err error) {
	if b.resolved() {
		return
	}
	b.result, b.err = result, err
	close(b.done)
}

func (b *beatBatch) seen(rev int64, answers map[string]beatAnswer) {
	switch {
	case b.rev == rev:
		b.resolve(answers, nil)
	case b.rev == 0:
		if b.answers == nil {
			b.answers = map[int64]map[string]beatAnswer{}
		}
		b.answers[rev] = answers
	}
}

// beaconBatcher writes one lease's beacon, one write at a time: the heartbeats that arrive
// while a write is on its way share the next one, which is sent after they arrived (a
// heartbeat may count only on a write sent after it began).
type beaconBatcher struct {
	next    *beatBatch
	sending bool
}

// beat answers a heartbeat of election's term token, held under lease, with a beacon.
func (g *group) beat(ctx context.Context, election string, token int64, lease elector.LeaseID) (beatAnswer, error) {
	g.mu.Lock()
	if g.st == nil || len(g.st.subs[election]) == 0 {
		g.mu.Unlock()
		return beatUnknown, nil // nothing here watches the key: write it
	}
	bb := g.batchers[lease]
	if bb == nil {
		bb = &beaconBatcher{}
		g.batchers[lease] = bb
	}
	if bb.next == nil {
		bb.next = &beatBatch{lease: lease, keys: map[string]int64{}, want: g.st.heldBy(lease),
			done: make(chan struct{}), full: make(chan struct{})}
	}
	batch := bb.next
	batch.keys[election] = token
	if len(batch.keys) == batch.want {
		close(batch.full) // every key the lease holds is in: no need to wait for more
	}
	if !bb.sending {
		bb.sending = true
		go g.send(lease, bb)
	}
	g.mu.Unlock()
	select {
	case <-batch.done:
		return batch.result[election], batch.err
	case <-ctx.Done():
		return beatUnknown, ctx.Err()
	}
}

// beaconGather is how long a beacon waits for the heartbeats of the other keys its lease
// holds once the first has come: they are all sent at one renewal, and one write should
// carry them all, not the first alone and the rest in a second.
const beaconGather = 20 * time.Millisecond

// send writes lease's beacon for each batch of heartbeats in turn, until none waits.
func (g *group) send(lease elector.LeaseID, bb *beaconBatcher) {
	for {
		g.mu.Lock()
		next := bb.next
		g.mu.Unlock()
		if next != nil {
			gather := time.NewTimer(beaconGather)
			select {
			case <-next.full:
			case <-gather.C:
			}
			gather.Stop()
		}
		g.mu.Lock()
		batch, st := bb.next, g.st
		bb.next = nil
		if batch == nil {
			bb.sending = false
			delete(g.batchers, lease)
			g.mu.Unlock()
			return
		}
		if st == nil {
			g.mu.Unlock()
			batch.resolve(nil, nil)
			continue
		}
		st.beats[lease] = append(st.beats[lease], batch)
		g.mu.Unlock()

		rev, err := g.putBeacon(lease)

		g.mu.Lock()
		switch {
		case errors.Is(err, errBeaconContended):
			batch.resolve(nil, nil)
		case err != nil:
			batch.resolve(nil, err)
		case batch.answers[rev] != nil:
			batch.resolve(batch.answers[rev], nil)
		case g.st != st || st.pos >= rev:
			batch.resolve(nil, nil) // the stream broke, or passed the beacon unseen
		default:
			batch.rev = rev
		}
		if g.st == st {
			st.dropResolved(lease)
		}
		g.mu.Unlock()
	}
}
