package elector

import (
	"context"
	"fmt"
	"testing"
	"time"
)

func TestLeaseDeadline(t *testing.T) {
	sent := time.Now()
	const ttl = 10 * time.Second
	margin := safetyMargin(ttl)
	cases := []struct {
		name  string
		at    time.Time
		valid bool
	}{
		{"valid_right_after_the_renewal_was_sent", sent, true},
		{"valid_just_before_ttl_minus_margin", sent.Add(ttl - margin - time.Millisecond), true},
		{"invalid_at_ttl_minus_margin", sent.Add(ttl - margin), false},
		{"invalid_after_the_server_side_expiry", sent.Add(ttl + time.Second), false},
		// A paused process resumes with both clocks far ahead.
		{"invalid_after_a_long_pause", sent.Add(time.Hour), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := newLease(1, time.Second)
			l.extend(sent, ttl, margin)
			if got := l.valid(tc.at); got != tc.valid {
				t.Fatalf("valid(%s after send) = %v, want %v", tc.at.Sub(sent), got, tc.valid)
			}
			if rem := l.remaining(tc.at); (rem > 0) != tc.valid {
				t.Fatalf("remaining = %s, inconsistent with valid = %v", rem, tc.valid)
			}
		})
	}
}

func TestLeaseNeedsBothClocks(t *testing.T) {
	// Each case moves one clock's deadline into the past while the other stays ahead, as
	// when a suspended machine resumes (wall clock moved, monotonic not) or the wall clock
	// is stepped forward.
	cases := []struct {
		name string
		past func(l *lease, now time.Time)
	}{
		{"wall_clock_past_the_deadline", func(l *lease, now time.Time) {
			l.wall.Store(now.Add(-time.Second).UnixNano())
		}},
		{"monotonic_clock_past_the_deadline", func(l *lease, now time.Time) {
			l.mono.Store(int64(now.Add(-time.Second).Sub(clockBase)))
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Now()
			l := newLease(1, time.Second)
			l.extend(now, 10*time.Second, time.Second)
			if !l.valid(now) {
				t.Fatal("setup: fresh lease not valid")
			}
			tc.past(l, now)
			if l.valid(now) {
				t.Fatal("admitted with one clock past the deadline")
			}
			if r := l.remaining(now); r != 0 {
				t.Fatalf("remaining = %s, want 0", r)
			}
		})
	}
}

func TestLeaseGiveUp(t *testing.T) {
	l := newLease(1, time.Second)
	l.extend(time.Now(), 10*time.Second, time.Second)
	l.giveUp()
	l.giveUp() // idempotent
	if l.valid(time.Now()) {
		t.Fatal("a given-up lease still admits")
	}
	select {
	case <-l.lost:
	default:
		t.Fatal("lost is not closed")
	}
}

func TestTermLeading(t *testing.T) {
	now := time.Now()
	live := newLease(1, time.Second)
	live.extend(now, 10*time.Second, time.Second)
	expired := newLease(2, time.Second)
	expired.extend(now.Add(-time.Minute), 10*time.Second, time.Second)
	beating, silent := &deadline{}, &deadline{}
	beating.set(now.Add(time.Second))
	silent.set(now.Add(-time.Millisecond))
	cases := []struct {
		name string
		term Term
		want bool
	}{
		{"follower", Term{}, false},
		{"holder_with_live_lease_and_heartbeat", Term{lease: live, beat: beating}, true},
		{"holder_draining", Term{lease: live, beat: beating, Draining: true}, false},
		{"holder_settling", Term{lease: live, beat: beating, Settling: true}, false},
		{"holder_releasing", Term{lease: live, beat: beating, Releasing: true}, false},
		{"holder_with_expired_lease", Term{lease: expired, beat: beating}, false},
		{"holder_whose_heartbeat_ran_out", Term{lease: live, beat: silent}, false},
		{"holder_that_never_beat", Term{lease: live, beat: &deadline{}}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.term.Leading(now); got != tc.want {
				t.Fatalf("Leading = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestBackoffStaysWithinBounds(t *testing.T) {
	b := newBackoff(time.Millisecond, 8*time.Millisecond)
	for range 10 {
		if b.next < b.min || b.next > b.max {
			t.Fatalf("next = %s outside [%s, %s]", b.next, b.min, b.max)
		}
		if !b.wait(context.Background()) {
			t.Fatal("wait returned false without cancellation")
		}
	}
	if b.next != b.max {
		t.Fatalf("after many failures next = %s, want the cap %s", b.next, b.max)
	}
	b.reset()
	if b.next != b.min {
		t.Fatalf("after reset next = %s, want %s", b.next, b.min)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if b.wait(ctx) {
		t.Fatal("wait returned true on a cancelled context")
	}
}

func TestNewCandidateRejectsBadConfig(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
	}{
		{"empty_id", Config{TTL: time.Second, Backend: nilBackend{}}},
		{"ttl_below_minimum", Config{ID: "a", TTL: 500 * time.Millisecond, Backend: nilBackend{}}},
		{"no_backend", Config{ID: "a", TTL: time.Second}},
		{"negative_drain", Config{ID: "a", TTL: time.Second, Backend: nilBackend{}, DrainTimeout: -1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := NewCandidate(tc.cfg); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

// nilBackend satisfies Backend for config checks that never reach the store.
type nilBackend struct{ Backend }

// TestStoreRewoundGivesUpTheLease: whichever request notices that the store went back in
// time (here a watch), the lease is given up at once, not at the next renewal.
func TestStoreRewoundGivesUpTheLease(t *testing.T) {
	c, err := NewCandidate(Config{ID: "a", TTL: time.Minute, Backend: nilBackend{}})
	if err != nil {
		t.Fatal(err)
	}
	l := newLease(1, time.Minute)
	l.extend(time.Now(), time.Minute, time.Second)
	c.setLease(l)
	c.storeFailed("watch", fmt.Errorf("watch: %w", ErrStoreRewound))
	if l.valid(time.Now()) {
		t.Fatal("the lease still admits after the store went back in time")
	}
	select {
	case <-l.lost:
	default:
		t.Fatal("the elections were not told the lease is lost")
	}
}

// TestRenewalInFlightCannotReviveAGivenUpLease: a renewal answered after the lease was given
// up (after a rewind, say) must not make it valid again.
func TestRenewalInFlightCannotReviveAGivenUpLease(t *testing.T) {
	now := time.Now()
	l := newLease(1, 10*time.Second)
	l.extend(now, 10*time.Second, time.Second)
	l.giveUp()
	l.extend(now, 10*time.Second, time.Second) // the answer of a renewal sent before
	if l.valid(now) {
		t.Fatal("a lease given up is valid again after a renewal that was in flight")
	}
}
