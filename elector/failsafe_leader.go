package elector

import (
	"context"
	"encoding/json"
	"reflect"
	"sort"
	"time"

	"go.uber.org/zap"
)

// heldRoster is a roster this leader wrote (or tried to) and when the write returned.
type heldRoster struct {
	fsRoster
	written   time.Time
	confirmed bool
	// failed is set when the write returned an error: it may have landed or not, so it is
	// asked, but never confirmed, and written again (see keepRoster).
	failed bool
}

// keepFailsafe runs beside keepBeating for every term this instance holds while failsafe
// is on: while the store is reachable it keeps the term's roster in the store; once a
// renewal or heartbeat cannot reach it, it asks every roster member every renewal
// interval and moves the term's failsafe window on while all of them accept.
func (e *Election) keepFailsafe(t *Term) {
	l := t.lease
	e.fs.mu.Lock()
	e.fs.rosters, e.fs.active, e.fs.noRoster = nil, false, false
	e.fs.mu.Unlock()
	// Checked every ttl/6: a renewal that is overdue starts the rounds before the lease
	// deadline, rather than once the request's timeout reports the error.
	interval := l.granted / 3
	tick := time.NewTicker(interval / 2)
	defer tick.Stop()
	var lastRound time.Time
	defer e.stopFailsafe(t, "term ended")
	for {
		changed := e.Changed() // the term settling is the moment to write its roster
		cause, trouble := e.c.failsafeState()
		switch {
		case t.end.Err() != nil:
			return
		case e.deposed(t):
			t.fs.clear()
			return
		case cause == "" && !e.failsafeActive() && !e.overdue(t):
			e.keepRoster(t)
		case cause == "" && e.storeConfirms(t):
			e.stopFailsafe(t, "store reachable again")
		default:
			if cause == "" {
				cause = "renewal overdue"
			}
			if now := e.c.now(); now.Sub(lastRound) >= interval-interval/4 && e.startFailsafe(t, cause) {
				lastRound = now
				e.failsafeRound(t)
			}
		}
		select {
		case <-t.end.Done():
			return
		case <-l.lost:
			return
		case <-trouble:
		case <-changed:
		case <-tick.C:
		}
	}
}

// deposed reports whether a newer term than t is known (seen in the store or announced by
// a fence).
func (e *Election) deposed(t *Term) bool {
	e.fs.mu.Lock()
	defer e.fs.mu.Unlock()
	return e.fs.newest > t.Token
}

func (e *Election) failsafeActive() bool {
	e.fs.mu.Lock()
	defer e.fs.mu.Unlock()
	return e.fs.active
}

// overdue reports whether t's lease or heartbeat has gone unconfirmed for longer than
// usual: half its window is gone, while a renewal every ttl/3 keeps more than that. A
// renewal still on its way may time out; the rounds then begin before the deadline. An
// answer of the store that ends the term ends it all the same.
func (e *Election) overdue(t *Term) bool {
	now, half := e.c.now(), t.lease.granted/2
	return t.lease.remaining(now) < half || t.beat.remaining(now) < half
}

// storeConfirms reports whether the store has confirmed t again, both its lease and its
// heartbeat, recently enough that the failsafe can end.
func (e *Election) storeConfirms(t *Term) bool {
	now, half := e.c.now(), t.lease.granted/2
	return t.lease.remaining(now) > half && t.beat.remaining(now) > half
}

