package elector

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"

	"go.uber.org/zap"
)

// An errand is a request any instance can make of the leader of an election's current
// term through the store, as resigns and transfers are made: the request is the election's
// intent, the leader watching it does the errand and clears it. What an errand asks is
// opaque to the election (the leader app runs a job now with it).

// ErrIntentPending is returned by AskLeader while another request to the election's
// candidates (a resign, a transfer, an errand) is waiting to be acted on: an errand never
// replaces it.
var ErrIntentPending = errors.New("another request to the election's leader is pending")

// errandHandler is what a leader does with an errand: from is the asking instance.
type errandHandler func(ctx context.Context, from string, errand []byte)

// errandSlot holds an election's errand handler.
type errandSlot struct {
	fn atomic.Pointer[errandHandler]
}

// HandleErrands makes fn do the errands this instance receives while it leads; it
// replaces the previous handler (nil: errands are left for a later leader that handles
// them). fn runs on a goroutine of its own, and its errand is cleared when it returns.
func (e *Election) HandleErrands(fn func(ctx context.Context, from string, errand []byte)) {
	if fn == nil {
		e.errands.fn.Store(nil)
		return
	}
	h := errandHandler(fn)
	e.errands.fn.Store(&h)
}

// RequestPending reports whether a request to the election's leader (a resign, a
// transfer, an errand) is stored and not yet acted on, as far as this instance has seen.
func (e *Election) RequestPending() bool { return e.seenIntent() != nil }

// AskLeader asks the leader of the election's current term to do errand (a JSON value),
// through the store. It returns once the request is stored; the leader does it as soon as it reads
// it. It fails with ErrNoLeader when no leader is known, and with ErrIntentPending while
// another request waits. A leader should do the errand itself instead.
func (e *Election) AskLeader(ctx context.Context, errand []byte) error {
	t := e.Term()
	if !t.LeaderKnown() {
		return fmt.Errorf("election %q: %w", e.name, ErrNoLeader)
	}
	if !json.Valid(errand) {
		return fmt.Errorf("election %q: an errand must be JSON", e.name)
	}
	if e.RequestPending() {
		return fmt.Errorf("election %q: %w", e.name, ErrIntentPending)
	}
	in := intent{Action: intentErrand, Token: t.Token, From: e.c.cfg.ID, Errand: errand}
	return e.setIntent(ctx, in.encode(), e.c.requestTimeout+e.c.cfg.TTL, false)
}

// doErrand does the errand of intent in (stored as value) if this instance leads the term
// it was meant for and has a handler; it is cleared once done.
func (e *Election) doErrand(ctx context.Context, in intent, value []byte) {
	t := e.Term()
	h := e.errands.fn.Load()
	if !t.Holds() || in.Token != t.Token || h == nil {
		return
	}
	e.c.log().Info("doing an errand on request", zap.String("election", e.name), zap.String("requested_by", in.From))
	go func() {
		(*h)(ctx, in.From, in.Errand)
		e.clearIntent(ctx, value)
	}()
}
