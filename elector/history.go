package elector

import (
	"context"
	"encoding/json"
	"time"

	"go.uber.org/zap"
)

// The history of an election's terms is kept in the store, so that every instance shows the
// same one and it survives restarts. The successor writes it: once its own term settles it
// knows how the previous one ended (the previous holder said why it stopped, or its
// deadline passed without a word), which the previous holder itself, crashed or cut off,
// may never learn. A term that ended with nobody else to take over is recorded by its own
// holder when it wins again. A term whose successor dies before it settles goes unrecorded.

// HistoryKept is how many ended terms an election's history keeps.
const HistoryKept = 100

// How a term ended (PastTerm.Ended). All but EndedCrashed are the holder's own word: the
// why of the acknowledgement it writes when it stops (Backend.Acknowledge and Release),
// which its successor reads before it admits (Backend.Released, Observation.PrevWhy).
// EndedCrashed is the successor's conclusion when no acknowledgement came.
const (
	// EndedHandedOver: the holder let go because it was leaving: a shutdown (SIGTERM,
	// caddy stop) or a config reload that dropped the election. Also an acknowledgement
	// that gave no reason, written by an instance of an older release.
	EndedHandedOver = "handed over"
	// EndedResigned: the holder resigned: an operator asked (the admin API, `caddy leader
	// resign`, the status page), or its leader_health step-down did.
	EndedResigned = "resigned"
	// EndedTransferred: the holder handed over to an instance named for it: a transfer
	// (the admin API, `caddy leader transfer`, the status page), or a candidate of higher
	// priority that preempts.
	EndedTransferred = "transferred"
	// EndedKeyDeleted: the holder saw its key deleted (an operator deleted it, or revoked
	// its lease) while its own deadlines were still ahead, stopped, and said so.
	EndedKeyDeleted = "key deleted"
	// EndedDeadlineMissed: the holder stopped at its own deadline, because its heartbeats
	// or lease renewals did not reach the store in time (a slow or briefly unreachable
	// store, a full disk), and said so once it reached the store again, before its
	// successor had waited it out.
	EndedDeadlineMissed = "deadline missed"
	// EndedCrashed: no word from the holder: its successor waited out the holder's
	// deadline (a TTL at most). It was killed, hung, or cut off from the store for good;
	// the successor cannot tell which. A holder that exits while its own term still waits
	// for the term before it leaves no acknowledgement either.
	EndedCrashed = "crashed"
	// EndedDeadlinePassed is what releases before these reasons existed recorded for a
	// term whose successor waited out its deadline: EndedCrashed, or EndedDeadlineMissed
	// (the holder never said so then). It is never written any more, but a stored history
	// may still hold it.
	EndedDeadlinePassed = "deadline passed"
)

// PastTerm is one ended term of an election.
type PastTerm struct {
	// Token is the term's fencing token.
	Token int64 `json:"token"`
	// Leader is the instance id of the term's leader; empty when the successor never saw
	// the term (the store named it, as after every instance of a fleet was restarted).
	Leader string `json:"leader,omitempty"`
	// URL is the leader's advertise URL.
	URL string `json:"url,omitempty"`
	// Start is when the term began, by its leader's clock; zero (and left out of the
	// record) when the successor never saw the term, as Leader.
	Start time.Time `json:"start,omitzero"`
	// End is when its successor first saw it over, by the successor's clock.
	End time.Time `json:"end"`
	// Ended says how it ended: one of the Ended* values.
	Ended string `json:"ended"`
	// Successor is the instance id of the leader of the next term, which recorded this one.
	Successor string `json:"successor"`
	// SuccessorToken is the fencing token of the next term.
	SuccessorToken int64 `json:"successor_token"`
	// LastHeartbeat is when the successor last saw the term's leader write its key (its
	// last heartbeat, by the successor's clock); zero when the successor never saw one
	// (its own term, a term the store named) or an older release recorded the term. A
	// leader that crashed served nothing after it: the outage of a crash runs from here,
	// not from End, which comes up to a TTL later.
	LastHeartbeat time.Time `json:"last_heartbeat,omitzero"`
	// SuccessorAdmitted is when the next term first admitted requests, by its leader's
	// clock: after Start, once the term before it had certainly stopped (see settle); zero
	// when an older release recorded the term.
	SuccessorAdmitted time.Time `json:"successor_admitted,omitzero"`
}

