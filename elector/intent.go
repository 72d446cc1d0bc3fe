package elector

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.uber.org/zap"
)

// Any instance may ask for a handover, not only the leader: the request is written to the
// store as the election's intent, every candidate watches it, and the one it concerns
// acts. No instance needs to reach another over HTTP.

// Intent actions.
const (
	intentResign   = "resign"
	intentTransfer = "transfer"
	intentErrand   = "errand" // see errand.go
)

// intent is a handover request as stored.
type intent struct {
	Action string `json:"action"`
	// To is the instance that should lead after a transfer.
	To string `json:"to,omitempty"`
	// Token is the term a resign is meant for; a later term ignores it.
	Token int64 `json:"token,omitempty"`
	// HoldOff is how long a resigning leader stays out of the election.
	HoldOff time.Duration `json:"hold_off,omitempty"`
	// From names the instance that asked, for the logs.
	From string `json:"from"`
	// Errand is what an errand asks of the leader of term Token (see errand.go).
	Errand json.RawMessage `json:"errand,omitempty"`
}

// ErrNotCandidate is returned by Transfer when the target takes no part in the election.
var ErrNotCandidate = errors.New("not a live candidate of the election")

// RequestResign asks whoever leads the term that is current now to resign and stay out of
// the election for holdOff, through the store. It returns once the request is stored; the
// leader acts on it at once. A leader should call Resign itself instead.
func (e *Election) RequestResign(ctx context.Context, holdOff time.Duration) error {
	t := e.Term()
	if !t.LeaderKnown() {
		return fmt.Errorf("election %q: %w", e.name, ErrNoLeader)
	}
	in := intent{Action: intentResign, Token: t.Token, HoldOff: holdOff, From: e.c.cfg.ID}
	return e.setIntent(ctx, in.encode(), e.c.HandoverTimeout()+e.c.cfg.TTL, false)
}

// Transfer hands leadership to the instance named to: every other candidate stands aside,
// the leader hands over, and to takes the key. It blocks until to leads, or returns an
// error when timeout passes first (the others then campaign again), or at once with
// ErrNotCandidate when to takes no part in the election. It may be called on any
// instance. A later request replaces this one in the store (a transfer asked elsewhere at
// about the same moment, say): Transfer then returns ErrTransferSuperseded as soon as it
// sees that, and the fleet follows the later one.
func (e *Election) Transfer(ctx context.Context, to string, timeout time.Duration) error {
	return e.transfer(ctx, to, timeout, false)
}

// errIntentPending is what a transfer asked only if no other request is pending returns
// when one is.
var errIntentPending = errors.New("another handover request is pending")

// transfer is Transfer. If onlyIfNone is set and the store is an IntentCreator, it asks
// only if no other request is pending, and returns errIntentPending otherwise.
func (e *Election) transfer(ctx context.Context, to string, timeout time.Duration, onlyIfNone bool) error {
	list, err := e.candidatesToLead(ctx, to)
	if err != nil {
		return err
	}
	live := make([]string, len(list))
	for i, c := range list {
		live[i] = c.ID
	}
	if !slices.Contains(live, to) {
		return fmt.Errorf("%q: %w %q (live: %v)", to, ErrNotCandidate, e.name, live)
	}
	if err := checkTransferTarget(list, to, time.Now()); err != nil {
		return fmt.Errorf("transfer of election %q: %w", e.name, err)
	}
	since := e.Term()
	if since.Leader.ID == to && !since.Leader.HandingOver {
		return nil
	}
	value := intent{Action: intentTransfer, To: to, From: e.c.cfg.ID}.encode()
	// Stand aside before the leader can act on the intent: this instance's own watch
	// of it may come after the leader's, and then after the key's vacancy, which it
	// would campaign on (and win, leaving the transfer to take one more hop).
	if to != e.c.cfg.ID {
		e.setStandAside(to)
	}
	if err := e.setIntent(ctx, value, timeout, onlyIfNone); err != nil {
		e.setStandAside("")
		return err
	}
	wait, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// This instance's view can miss a short term of the target's (its watch was between
	// reads while the target won and was preempted), so once a newer term of another
	// instance shows, the store's history decides: its successor records every term.
	var lookAgain <-chan time.Time
	ask := newBackoff(50*time.Millisecond, time.Second)
	for {
		changed, intents := e.Changed(), e.intentChanges()
		t := e.Term()
		if t.Leader.ID == to && !t.Leader.HandingOver {
			return nil
		}
		if e.replaced(wait, value) {
			// Replaced, or done and followed by another request (a preempt back to the
			// shard's preferred owner, say) before this instance saw the target's term:
			// the store's history tells, once the target's successor has recorded it.
			if since.Token != 0 && e.ledSinceWithin(wait, to, since.Token, e.c.cfg.TTL) {
				return nil
			}
			return fmt.Errorf("transfer of election %q to %q: %w", e.name, to, ErrTransferSuperseded)
		}
		if since.Token != 0 && t.Token > since.Token && lookAgain == nil {
			lookAgain = time.After(0)
		}
		select {
		case <-wait.Done():
			if since.Token != 0 && e.ledSince(ctx, to, since.Token) {
				return nil
			}
			return fmt.Errorf("transfer of election %q to %q: %w (it did not lead within %s)", e.name, to, ErrTransferTimeout, timeout)
		case <-changed:
		case <-intents:
		case <-lookAgain:
			if e.ledSince(wait, to, since.Token) {
				return nil
			}
			lookAgain = time.After(ask.step())
		}
	}
}