// keepRoster writes t's roster to the store when the live candidates changed, and
// confirms a written roster once a heartbeat sent after the write succeeded: from then on
// a winner reading the store sees it (the heartbeat proves t still held the key after it).
func (e *Election) keepRoster(t *Term) {
	// Not before the term settled: a roster of this term in the store would hide the
	// previous term's from the proof that this one waits for (proveNoFailsafe).
	now := e.c.now()
	if cur := e.term.Load(); cur.Token != t.Token || cur.Settling || !t.beat.valid(now) {
		return
	}
	e.confirmRoster(t)
	list, err := e.Candidates(t.end)
	if err != nil {
		return
	}
	r := fsRoster{Token: t.Token, Leader: e.c.cfg.ID, LeaderBoot: e.c.boot, MarkKey: t.Leader.MarkKey, TTL: t.lease.granted, NeedsPeer: true}
	for _, c := range list {
		r.Members = append(r.Members, fsMember{ID: c.ID, Boot: c.Boot, URL: c.Failsafe})
	}
	sort.Slice(r.Members, func(i, j int) bool { return r.Members[i].ID < r.Members[j].ID })
	e.fs.mu.Lock()
	n := len(e.fs.rosters)
	same := n > 0 && reflect.DeepEqual(e.fs.rosters[n-1].fsRoster, r)
	if same && e.fs.rosters[n-1].failed {
		// The store may not hold it: write it again, in its place, rather than confirm
		// with the next heartbeat a roster a winner may never read.
		e.fs.rosters, same = e.fs.rosters[:n-1], false
	}
	e.fs.mu.Unlock()
	if same {
		return
	}
	entry, _ := json.Marshal(r) // strings and numbers always marshal
	rctx, cancel := e.request(t.end, e.c.requestTimeout)
	err = e.c.cfg.Backend.AppendHistory(rctx, rosterElection(e.name), entry, rostersKept)
	cancel()
	if err != nil && t.end.Err() == nil {
		e.c.storeFailed("failsafe roster", err)
	}
	// Even a failed write may have landed: the roster counts among those to ask.
	written := e.c.now()
	e.fs.mu.Lock()
	e.fs.rosters = append(e.fs.rosters, heldRoster{fsRoster: r, written: written, failed: err != nil})
	e.fs.mu.Unlock()
	if err == nil {
		// A heartbeat now confirms the roster at once, rather than with the next renewal.
		if ok, _ := e.writeRecord(t.end, t); ok {
			e.confirmRoster(t)
		}
	}
}

// confirmRoster makes the newest roster the confirmed one if a heartbeat sent after it was
// written succeeded: t held the key after the write, so a later term's proof reads it.
func (e *Election) confirmRoster(t *Term) {
	e.fs.mu.Lock()
	defer e.fs.mu.Unlock()
	if n := len(e.fs.rosters); n > 0 && !e.fs.rosters[n-1].confirmed && !e.fs.rosters[n-1].failed && e.beatSent(t).After(e.fs.rosters[n-1].written) {
		last := e.fs.rosters[n-1]
		last.confirmed = true
		e.fs.rosters = []heldRoster{last}
	}
}

// beatSent is when the last successful heartbeat of t was sent.
func (e *Election) beatSent(t *Term) time.Time {
	return clockBase.Add(time.Duration(t.beat.mono.Load()) - beatWindow(t.lease.granted))
}

// startFailsafe makes the failsafe of t active, if it has a confirmed roster; it reports
// whether it is active.
func (e *Election) startFailsafe(t *Term, cause string) bool {
	e.fs.mu.Lock()
	if e.fs.active {
		e.fs.mu.Unlock()
		return true
	}
	if why := e.noFailsafeLocked(); why != "" {
		if !e.fs.noRoster {
			e.fs.noRoster = true
			e.c.log().Warn("store unreachable, but no failsafe: "+why,
				zap.String("election", e.name), zap.Int64("token", t.Token), zap.String("cause", cause))
		}
		e.fs.mu.Unlock()
		return false
	}
	e.fs.active, e.fs.cause, e.fs.since = true, cause, time.Now()
	peers := e.askSetLocked()
	e.fs.mu.Unlock()
	e.c.log().Warn("store unreachable: failsafe started, leading while every peer confirms",
		zap.String("election", e.name), zap.Int64("token", t.Token), zap.String("cause", cause), zap.Int("peers", len(peers)))
	if o := e.c.failsafeObserver(); o != nil {
		o.FailsafeChanged(e, true, cause)
	}
	return true
}

// noFailsafeLocked says why the term cannot ride a failsafe now, "" if it can: it needs a
// confirmed roster, and every roster it wrote since must list another instance, since any
// of them may be the newest in the store, and a winner that reads one listing this leader
// alone fences nobody (couldRide). e.fs.mu is held.
func (e *Election) noFailsafeLocked() string {
	if len(e.fs.rosters) == 0 || !e.fs.rosters[0].confirmed {
		return "this term has no confirmed roster yet"
	}
	for _, r := range e.fs.rosters {
		if !r.hasPeer() {
			return "the roster lists no other instance to confirm this term"
		}
	}
	return ""
}

