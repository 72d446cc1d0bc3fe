package electortest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector/electortest"
)

// TestNeverLeaderlessLongerThanTheFault: a fault that touches one request, or one kind of
// write, must not leave the fleet without a leader for longer than it lasts (or a ttl).
func TestNeverLeaderlessLongerThanTheFault(t *testing.T) {
	t.Parallel()
	t.Run("a_release_that_fails_is_retried", func(t *testing.T) {
		t.Parallel()
		f, _ := fakeFleet(t, 2)
		l, token := f.Leader(within)
		// Three tries fail: the resign's own, and the campaign loop's look again after it.
		client(f, l).Fail("Release", 3, errors.New("answer lost"))
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		if err := l.Election.Resign(ctx, time.Hour); err == nil {
			t.Fatal("the resign's release did not fail")
		}
		// No time passes on the store's clock: the key must go at once, not after the
		// hour of hold-off.
		f.NewLeader(l, token, within)
	})
	t.Run("a_term_whose_heartbeats_fail_ends_and_lets_another_lead", func(t *testing.T) {
		t.Parallel()
		f, s := fakeFleet(t, 2)
		l, token := f.Leader(within)
		ended := l.Election.Term().Context()
		keepTime(t, s)
		// Writes of the key fail while lease renewals go through (a full disk).
		client(f, l).Fail("Update", -1, errors.New("etcdserver: mvcc: database space exceeded"))
		select {
		case <-ended.Done():
		case <-time.After(within):
			t.Fatal("the term whose heartbeats failed did not end")
		}
		if tm := l.Election.Term(); tm.Holds() {
			t.Fatalf("the leader still holds the key after its heartbeat deadline: %+v", tm)
		}
		f.NewLeader(l, token, within)
	})
	t.Run("a_released_term_that_reappears_is_released_again", func(t *testing.T) {
		t.Parallel()
		f, s := fakeFleet(t, 1)
		l, _ := f.Leader(within)
		held := observe(t, s).Holder
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		if err := l.Election.Resign(ctx, time.Hour); err != nil {
			t.Fatal(err)
		}
		// A failover of the store loses the release: the key is back under the lease
		// that still lives.
		if err := s.Restore("main", *held); err != nil {
			t.Fatal(err)
		}
		f.Await("the reappeared key released again", within, func() bool {
			c := s.Client()
			defer c.Close()
			o, err := c.Observe(context.Background(), "main")
			return err == nil && o.Holder == nil
		})
	})
}

// TestSilentHolderIsExpiredByItsFollowers: a holder whose lease lives on (the store has not
// reaped it, or something renews it) but that writes no heartbeat for a whole ttl has
// stopped admitting; its followers delete its key and elect a leader without waiting for
// the store.
func TestSilentHolderIsExpiredByItsFollowers(t *testing.T) {
	t.Parallel()
	s := electortest.NewStore()
	raw := s.Client()
	defer raw.Close()
	ctx := context.Background()
	lease, _, err := raw.Grant(ctx, ttl)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Campaign(ctx, "main", []byte(`{"id":"silent","ttl":2000000000}`), lease); err != nil {
		t.Fatal(err)
	}
	stopRenewing := make(chan struct{})
	defer close(stopRenewing)
	go func() {
		for {
			select {
			case <-stopRenewing:
				return
			case <-time.After(10 * time.Millisecond):
				_, _ = raw.Renew(ctx, lease) // the lease never runs out
			}
		}
	}()
	keepTime(t, s)
	a, b := startMember(t, s, "a"), startMember(t, s, "b")
	deadline := time.Now().Add(within)
	for !a.Leading() && !b.Leading() {
		if time.Now().After(deadline) {
			t.Fatal("nobody leads: the silent holder's key was never expired")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
