package elector

import (
	"context"
	"crypto/hmac"
	"encoding/json"
	"sync"
	"time"

	"go.uber.org/zap"
)

// electionFailsafe is an election's failsafe state, as a peer and as a leader.
type electionFailsafe struct {
	mu sync.Mutex
	// record is the term this instance keeps alive as a peer, until when (local clock).
	record struct {
		token  int64
		leader string
		until  time.Time
		// seq is the newest round of term token this instance answered: an end
		// older than that (late, or replayed) ends nothing.
		seq int64
	}
	// unknownUntil covers a confirmation this process cannot know of: one its
	// predecessor under the same id may have given just before it started.
	unknownUntil time.Time
	// newest is the newest token this instance has seen (store, rounds, fences); an
	// older term is never confirmed.
	newest int64
	// keys are the MarkKeys of the latest terms this instance saw, newest first.
	keys  []fsKey
	timer *time.Timer // wakes the campaign loop when record runs out

	// seq numbers the messages this instance sends as a leader, so that a peer can tell
	// the end of a failsafe from a late copy of an earlier one.
	seq int64

	// Leader side (guarded by mu): the rosters that may be the newest in the store, the
	// confirmed one first, and the state of the current failsafe.
	rosters  []heldRoster
	active   bool
	cause    string
	since    time.Time
	rounds   int64
	refused  int64
	noRoster bool // a failsafe could not start for want of a confirmed roster (logged once)
}

type fsKey struct {
	token int64
	key   []byte
	rec   Record
}

// noteFailsafeLocked follows the published terms: it remembers their MarkKeys and the
// newest token. e.mu is held.
func (e *Election) noteFailsafeLocked(t *Term) {
	if t.Token == 0 {
		return
	}
	e.fs.mu.Lock()
	defer e.fs.mu.Unlock()
	e.fs.newest = max(e.fs.newest, t.Token)
	if t.Leader.MarkKey == "" || len(e.fs.keys) > 0 && e.fs.keys[0].token == t.Token {
		return
	}
	e.fs.keys = append([]fsKey{{t.Token, []byte(t.Leader.MarkKey), t.Leader}}, e.fs.keys[:min(len(e.fs.keys), keptMarkKeys-1)]...)
}

// markKeyOf returns the MarkKey of term token if this instance saw it.
func (e *Election) markKeyOf(token int64) ([]byte, bool) {
	e.fs.mu.Lock()
	defer e.fs.mu.Unlock()
	for _, k := range e.fs.keys {
		if k.token == token {
			return k.key, true
		}
	}
	return nil, false
}

// failsafeHolding reports whether this instance keeps another term alive as a peer now:
// it then neither campaigns nor forgets that term's leader.
func (e *Election) failsafeHolding() bool {
	if e.c.cfg.Failsafe == nil {
		return false
	}
	e.fs.mu.Lock()
	defer e.fs.mu.Unlock()
	return e.c.now().Before(e.fs.record.until)
}

// confirmedRemaining is how long a confirmation this instance gave (or may have given,
// before it started) still holds, for any term but except; zero when none does.
func (e *Election) confirmedRemaining(except int64, now time.Time) time.Duration {
	e.fs.mu.Lock()
	defer e.fs.mu.Unlock()
	d := max(0, e.fs.unknownUntil.Sub(now))
	if e.fs.record.token != except {
		d = max(d, e.fs.record.until.Sub(now))
	}
	return d
}

// FailsafeAnswer answers a failsafe message from another instance (the body its failsafe
// endpoint received) and returns the body to send back. It never blocks for long: a
// fence from a winner that this instance cannot authenticate from memory costs one store
// read.
func (c *Candidate) FailsafeAnswer(ctx context.Context, body []byte) []byte {
	var m fsMessage
	var r fsReply
	if err := json.Unmarshal(body, &m); err != nil {
		r.Reason = "malformed"
	} else if c.cfg.Failsafe == nil {
		r.Reason = "failsafe is off here"
	} else {
		c.mu.Lock()
		e := c.elections[m.Election]
		c.mu.Unlock()
		if e == nil {
			r.Reason = "not a candidate in this election"
		} else {
			r = e.answer(ctx, &m)
		}
	}
	out, _ := json.Marshal(r) // a bool, a string and bytes always marshal
	return out
}

