package elector

import (
	"testing"
	"time"
)

func TestStoppedBy(t *testing.T) {
	const ttl = 10 * time.Second
	now := time.Now()
	seen := now.Add(-3 * time.Second)
	wait := beatWindow(ttl) + safetyMargin(ttl) // the ttl
	cases := []struct {
		name        string
		term        observedTerm
		fallbackTTL time.Duration
		named       bool // the store named the term as the one before the new one
		want        time.Time
	}{
		// The watch showed the key go away after the last heartbeat seen: that one was
		// the holder's last, and it stops admitting within beatWindow of sending it.
		{"vacancy_seen_through_the_watch", observedTerm{token: 7, ttl: ttl, seen: seen, vacated: true}, time.Second, false, seen.Add(wait)},
		// Found vacant by a read: heartbeats after the last one seen may have been
		// missed, but all of them were sent before now.
		{"vacancy_found_by_a_read", observedTerm{token: 7, ttl: ttl, seen: seen}, time.Second, false, now.Add(wait)},
		{"record_without_ttl_uses_the_fallback", observedTerm{token: 7, seen: seen, vacated: true}, ttl, false, seen.Add(wait)},
		// A read after the watched vacancy (a candidate held off that only looked):
		// terms may have come and gone in between, unless the store names this one.
		{"read_after_the_watched_vacancy_unnamed", observedTerm{token: 7, ttl: ttl, seen: seen, vacated: true, readSince: true}, time.Second, false, now.Add(wait)},
		{"read_after_the_watched_vacancy_named", observedTerm{token: 7, ttl: ttl, seen: seen, vacated: true, readSince: true}, time.Second, true, seen.Add(wait)},
		// Another candidate announced a longer ttl: an unwatched end is waited out with it.
		{"a_longer_fleet_ttl_counts", observedTerm{token: 7, ttl: ttl, seen: seen}, 2 * ttl, false, now.Add(beatWindow(2*ttl) + safetyMargin(2*ttl))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.term.stoppedBy(now, tc.fallbackTTL, tc.named); !got.Equal(tc.want) {
				t.Fatalf("stoppedBy = now%+v, want now%+v", got.Sub(now), tc.want.Sub(now))
			}
		})
	}
}

// TestHeartbeatWindow checks the arithmetic that keeps failover fast and slow links
// tolerable: a heartbeat sent together with a renewal lets a successor start no later than
// the lease renewed with it expires in the store, and gives its sender as long to admit as
// the renewal does, so a slow link costs admission no sooner than it costs the lease.
func TestHeartbeatWindow(t *testing.T) {
	for _, ttl := range []time.Duration{time.Second, 2 * time.Second, 10 * time.Second, time.Hour} {
		t.Run(ttl.String(), func(t *testing.T) {
			successorWaits := beatWindow(ttl) + safetyMargin(ttl)
			if successorWaits > ttl {
				t.Fatalf("a successor waits %s after the last heartbeat, more than the ttl %s", successorWaits, ttl)
			}
			if beatWindow(ttl) >= successorWaits {
				t.Fatalf("the holder admits %s after a heartbeat, not less than the %s its successor waits", beatWindow(ttl), successorWaits)
			}
			if lease := ttl - safetyMargin(ttl); beatWindow(ttl) < lease {
				t.Fatalf("beatWindow %s is shorter than what a renewal gives, %s", beatWindow(ttl), lease)
			}
		})
	}
}
