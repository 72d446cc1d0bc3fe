package electortest_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/elector/electortest"
)

// TestTransferJudgedByTheStore: a transfer succeeds when its target led, even for a term the
// asking instance never saw. Here the target wins and a candidate of higher priority takes
// the key back at once (as a shard's preferred owner does), all while the asker's link is
// slow: its watch shows the vacancy and then only the newer term, and the store's history
// is what says that the target led.
func TestTransferJudgedByTheStore(t *testing.T) {
	t.Parallel()
	f := viewingFleet(t, 3)
	leader, _ := f.Leader(within)
	var asker, target *electortest.Member
	for _, m := range f.Members {
		switch {
		case m == leader:
		case asker == nil:
			asker = m
		default:
			target = m
		}
	}
	leader.Candidate.SetPriority(2, true) // it preempts whoever leads in its place
	client(f, asker).SetDelay(700 * time.Millisecond)
	if err := asker.Election.Transfer(context.Background(), target.ID, within); err != nil {
		t.Fatalf("the transfer failed although its target led (the history: %s): %v", historyOf(t, f), err)
	}
	past, err := leader.Election.History(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range past {
		if p.Leader == target.ID {
			return
		}
	}
	t.Fatalf("the store's history has no term of the target %s: %+v", target.ID, past)
}

// historyOf lists the ended terms the store keeps, for a failure message.
func historyOf(t *testing.T, f *electortest.Fleet) string {
	past, err := f.Members[0].Election.History(context.Background())
	if err != nil {
		return err.Error()
	}
	s := ""
	for _, p := range past {
		s += fmt.Sprintf("%s (token %d) ", p.Leader, p.Token)
	}
	return s
}

// TestConcurrentTransfersTheLaterOneWins: two candidates ask for the leadership at about
// the same moment, as two that preempt a leader of lower priority do: the second request
// replaces the first in the store, before the leader (behind a slow link) acts on either.
// The second one's candidate leads, and the first one's Transfer says at once that its
// request was replaced, rather than wait for a transfer that will never come.
func TestConcurrentTransfersTheLaterOneWins(t *testing.T) {
	t.Parallel()
	f, s := slowLeaderFleet(t)
	leader, _ := f.Leader(within)
	first, second := otherTwo(f, leader)
	firstDone := make(chan error, 1)
	go func() { firstDone <- first.Election.Transfer(context.Background(), first.ID, within) }()
	f.Await("the first request in the store", within, func() bool { return storedIntent(t, s) != nil })
	if err := second.Election.Transfer(context.Background(), second.ID, within); err != nil {
		t.Fatalf("the second transfer: %v", err)
	}
	if err := <-firstDone; !errors.Is(err, elector.ErrTransferSuperseded) {
		t.Fatalf("the first transfer, whose request the second replaced: %v; want %v", err, elector.ErrTransferSuperseded)
	}
}

// slowLeaderFleet starts a fake fleet of three whose clock runs, waits until it has a leader
// and every member a view of the registry, and slows the leader's link to the store: the
// leader acts on a request a while after the others see it.
func slowLeaderFleet(t *testing.T) (*electortest.Fleet, *electortest.Store) {
	f, s := fakeFleet(t, 3)
	keepTime(t, s)
	leader, _ := f.Leader(within)
	awaitViews(t, f)
	client(f, leader).SetDelay(ttl / 4)
	return f, s
}

// storedIntent reads the intent of election "main" from s.
func storedIntent(t *testing.T, s *electortest.Store) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	c := s.Client()
	defer c.Close()
	for now := range c.WatchIntent(ctx, "main") {
		if now.Err != nil {
			t.Fatal(now.Err)
		}
		return now.Value
	}
	t.Fatal("the watch of the intent ended without a report")
	return nil
}

// TestPreemptLeavesAPendingRequest: a request to resign waits for the leader (behind a slow
// link) when a candidate starts to preempt it: stored before the preempt began, or right
// before the preempt's own write, after the preempt found no request pending. The preempt
// must not replace the request in the store, which keeps one (a preempt's request is
// stored only where none is pending): the leader resigns as asked, and stays out for the
// hold-off.
func TestPreemptLeavesAPendingRequest(t *testing.T) {
	for _, tc := range []struct {
		name      string
		meanwhile bool // the request lands between the preempt's read and its write
	}{
		{"request_stored_before_the_preempt", false},
		{"request_stored_between_the_preempts_read_and_write", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f, _ := slowLeaderFleet(t)
			leader, token := f.Leader(within)
			asker, preempter := otherTwo(f, leader)
			ctx, cancel := context.WithTimeout(context.Background(), within)
			defer cancel()
			asked := make(chan error, 1)
			ask := func() { asked <- asker.Election.RequestResign(ctx, time.Hour) }
			if tc.meanwhile {
				client(f, preempter).BeforeNextIntent(ask)
			} else {
				ask()
			}
			preempter.Candidate.SetPriority(2, true)
			if err := <-asked; err != nil {
				t.Fatal(err)
			}
			f.NewLeader(leader, token, within)
			if left, _ := leader.Election.HoldOff(); left <= 0 {
				t.Fatalf("the leader handed over without the hold-off it was asked to resign with: the preempt replaced the request")
			}
		})
	}
}
