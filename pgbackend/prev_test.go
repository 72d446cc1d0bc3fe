package pgbackend

import (
	"context"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/pgtest"
)

// TestCampaignNamesThePreviousTerm: a won campaign names the term before it (released,
// revoked, or expired and taken over), and says when it acknowledged its end, so that the
// new term need not ask.
func TestCampaignNamesThePreviousTerm(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	server := pgtest.Start(t)
	b := newBackend(t, Config{DSN: server.DSN()})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const election = "prev"

	la, first := win(t, ctx, b, election, "a", time.Minute)
	if first.Prev != 0 || first.PrevReleased {
		t.Fatalf("the first term: Prev %d, PrevReleased %v; want 0, false", first.Prev, first.PrevReleased)
	}
	if err := b.Release(ctx, election, first.Holder.Token, la); err != nil {
		t.Fatal(err)
	}
	lb, second := win(t, ctx, b, election, "b", time.Minute)
	if second.Prev != first.Holder.Token || !second.PrevReleased {
		t.Errorf("after a release: Prev %d, PrevReleased %v; want %d, true", second.Prev, second.PrevReleased, first.Holder.Token)
	}
	if err := b.Revoke(ctx, lb); err != nil {
		t.Fatal(err)
	}
	_, third := win(t, ctx, b, election, "c", time.Second)
	if third.Prev != second.Holder.Token || third.PrevReleased {
		t.Errorf("after a revoke: Prev %d, PrevReleased %v; want %d, false", third.Prev, third.PrevReleased, second.Holder.Token)
	}
	// The row stays until a campaign takes it over from the expired lease.
	time.Sleep(1500 * time.Millisecond)
	_, fourth := win(t, ctx, b, election, "d", time.Minute)
	if fourth.Prev != third.Holder.Token || fourth.PrevReleased {
		t.Errorf("after an expiry: Prev %d, PrevReleased %v; want %d, false", fourth.Prev, fourth.PrevReleased, third.Holder.Token)
	}
}
