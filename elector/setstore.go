package elector

import (
	"context"
	"sync"
	"time"
)

// A shard set's elections take turns for their store requests: at most setRequests of a
// set are on their way at once, per instance. A set of thousands of shards would otherwise
// put thousands of requests in the store's queue at once (at a start, or when many shards
// move), ahead of the lease renewals and heartbeats that keep this instance's terms alive:
// a renewal that waits behind them for a third of the TTL is as good as failed, the
// instance gives up its lease and every shard it held, and the fleet starts over.
// Renewals, heartbeats and watches do not take turns, and a request's timeout counts
// from its turn.

// setRequests is how many store requests a set's elections have on their way at once, per
// instance, and setRecords how many writes of their history on top: a record of a past
// term waits for none of the requests a shard needs to change hands.
const (
	setRequests = 32
	setRecords  = 8
)

// request is context.WithTimeout(ctx, timeout) for one store request of e. A shard's
// request first waits, under ctx alone, for its turn, which cancel ends.
func (e *Election) request(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	m := e.shared.Load()
	if m == nil {
		return context.WithTimeout(ctx, timeout)
	}
	return takeTurn(ctx, timeout, m.reg.turns)
}

// recordRequest is request for a write of e's history.
func (e *Election) recordRequest(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	m := e.shared.Load()
	if m == nil {
		return context.WithTimeout(ctx, timeout)
	}
	return takeTurn(ctx, timeout, m.reg.recordTurns)
}

// takeTurn waits, under ctx, for a turn of turns, then returns a context for the request
// whose cancel ends the turn.
func takeTurn(ctx context.Context, timeout time.Duration, turns chan struct{}) (context.Context, context.CancelFunc) {
	select {
	case turns <- struct{}{}:
	case <-ctx.Done():
		return context.WithTimeout(ctx, timeout) // over: the request fails at once
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	var once sync.Once
	return rctx, func() {
		cancel()
		once.Do(func() { <-turns })
	}
}

// readKey is Backend.Observe of e's key. A shard's read goes in a batch with the reads its
// set asks meanwhile, where the store batches reads, and then takes no turn.
func (e *Election) readKey(ctx context.Context) (Observation, error) {
	return batchedRead(e, ctx, e.name, &e.c.batches.observes)
}

// readHistory is Backend.History of election (e's own or one of its companions, such as
// its failsafe roster), batched as readKey is.
func (e *Election) readHistory(ctx context.Context, election string) ([][]byte, error) {
	return batchedRead(e, ctx, election, &e.c.batches.histories)
}

// batchedRead reads election through reads: in a batch for a shard of a set, where the
// store batches them (the batch's request is bounded, not the wait for it); else alone,
// on the shard's turn if it has turns.
func batchedRead[Out any](e *Election, ctx context.Context, election string, reads *groupCommit[string, Out]) (Out, error) {
	if e.shared.Load() != nil && reads.batch != nil {
		return reads.call(ctx, election)
	}
	rctx, cancel := e.request(ctx, e.c.requestTimeout)
	defer cancel()
	return reads.single(rctx, election)
}