// answer decides on m and signs the reply, if m is genuine.
func (e *Election) answer(ctx context.Context, m *fsMessage) fsReply {
	key, ok := e.markKeyOf(m.Token)
	if !ok && m.Kind == fsFence {
		// A winner asks about a term this instance never saw (it started since): the
		// roster in the store has the key.
		if r, err := e.latestRoster(ctx); err == nil && r != nil && r.Token == m.Token {
			key, ok = []byte(r.MarkKey), true
		}
	}
	if !ok {
		return fsReply{Reason: "unknown term"}
	}
	now := e.c.now()
	if age := time.Since(time.Unix(0, m.At)); m.To != e.c.cfg.ID || !hmac.Equal(m.MAC, m.mac(key)) || age > e.c.cfg.TTL || age < -e.c.cfg.TTL {
		return fsReply{Reason: "not authenticated"}
	}
	var r fsReply
	switch m.Kind {
	case fsConfirm:
		r = e.confirm(m, now)
		if r.Accepted {
			e.recallLeader(m.Token)
		}
	case fsEnd:
		// Only the end of the rounds this instance answered last: an end sent before
		// the latest confirmation (a late delivery, or a copy replayed by anyone on the
		// path) must not cancel what the leader still relies on.
		e.fs.mu.Lock()
		if e.fs.record.token == m.Token && m.Seq > e.fs.record.seq {
			e.fs.record.until = time.Time{}
		}
		e.fs.mu.Unlock()
		e.kick()
		r.Accepted = true
	case fsFence:
		r = e.fence(m, now)
	default:
		r.Reason = "unknown kind"
	}
	r.MAC = r.mac(key, m)
	return r
}

// confirm keeps m's term alive for its TTL, unless this instance leads, has seen a newer
// term or keeps another one alive.
func (e *Election) confirm(m *fsMessage, now time.Time) fsReply {
	if e.term.Load().Holds() {
		return fsReply{Reason: "leading"}
	}
	e.fs.mu.Lock()
	defer e.fs.mu.Unlock()
	switch {
	case m.Token < e.fs.newest:
		return fsReply{Reason: "a newer term was seen"}
	case e.fs.record.token != m.Token && now.Before(e.fs.record.until):
		return fsReply{Reason: "confirming another term"}
	}
	// Checked again under the lock: a term published meanwhile took it first.
	if e.term.Load().Holds() {
		return fsReply{Reason: "leading"}
	}
	e.fs.newest = m.Token
	if e.fs.record.token != m.Token {
		e.fs.record.seq = 0
	}
	// A confirmation delivered late still holds for a TTL from now: it only ever keeps
	// this instance out longer, never lets it campaign sooner.
	e.fs.record.token, e.fs.record.leader = m.Token, m.From
	e.fs.record.until = later(e.fs.record.until, now.Add(m.TTL))
	e.fs.record.seq = max(e.fs.record.seq, m.Seq)
	if e.fs.timer != nil {
		e.fs.timer.Stop()
	}
	e.fs.timer = time.AfterFunc(m.TTL, e.kick) // campaign again once it runs out
	return fsReply{Accepted: true}
}

