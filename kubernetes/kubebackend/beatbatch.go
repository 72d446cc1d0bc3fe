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
	g.mu.Lock()
	if g.st == nil || len(g.st.subs[election]) == 0 {
		g.mu.Unlock()
		return beacon.Unknown, nil // nothing here watches the key: write it
	}
	st := g.st
	batch := g.beats.Add(lease, election, token, func() int { return st.heldBy(lease) })
	g.mu.Unlock()
	return batch.Wait(ctx, election)
}

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