// stopFailsafe ends an active failsafe of t and tells the peers, so that they campaign
// again without waiting out their confirmations.
func (e *Election) stopFailsafe(t *Term, why string) {
	e.fs.mu.Lock()
	active := e.fs.active
	e.fs.active, e.fs.noRoster = false, false
	peers := e.askSetLocked()
	e.fs.seq++
	seq := e.fs.seq
	e.fs.mu.Unlock()
	if !active {
		return
	}
	e.c.log().Warn("failsafe ended", zap.String("election", e.name), zap.Int64("token", t.Token), zap.String("reason", why))
	if o := e.c.failsafeObserver(); o != nil {
		o.FailsafeChanged(e, false, why)
	}
	for _, p := range peers {
		go func() {
			_, _ = e.c.ask(context.Background(), p.URL, []byte(t.Leader.MarkKey),
				fsMessage{Kind: fsEnd, Election: e.name, Token: t.Token, From: e.c.cfg.ID, To: p.ID, Seq: seq})
		}()
	}
}

// askSetLocked is every member of every roster that may be the newest in the store, but
// this instance. e.fs.mu is held.
func (e *Election) askSetLocked() []fsMember {
	seen := map[string]bool{e.c.cfg.ID: true}
	var list []fsMember
	for _, r := range e.fs.rosters {
		for _, m := range r.Members {
			if !seen[m.ID] {
				seen[m.ID] = true
				list = append(list, m)
			}
		}
	}
	return list
}

// failsafeRound asks every peer to keep t alive and, if all accept, lets t admit until
// the round's send time plus the TTL minus the margin: each peer keeps it alive for a TTL
// from when it accepted, which is later. One refusal or silence stops admission at once.
func (e *Election) failsafeRound(t *Term) {
	e.fs.mu.Lock()
	peers := e.askSetLocked()
	e.fs.seq++
	seq := e.fs.seq
	e.fs.mu.Unlock()
	ttl := t.lease.granted
	sent := e.c.now()
	refusals := make(chan string, len(peers))
	for _, p := range peers {
		go func() {
			if p.URL == "" {
				refusals <- p.ID + ": no failsafe endpoint"
				return
			}
			r, err := e.c.ask(t.end, p.URL, []byte(t.Leader.MarkKey),
				fsMessage{Kind: fsConfirm, Election: e.name, Token: t.Token, From: e.c.cfg.ID, To: p.ID, TTL: ttl, Seq: seq})
			switch {
			case err != nil:
				refusals <- p.ID + ": " + err.Error()
			case !r.Accepted:
				refusals <- p.ID + ": " + r.Reason
			default:
				refusals <- ""
			}
		}()
	}
	var refused []string
	for range peers {
		if why := <-refusals; why != "" {
			refused = append(refused, why)
		}
	}
	ok := len(refused) == 0 && !e.deposed(t)
	if ok {
		t.fs.set(sent.Add(ttl - safetyMargin(ttl)))
	} else {
		t.fs.clear()
	}
	e.fs.mu.Lock()
	e.fs.rounds++
	if !ok {
		e.fs.refused++
	}
	e.fs.mu.Unlock()
	if !ok {
		e.c.log().Warn("failsafe round refused: not admitting", zap.String("election", e.name),
			zap.Int64("token", t.Token), zap.Strings("refused", refused))
	}
	if o := e.c.failsafeObserver(); o != nil {
		o.FailsafeRound(e, !ok)
	}
}

// Failsafe reports the election's failsafe state.
func (e *Election) Failsafe() FailsafeStatus {
	s := FailsafeStatus{Enabled: e.c.cfg.Failsafe != nil}
	now := e.c.now()
	e.fs.mu.Lock()
	defer e.fs.mu.Unlock()
	s.Active, s.Cause, s.Rounds, s.Refused = e.fs.active, e.fs.cause, e.fs.rounds, e.fs.refused
	if s.Active {
		s.Since = e.fs.since
	}
	if len(e.fs.rosters) > 0 && e.fs.rosters[0].confirmed {
		for _, m := range e.fs.rosters[0].Members {
			s.Roster = append(s.Roster, m.ID)
		}
	}
	if d := e.fs.record.until.Sub(now); d > 0 {
		s.Confirming, s.ConfirmingFor = e.fs.record.token, d
	}
	return s
}