// Unknown is what a page or a table shows for a past term's leader, start or duration
// that its record does not know (see PastTerm.Leader and Start).
const Unknown = "unknown"

// Lasted is how long the term lasted; false when its start is unknown.
func (p PastTerm) Lasted() (time.Duration, bool) {
	if p.Start.IsZero() || p.End.IsZero() {
		return 0, false
	}
	return p.End.Sub(p.Start), true
}

// named is the term the store named as the one before this instance's newest term
// (Observation.Prev): a term this process never saw (every instance was restarted since,
// say) is still recorded, under an unknown leader.
type named struct {
	token int64
	at    time.Time
}

// endOfTerm is how term token ended (an Ended* value): as its holder's acknowledgement
// said, or as this instance let go of its own term.
type endOfTerm struct {
	token int64
	why   string
}

// lastOther is the newest term held by another instance that this instance saw, for the
// history: e.mu guards it.
type lastOther struct {
	rec   Record
	token int64
	gone  time.Time // when this instance first saw it over; zero while it lasts
	beat  time.Time // when this instance last saw its holder write the key
}

// noteBeatLocked notes that this instance saw the holder of term token write the key at
// now: a heartbeat, which publishes nothing, so the history hears of it here. e.mu is held.
func (e *Election) noteBeatLocked(token int64, now time.Time) {
	if e.other.token == token {
		e.other.beat = now
	}
}

// noteHistoryLocked follows the published terms: it remembers the newest term held by
// another instance and, when a term of this instance settles after one, appends that one to
// the history. e.mu is held.
func (e *Election) noteHistoryLocked(old, t *Term) {
	now := t.At
	switch {
	case t.lease == nil && t.Token != 0:
		if e.other.token != t.Token {
			e.other = lastOther{rec: t.Leader, token: t.Token, beat: now} // its first write
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
	own := prev == e.ownPast
	if n := e.namedPrev; n.token > prev.token && n.token < t.Token {
		prev, own = lastOther{token: n.token, gone: n.at}, false
	}
	if prev.token == 0 || prev.token >= t.Token {
		return
	}
	past := PastTerm{
		Token: prev.token, Leader: prev.rec.ID, URL: prev.rec.URL, Start: prev.rec.Since,
		End: prev.gone, Ended: e.howEndedLocked(prev.token, own, t.Reason), Successor: e.c.cfg.ID, SuccessorToken: t.Token,
		LastHeartbeat: prev.beat, SuccessorAdmitted: now, // the term settled: it admits from now
	}
	e.other, e.ownPast, e.namedPrev, e.heard = lastOther{}, lastOther{}, named{}, endOfTerm{}
	e.c.appends.Add(1)
	go e.appendHistory(past)
}

// howEndedLocked says how term token ended, the one before this instance's term that has
// just settled for reason: as its holder said, if its acknowledgement was heard; as this
// instance let go of it, if it was its own (this process saw it end); and otherwise, if
// the new term waited out its deadline, without a word. A term neither acknowledged nor
// waited out was held under this instance's own lease (a reload's handover). e.mu is held.
func (e *Election) howEndedLocked(token int64, own bool, reason string) string {
	switch {
	case e.heard.token == token:
		if e.heard.why == "" {
			return EndedHandedOver // acknowledged by an older release, which gives no reason
		}
		return e.heard.why
	case own && e.ending.token == token:
		return e.ending.why
	case own || reason == "elected":
		return EndedHandedOver
	default:
		return EndedCrashed
	}
}

// appendHistory writes past to the store, retrying for as long as the candidate lives
// (Close waits a little for it).
func (e *Election) appendHistory(past PastTerm) {
	defer e.c.appends.Add(-1)
	entry, _ := json.Marshal(past) // strings, numbers and times always marshal
	retry := newBackoff(100*time.Millisecond, min(5*time.Second, e.c.cfg.TTL))
	for {
		rctx, cancel := e.recordRequest(e.c.ctx, e.c.requestTimeout)
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
	rctx, cancel := e.request(ctx, e.c.requestTimeout)
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