// recallLeader publishes the leader of term token again if this instance forgot it when it
// lost the store before the first round reached it: followers forward to it again.
func (e *Election) recallLeader(token int64) {
	e.fs.mu.Lock()
	var rec Record
	for _, k := range e.fs.keys {
		if k.token == token {
			rec = k.rec
		}
	}
	e.fs.mu.Unlock()
	if rec.ID == "" {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if t := e.term.Load(); t.lease == nil && !t.LeaderKnown() {
		e.publishLocked(rec, token, nil, "leader confirmed in a failsafe")
	}
}

// fence makes this instance confirm nothing older than m.NewToken from now on, stops its
// own failsafe if it leads an older term, and says how long what it confirmed still holds.
func (e *Election) fence(m *fsMessage, now time.Time) fsReply {
	e.fs.mu.Lock()
	e.fs.newest = max(e.fs.newest, m.NewToken)
	e.fs.mu.Unlock()
	r := fsReply{Accepted: true, Remaining: e.confirmedRemaining(m.NewToken, now)}
	if t := e.term.Load(); t.lease != nil && t.Token < m.NewToken && t.fs != nil {
		r.Remaining = max(r.Remaining, t.fs.remaining(now))
		t.fs.clear() // deposed: the next round does not renew it either
	}
	return r
}

// proveNoFailsafe looks for the failsafe part of proof p (see proof): that no term older
// than p.fenceAs can still admit through a failsafe. It keeps looking until it finds it or
// the candidate closes, whether or not the term that owes it still holds the key: a term
// that ended unproven hands p on, and its end is acknowledged only once p is complete.
// Only the leader of the newest roster in the store can ride out a failsafe, and only
// while every member confirms it. So:
//   - no roster in the store, or a roster with a member that has no failsafe endpoint
//     (that member refuses every round), means no term could ride one: nothing is owed,
//     whatever this process, or an earlier one under its id, confirmed;
//   - otherwise a confirmation this instance gave for another term, or one an earlier
//     process of its id may have given (its first ttl), is waited out (it refuses any
//     further one, since it holds a term now);
//   - if this very process is in the newest roster, that is enough: the leader asks it
//     (an instance of the same id in another process is not asked: roster entries name
//     the process, see CandidateInfo.Boot);
//   - otherwise one member of that roster must promise (a fence) to confirm that term
//     no more, and what it confirmed last is waited out.
//
// The roster is read after the term was won, so it shows every roster written before: a
// roster an older term writes later is never confirmed, since confirming it takes a
// heartbeat of that term's key, which is no longer its own.
func (e *Election) proveNoFailsafe(p *proof) {
	token := p.fenceAs
	retry := newBackoff(50*time.Millisecond, min(time.Second, e.c.cfg.TTL/4))
	warned := false
	for {
		if _, failsafe := p.owes(); !failsafe {
			return
		}
		r, err := e.latestRoster(e.c.ctx)
		if err != nil {
			e.c.storeFailed("failsafe roster", err)
			if !retry.wait(e.c.ctx) {
				return
			}
			continue
		}
		if r == nil || !r.couldRide() {
			p.noRoster.Store(r == nil || len(r.Members) == 0)
			p.failsafeProven()
			return
		}
		if d := e.confirmedRemaining(token, e.c.now()); d > 0 {
			if !sleepCtx(e.c.ctx, d) {
				return
			}
			continue
		}
		if r.Token < token && !r.lists(e.c.cfg.ID, e.c.boot) {
			until, ok := e.fenceRoster(r, token)
			if !ok {
				if !warned {
					warned = true
					e.c.log().Warn("failsafe: no member of the previous term's roster answered a fence; this term admits nothing, and lets go of nothing, until one does. If that fleet is gone for good, delete the election's failsafe roster in the store",
						zap.String("election", e.name), zap.Int64("token", token), zap.Int64("roster_token", r.Token),
						zap.String("roster", rosterElection(e.name)))
				}
				if !retry.wait(e.c.ctx) {
					return
				}
				continue
			}
			e.c.log().Info("failsafe: the previous term's roster is fenced; waiting out its confirmations",
				zap.String("election", e.name), zap.Int64("token", token), zap.Int64("roster_token", r.Token),
				zap.Duration("wait", until.Sub(e.c.now())))
			if !sleepCtx(e.c.ctx, until.Sub(e.c.now())) {
				return
			}
		}
		p.failsafeProven()
		return
	}
}

// fenceRoster asks every member of r (but this instance) to confirm r's term no more, and
// returns when the earliest one's last confirmation has certainly run out; false when no
// member answered.
func (e *Election) fenceRoster(r *fsRoster, token int64) (time.Time, bool) {
	type answer struct {
		id  string
		at  time.Time
		rep fsReply
		err error
	}
	answers := make(chan answer, len(r.Members))
	n := 0
	for _, m := range r.Members {
		if m.ID == e.c.cfg.ID || m.URL == "" {
			continue
		}
		n++
		go func() {
			rep, err := e.c.ask(e.c.ctx, m.URL, []byte(r.MarkKey), fsMessage{
				Kind: fsFence, Election: e.name, Token: r.Token, From: e.c.cfg.ID, To: m.ID, NewToken: token,
			})
			answers <- answer{m.ID, e.c.now(), rep, err}
		}()
	}
	var best time.Time
	found := false
	var refused []string
	for range n {
		a := <-answers
		switch {
		case a.err != nil:
			refused = append(refused, a.id+": "+a.err.Error())
			continue
		case !a.rep.Accepted:
			refused = append(refused, a.id+": "+a.rep.Reason)
			continue
		}
		// The member's confirmation ends, by its clock, Remaining after it answered,
		// which was before the answer arrived; the margin covers the clocks' rates.
		until := a.at.Add(a.rep.Remaining + safetyMargin(r.TTL))
		if !found || until.Before(best) {
			best, found = until, true
		}
	}
	if !found {
		e.c.log().Warn("failsafe: no member of the previous term's roster answered; the new term waits",
			zap.String("election", e.name), zap.Int64("token", token), zap.Int64("roster_token", r.Token),
			zap.Int("asked", n), zap.Strings("refused", refused))
	}
	return best, found
}

// retireRoster runs for term t of a candidate without failsafe mode that fences other
// terms' rosters (Config.Fence). Once t has settled, its proof is complete: every older
// term is proven stopped, failsafe rides included,
// so a roster older than t can no longer matter: t writes an empty roster of its own over
// it, so that a later winner need not fence members that may be long gone (a fleet that
// turned failsafe off, or was replaced since). Nothing is written when the newest roster
// is empty already, or none exists.
func (e *Election) retireRoster(t *Term) {
	for {
		changed := e.Changed()
		cur := e.term.Load()
		if cur.lease != t.lease || cur.Token != t.Token {
			return
		}
		if !cur.Settling {
			break
		}
		select {
		case <-changed:
		case <-t.end.Done():
			return
		}
	}
	if e.provenWithoutRoster(t) {
		return
	}
	r, err := e.latestRoster(t.end)
	if err != nil || r == nil || len(r.Members) == 0 || r.Token >= t.Token {
		return
	}
	entry, _ := json.Marshal(fsRoster{Token: t.Token, Leader: e.c.cfg.ID, LeaderBoot: e.c.boot, MarkKey: t.Leader.MarkKey, TTL: t.lease.granted})
	rctx, cancel := e.request(t.end, e.c.requestTimeout)
	defer cancel()
	if err := e.c.cfg.Backend.AppendHistory(rctx, rosterElection(e.name), entry, rostersKept); err != nil && t.end.Err() == nil {
		e.c.storeFailed("failsafe roster", err)
	}
}

// provenWithoutRoster reports whether term t's failsafe proof read the store's rosters
// after t was won and found none with members: then there is nothing to retire, and
// retireRoster need not read them again (a shard set's start would read thousands twice).
// A roster an older term wrote since is left to a later winner's proof to fence, as is
// any roster retireRoster does not replace.
func (e *Election) provenWithoutRoster(t *Term) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.own.token == t.Token && e.own.proof != nil && e.own.proof.noRoster.Load()
}
