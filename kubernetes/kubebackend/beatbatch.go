package kubebackend

import (
	"context"
	"errors"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/internal/beacon"
)

// How the heartbeats of one lease's keys in a group share a beacon write (beacon.go); the
// batching itself is the stores' shared one (internal/beacon).

// beat answers a heartbeat of election's term token, held under lease, with a beacon.
func (g *group) beat(ctx context.Context, election string, token int64, lease elector.LeaseID) (beacon.Answer, error) {
	batch := g.addBeat(election, token, lease)
	if batch == nil {
		return beacon.Unknown, nil // nothing here watches the key: write it
	}
	return batch.Wait(ctx, election)
}

// addBeat adds a heartbeat of election's term token, held under lease, to the lease's next
// beacon and returns its batch; nil when nothing here watches the key (it must be written).
func (g *group) addBeat(election string, token int64, lease elector.LeaseID) *beacon.Batch[int64] {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.st == nil || len(g.st.subs[election]) == 0 {
		return nil
	}
	st := g.st
	return g.beats.Add(lease, election, token, func() int { return st.heldBy(lease) })
}

// UpdateAll implements elector.HeartbeatBatcher: the heartbeats of a group's keys join
// their lease's next beacon together, so one write answers them all; an update the beacon
// cannot answer is Update's write of the key's object, rewriteParallel at once.
func (b *Backend) UpdateAll(ctx context.Context, updates []elector.KeyUpdate) []elector.UpdateResult {
	return beacon.UpdateAll(ctx, updates, beacon.Heartbeats(&b.groups, &b.written, (*group).addBeat), b.rewrite, rewriteParallel)
}

// rewriteParallel is how many of UpdateAll's own writes are on their way at once: they
// share the client's rate limit with everything else.
const rewriteParallel = 4

// sendBeacon writes batch's beacon; the stream answers its heartbeats when it shows the
// beacon (groupStream.judge).
func (g *group) sendBeacon(batch *beacon.Batch[int64]) {
	lease := batch.Lease
	g.mu.Lock()
	st := g.st
	if st == nil {
		batch.Resolve(nil, nil)
		g.mu.Unlock()
		return
	}
	st.beats[lease] = append(st.beats[lease], batch)
	g.mu.Unlock()

	rev, err := g.putBeacon(lease)

	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case errors.Is(err, errBeaconContended):
		batch.Resolve(nil, nil)
	case err != nil:
		batch.Resolve(nil, err)
	case batch.Written(rev):
	case g.st != st || st.pos >= rev:
		batch.Resolve(nil, nil) // the stream broke, or passed the beacon unseen
	}
	if g.st == st {
		st.dropResolved(lease)
	}
}