// ledSince reports whether the store's history records a term of instance id newer than
// token: a transfer to id that this instance did not see happen may still have happened. A
// history that cannot be read says no.
func (e *Election) ledSince(ctx context.Context, id string, token int64) bool {
	past, err := e.History(ctx)
	if err != nil {
		return false
	}
	for _, p := range past {
		if p.Leader == id && p.Token > token {
			return true
		}
	}
	return false
}

// ledSinceWithin is ledSince, asked again for up to d while it says no: the history
// records a term once its successor's has settled.
func (e *Election) ledSinceWithin(ctx context.Context, id string, token int64, d time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	ask := newBackoff(50*time.Millisecond, d/4)
	for {
		if e.ledSince(ctx, id, token) {
			return true
		}
		if !ask.wait(ctx) {
			return false
		}
	}
}

// replaced reports whether the intent value, which this instance stored, has been replaced
// by another: its watch shows another one, and so does the store, read now (a watch may
// report, after the write of value, an intent stored before it). The store's intent is
// replaced, never merged, so the fleet follows the newer one and value is not acted on.
func (e *Election) replaced(ctx context.Context, value []byte) bool {
	if seen := e.seenIntent(); seen == nil || bytes.Equal(seen, value) {
		return false
	}
	now, err := e.readIntent(ctx)
	return err == nil && now != nil && !bytes.Equal(now, value)
}

// readIntent reads the election's intent from the store (nil when there is none): the
// first report of a watch is the intent as of a moment after it began.
func (e *Election) readIntent(ctx context.Context) ([]byte, error) {
	rctx, cancel := context.WithTimeout(ctx, e.c.requestTimeout)
	defer cancel()
	for now := range e.c.cfg.Backend.WatchIntent(rctx, e.name) {
		return now.Value, now.Err
	}
	return nil, rctx.Err()
}

func (in intent) encode() []byte {
	b, _ := json.Marshal(in) // strings and numbers always marshal
	return b
}

// setIntent stores the intent value for ttl; if onlyIfNone is set and the store can, only
// where no other intent is pending (errIntentPending if one is).
func (e *Election) setIntent(ctx context.Context, value []byte, ttl time.Duration, onlyIfNone bool) error {
	rctx, cancel := e.request(ctx, e.c.requestTimeout)
	defer cancel()
	if ic, ok := e.c.cfg.Backend.(IntentCreator); ok && onlyIfNone {
		created, err := ic.CreateIntent(rctx, e.name, value, ttl)
		if err == nil && !created {
			err = errIntentPending
		}
		return err
	}
	return e.c.cfg.Backend.SetIntent(rctx, e.name, value, ttl)
}

// noteIntent records the intent the election's watch reports, and wakes whoever waits for
// a change of it.
func (e *Election) noteIntent(value []byte) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.intentSeen = value
	close(e.intentChanged)
	e.intentChanged = make(chan struct{})
	if m := e.shared.Load(); m != nil {
		m.reg.kickPreempts(m.shard) // a request pending or done changes who may ask
	}
}

// seenIntent is the intent the election's watch reported last; nil when there is none.
func (e *Election) seenIntent() []byte {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.intentSeen
}

// intentChanges returns a channel that is closed at the next report of the intent.
func (e *Election) intentChanges() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.intentChanged
}

