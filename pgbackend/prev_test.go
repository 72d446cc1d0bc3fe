package pgbackend

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
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
	if err := b.Release(ctx, election, first.Holder.Token, la, elector.EndedResigned); err != nil {
		t.Fatal(err)
	}
	lb, second := win(t, ctx, b, election, "b", time.Minute)
	if second.Prev != first.Holder.Token || !second.PrevReleased || second.PrevWhy != elector.EndedResigned {
		t.Errorf("after a release: Prev %d, PrevReleased %v, PrevWhy %q; want %d, true, %q",
			second.Prev, second.PrevReleased, second.PrevWhy, first.Holder.Token, elector.EndedResigned)
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

// TestAcknowledgementsWithoutWhy: acknowledgements as an earlier release wrote them (no
// why) still release the term, with an empty why; and an instance on a schema managed by
// hand that predates the why column (skip_schema, Schema not run again) still hands over,
// writing and reading acknowledgements the earlier way.
func TestAcknowledgementsWithoutWhy(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	server := pgtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	current := newBackend(t, Config{DSN: server.DSN()})
	la, o := win(t, ctx, current, "older", "a", time.Minute)
	server.Exec(t, fmt.Sprintf(`INSERT INTO caddy_leader_released (election, token, expires_at)
		VALUES ('older', %d, clock_timestamp() + interval '1 minute')`, o.Holder.Token))
	if ok, why, err := current.Released(ctx, "older", o.Holder.Token, 0); err != nil || !ok || why != "" {
		t.Fatalf("Released of an earlier release's acknowledgement = %v, %q, %v; want true, \"\"", ok, why, err)
	}
	if err := current.Revoke(ctx, la); err != nil {
		t.Fatal(err)
	}

	server.Exec(t, `ALTER TABLE caddy_leader_released DROP COLUMN why`)
	handMade := newBackend(t, Config{DSN: server.DSN(), SkipSchema: true})
	lb, first := win(t, ctx, handMade, "hand-made", "b", time.Minute)
	if err := handMade.Release(ctx, "hand-made", first.Holder.Token, lb, elector.EndedTransferred); err != nil {
		t.Fatalf("Release on a schema without the why column: %v", err)
	}
	_, second := win(t, ctx, handMade, "hand-made", "c", time.Minute)
	if !second.PrevReleased || second.PrevWhy != "" {
		t.Fatalf("after a release: PrevReleased %v, PrevWhy %q; want true, \"\"", second.PrevReleased, second.PrevWhy)
	}
	if err := handMade.Acknowledge(ctx, "hand-made", second.Holder.Token, lb, elector.EndedKeyDeleted); err != nil {
		t.Fatalf("Acknowledge on a schema without the why column: %v", err)
	}
	if ok, why, err := handMade.Released(ctx, "hand-made", second.Holder.Token, 0); err != nil || !ok || why != "" {
		t.Fatalf("Released on a schema without the why column = %v, %q, %v; want true, \"\"", ok, why, err)
	}
}
