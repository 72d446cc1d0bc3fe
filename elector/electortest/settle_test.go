package electortest_test

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/elector/electortest"
)

// countReleased counts the Released requests of one candidate: each is a write in etcd (a
// delete of the acknowledgement it consumes).
type countReleased struct {
	elector.Backend
	n *atomic.Int64
}

func (c countReleased) Released(ctx context.Context, election string, token int64, lease elector.LeaseID) (bool, string, error) {
	c.n.Add(1)
	return c.Backend.Released(ctx, election, token, lease)
}

// TestSettleAfterAFleetRestartAsksLittle: a whole fleet stops and starts again more than a
// ttl later, when the last terms' acknowledgements are gone. The store names the last
// term, which nobody in the new fleet saw, so each new leader waits a ttl for it, asking
// the store meanwhile whether it acknowledged after all. Those requests are a few per
// ttl, not one every 100 ms: a shard set of hundreds of shards settles all at once. The
// ttl is the default one, on the bubble's clock (testing/synctest), so that the count
// depends on nothing but the elector's schedule.
func TestSettleAfterAFleetRestartAsksLittle(t *testing.T) {
	const (
		ttl = 10 * time.Second
		// most is the bound on the requests of one settle of one election; today's
		// schedule, at most every ttl/4 after a quick start, makes about 13.
		most = 20
	)
	synctest.Test(t, func(t *testing.T) {
		s := electortest.NewStore()
		s.RunClock(t, 50*time.Millisecond)
		start := func(released *atomic.Int64) *electortest.Fleet {
			return electortest.StartFleet(t, electortest.FleetOptions{
				Size: 2, TTL: ttl, Now: s.Now,
				Backend: func(testing.TB, int) elector.Backend {
					return countReleased{Backend: s.Client(), n: released}
				},
			})
		}
		before := start(new(atomic.Int64))
		before.Leader(3 * ttl)
		for _, m := range before.Members {
			ctx, cancel := context.WithTimeout(context.Background(), ttl)
			m.Candidate.Release(m.Election)
			_ = m.Candidate.Close(ctx)
			cancel()
		}
		time.Sleep(2 * ttl) // the acknowledgements of the stopped terms expire
		var released atomic.Int64
		after := start(&released)
		m, _ := after.Leader(3 * ttl)
		if why := m.Election.Term().Reason; why != elector.ReasonPredecessorTimedOut {
			t.Fatalf("the new leader began because %q; want %q (the sequence needs a settle that waits)", why, elector.ReasonPredecessorTimedOut)
		}
		if n := released.Load(); n > most {
			t.Fatalf("the new fleet asked the store %d times in one settle of a ttl whether the last term acknowledged its end; want at most %d", n, most)
		}
		t.Logf("%d requests in one settle of a ttl (%s)", released.Load(), ttl)
	})
}