// otherIntentPending reports whether the intent last seen is a request other than a
// preempt's of this instance: a preempt does not replace it, but waits for it to be done.
func (e *Election) otherIntentPending() bool { return e.notOwnIntent(e.seenIntent()) }

// notOwnIntent reports whether value is an intent other than the transfer to itself that
// this instance's preempt asks for.
func (e *Election) notOwnIntent(value []byte) bool {
	return value != nil && !bytes.Equal(value, intent{Action: intentTransfer, To: e.c.cfg.ID, From: e.c.cfg.ID}.encode())
}

// followIntents applies the election's intents as they come, for as long as ctx lasts.
func (e *Election) followIntents(ctx context.Context) {
	followWatch(ctx, e.c.cfg.TTL,
		func(ctx context.Context) <-chan IntentChange { return e.c.cfg.Backend.WatchIntent(ctx, e.name) },
		func(change IntentChange) bool { return change.Err != nil },
		func(change IntentChange) {
			e.noteIntent(change.Value)
			e.applyIntent(ctx, change.Value)
		}, nil)
}

func (e *Election) applyIntent(ctx context.Context, value []byte) {
	if value == nil {
		e.setStandAside("")
		e.mu.Lock()
		e.transferHere = nil
		e.mu.Unlock()
		return
	}
	var in intent
	if err := json.Unmarshal(value, &in); err != nil {
		e.c.log().Warn("ignoring an election intent this plugin did not write", zap.String("election", e.name), zap.Error(err))
		return
	}
	t := e.Term()
	switch in.Action {
	case intentErrand:
		e.doErrand(ctx, in, value)
	case intentResign:
		if t.Holds() && (in.Token == 0 || in.Token == t.Token) {
			e.c.log().Info("resigning on request", zap.String("election", e.name), zap.String("requested_by", in.From))
			go e.resignOnRequest(ctx, in.HoldOff, "resigned", value)
		}
	case intentTransfer:
		if in.To == e.c.cfg.ID {
			e.setStandAside("")
			// Decided under the lock the campaign loop publishes under: either this
			// instance holds the key already, or winning it will see transferHere.
			e.mu.Lock()
			there := e.term.Load().Holds()
			e.transferHere = nil
			if !there {
				e.transferHere = value
			}
			e.mu.Unlock()
			if there {
				e.clearIntent(ctx, value)
			}
			return
		}
		// A transfer to this instance that this request replaced is off: it no longer skips
		// the yield to higher candidates as the target would.
		e.mu.Lock()
		e.transferHere = nil
		e.mu.Unlock()
		if t.Leader.ID == in.To && !t.Leader.HandingOver {
			return // the transfer is done already
		}
		e.setStandAside(in.To)
		if t.Holds() {
			e.logMove("transferring leadership on request", zap.String("election", e.name),
				zap.String("to", in.To), zap.String("requested_by", in.From))
			go e.resignOnRequest(ctx, 0, "transferred", value)
		}
	}
}

// transferTarget reports whether a transfer to this instance is under way.
func (e *Election) transferTarget() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.transferHere != nil
}

// resignOnRequest resigns for intent value and then removes it, so it is acted on once.
func (e *Election) resignOnRequest(ctx context.Context, holdOff time.Duration, reason string, value []byte) {
	rctx, cancel := context.WithTimeout(ctx, e.c.HandoverTimeout())
	defer cancel()
	e.mu.Lock()
	e.resignReason = reason
	e.mu.Unlock()
	if err := e.Resign(rctx, holdOff); err != nil {
		return
	}
	if reason == "resigned" {
		e.clearIntent(ctx, value)
	}
}

// clearIntent deletes intent value, once acted on; a newer one stays.
func (e *Election) clearIntent(ctx context.Context, value []byte) {
	rctx, cancel := e.request(ctx, e.c.requestTimeout)
	defer cancel()
	_ = e.c.cfg.Backend.ClearIntent(rctx, e.name, value)
}

// setStandAside makes this instance stay out of the election while another one is being
// handed leadership (to), or ends that (""). Only the end asks the campaign loop to read
// the key again (it may be vacant, and this instance free to take it): standing aside
// needs no read, since the loop asks heldOff before every campaign, and a read then would
// be one more statement on every instance at the moment the handover needs the store.
func (e *Election) setStandAside(to string) {
	e.mu.Lock()
	ended := e.standAsideFor != "" && to == ""
	e.standAsideFor = to
	e.mu.Unlock()
	if ended {
		e.kick()
	}
}
