package electortest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

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
