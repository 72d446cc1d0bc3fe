package elector

import (
	"context"
	"encoding/json"
	"time"

	"go.uber.org/zap"
)

// The history of an election's terms is kept in the store, so that every instance shows the
// same one and it survives restarts. The successor writes it: once its own term settles it
// knows how the previous one ended (the previous holder confirmed it stopped, or its
// deadline passed), which the previous holder itself, crashed or cut off, may never learn.
// A term that ended with nobody else to take over is recorded by its own holder when it
// wins again. A term whose successor dies before it settles goes unrecorded.

// HistoryKept is how many ended terms an election's history keeps.
const HistoryKept = 100

// Why a term ended, as its successor saw it.
const (
	// EndedHandedOver: the holder confirmed it had stopped (a resign, a transfer, a
	// shutdown, or it saw its key deleted) before its successor began.
	EndedHandedOver = "handed over"
	// EndedDeadlinePassed: the successor began once the holder's heartbeat deadline had
	// passed without a word from it (it crashed, hung, or was cut off from the store).
	EndedDeadlinePassed = "deadline passed"
)

// PastTerm is one ended term of an election.
type PastTerm struct {
	// Token is the term's fencing token.
	Token int64 `json:"token"`
	// Leader is the instance id of the term's leader; empty when the successor never saw
	// the term (the store named it, as after every instance of a fleet was restarted).
	Leader string `json:"leader"`
	// URL is the leader's advertise URL.
	URL string `json:"url,omitempty"`
	// Start is when the term began, by its leader's clock.
	Start time.Time `json:"start"`
	// End is when its successor first saw it over, by the successor's clock.
	End time.Time `json:"end"`
	// Ended says why it ended: EndedHandedOver or EndedDeadlinePassed.
	Ended string `json:"ended"`
	// Successor is the instance id of the leader of the next term, which recorded this one.
	Successor string `json:"successor"`
	// SuccessorToken is the fencing token of the next term.
	SuccessorToken int64 `json:"successor_token"`
}

// named is the term the store named as the one before this instance's newest term
// (Observation.Prev), and whether it acknowledged its end: a term this process never saw
// (every instance was restarted since, say) is still recorded, under an unknown leader.
type named struct {
	token    int64
	released bool
	at       time.Time
}

// lastOther is the newest term held by another instance that this instance saw, for the
// history: e.mu guards it.
type lastOther struct {
	rec   Record
	token int64
	gone  time.Time // when this instance first saw it over; zero while it lasts
}

// noteHistoryLocked follows the published terms: it remembers the newest term held by
// another instance and, when a term of this instance settles after one, appends that one to
// the history. e.mu is held.
func (e *Election) noteHistoryLocked(old, t *Term) {
	now := t.At
	switch {
	case t.lease == nil && t.Token != 0:
		if e.other.token != t.Token {
			e.other = lastOther{rec: t.Leader, token: t.Token}
		} else {
			e.other.rec = t.Leader
		}
	case e.other.token != 0 && e.other.gone.IsZero():
		e.other.gone = now
	}
	if old.lease != nil && t.lease != old.lease || old.lease != nil && t.Token != old.Token {
		// A term of this instance ended: its successor, this instance again if nobody
		// else was there to take over, records it.
		e.ownPast = lastOther{rec: old.Leader, token: old.Token, gone: now}
	}
	settled := t.lease != nil && !t.Settling && (old.lease != t.lease || old.Token != t.Token || old.Settling)
	if !settled {
		return
	}
	prev := e.other
	if e.ownPast.token > prev.token {
		prev = e.ownPast // the newest term before this one was this instance's own
	}
	// A term waited out rather than acknowledged ended at its deadline, whoever held it;
	// only an own term that this process saw end can have ended otherwise without a word.
	ended := EndedHandedOver
	if t.Reason != "elected" && prev != e.ownPast {
		ended = EndedDeadlinePassed
	}
	if n := e.namedPrev; n.token > prev.token && n.token < t.Token {
		prev, ended = lastOther{token: n.token, gone: n.at}, EndedHandedOver
		if !n.released && t.Reason != "elected" {
			ended = EndedDeadlinePassed
		}
	}
	if prev.token == 0 || prev.token >= t.Token {
		return
	}
	past := PastTerm{
		Token: prev.token, Leader: prev.rec.ID, URL: prev.rec.URL, Start: prev.rec.Since,
		End: prev.gone, Ended: ended, Successor: e.c.cfg.ID, SuccessorToken: t.Token,
	}
	e.other, e.ownPast, e.namedPrev = lastOther{}, lastOther{}, named{}
	e.c.appends.Add(1)
	go e.appendHistory(past)
}

// appendHistory writes past to the store, retrying for as long as the candidate lives
// (Close waits a little for it).
func (e *Election) appendHistory(past PastTerm) {
	defer e.c.appends.Add(-1)
	entry, _ := json.Marshal(past) // strings, numbers and times always marshal
	retry := newBackoff(100*time.Millisecond, min(5*time.Second, e.c.cfg.TTL))
	for {
		rctx, cancel := context.WithTimeout(e.c.ctx, e.c.requestTimeout)
		err := e.c.cfg.Backend.AppendHistory(rctx, e.name, entry, HistoryKept)
		cancel()
		if err == nil {
			return
		}
		e.c.log().Warn("could not record the previous term in the election's history",
			zap.String("election", e.name), zap.Int64("token", past.Token), zap.Error(err))
		if !retry.wait(e.c.ctx) {
			return
		}
	}
}

// History returns the election's ended terms as the store keeps them (the latest
// HistoryKept), oldest first. An entry this plugin did not write is skipped. It blocks for
// one store request at most.
func (e *Election) History(ctx context.Context) ([]PastTerm, error) {
	rctx, cancel := context.WithTimeout(ctx, e.c.requestTimeout)
	defer cancel()
	entries, err := e.c.cfg.Backend.History(rctx, e.name)
	if err != nil {
		return nil, err
	}
	list := make([]PastTerm, 0, len(entries))
	for _, b := range entries {
		var p PastTerm
		if json.Unmarshal(b, &p) == nil && p.Token != 0 {
			list = append(list, p)
		}
	}
	return list, nil
}
