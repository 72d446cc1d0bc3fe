package pgbackend

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/internal/testkit/fleet"
	"github.com/caddyleader/caddy-leader/internal/testkit/pgtest"
)

// TestHistoryOfATermItsSuccessorNeverSaw: the sole leader stops (SIGTERM: it hands over to
// nobody), and an instance started after it wins. It never saw the term before its own; the
// database names only its token and how it ended, and the record keeps just that: no
// leader and no start (rather than an empty id and the zero time).
func TestHistoryOfATermItsSuccessorNeverSaw(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	server := pgtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const election = "history-unseen"
	start := func(id string) (*elector.Candidate, *elector.Election, *Backend) {
		b := newBackend(t, Config{DSN: server.DSN()})
		c, es := fleet.StartCandidate(t, elector.Config{ID: id, URL: "http://" + id + ".test:8080", TTL: time.Second,
			DrainTimeout: 2 * time.Second, Backend: b, Logger: zaptest.NewLogger(t).Named(id)}, election)
		return c, es[0], b
	}
	waitLeading := func(e *elector.Election) int64 {
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if term, ok := e.Check(); ok {
				return term.Token
			}
			if time.Now().After(deadline) {
				t.Fatal("no term led")
			}
		}
	}
	first, firstElection, _ := start("first")
	token := waitLeading(firstElection)
	if err := first.Close(ctx); err != nil {
		t.Fatal(err)
	}
	_, later, b := start("later")
	waitLeading(later)
	var last elector.PastTerm
	var raw []byte
	for deadline := time.Now().Add(10 * time.Second); last.Token != token; time.Sleep(20 * time.Millisecond) {
		entries, err := b.History(ctx, election)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) > 0 {
			raw = entries[len(entries)-1]
			_ = json.Unmarshal(raw, &last)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the history does not record term %d (last entry %s)", token, raw)
		}
	}
	if last.Leader != "" || !last.Start.IsZero() || last.End.IsZero() || last.Ended != elector.EndedHandedOver || last.Successor != "later" {
		t.Errorf("recorded %+v: want no leader, no start, an end, handed over, successor later", last)
	}
	var stored map[string]any
	if err := json.Unmarshal(raw, &stored); err != nil {
		t.Fatal(err)
	}
	for _, field := range []string{"leader", "start"} {
		if v, ok := stored[field]; ok {
			t.Errorf("the stored record says %s %q, which the database never told its writer", field, v)
		}
	}
}
