package caddyleader

import (
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddyleader/caddy-leader/elector"
)

// Placeholder names set by the gate and the matcher.
const (
	phElection = "http.leader.election"
	phIsLeader = "http.leader.is_leader"
	phSelf     = "http.leader.self"
	phID       = "http.leader.id"
	phURL      = "http.leader.url"
	phToken    = "http.leader.token"
	phShard    = "http.leader.shard"
	// Set only on a request the gate admitted (empty otherwise).
	phAdmittedAt = "http.leader.admitted_at"
	phDeadline   = "http.leader.deadline"
)

// termPlaceholders answers the leader placeholders for one Term. Its values are boxed once,
// when leadership changes, so a gated request pays only for registering a provider.
type termPlaceholders struct {
	term     *elector.Term
	admitted caddy.ReplacerFunc // is_leader true
	refused  caddy.ReplacerFunc // is_leader false
}

// shard is the number of the shard t's election is, for a gate that routes by key; "" for a
// plain election.
func newTermPlaceholders(t *elector.Term, shard string) *termPlaceholders {
	var token any = ""
	if t.Token != 0 {
		token = t.Token
	}
	values := map[string]any{
		phElection: t.Election,
		phSelf:     t.Self,
		phID:       t.Leader.ID,
		phURL:      t.Leader.URL,
		phToken:    token,
		phShard:    shard,
	}
	provider := func(isLeader bool) caddy.ReplacerFunc {
		return func(key string) (any, bool) {
			switch key {
			case phIsLeader:
				return isLeader, true
			case phAdmittedAt, phDeadline:
				return "", true // unless setAdmission's provider, added before this one, answered
			}
			v, ok := values[key]
			return v, ok
		}
	}
	return &termPlaceholders{term: t, admitted: provider(true), refused: provider(false)}
}

// placeholderCache remembers the providers of the newest Term one gate or matcher has seen
// in one election.
type placeholderCache struct {
	last  atomic.Pointer[termPlaceholders]
	shard string // the election's shard number, if it is a shard's
}

// set makes the leader placeholders of request repl answer for Term t and decision admitted.
// When a request passes several gates or matchers, the first one's values are kept (Caddy's
// replacer asks providers in order); for fencing that is safe, as an older term's token
// is only ever lower.
func (c *placeholderCache) set(repl *caddy.Replacer, t *elector.Term, admitted bool) {
	p := c.last.Load()
	if p == nil || p.term != t {
		p = newTermPlaceholders(t, c.shard)
		c.last.Store(p)
	}
	if admitted {
		repl.Map(p.admitted)
	} else {
		repl.Map(p.refused)
	}
}

// setAdmission makes the admission placeholders of repl, for a request a gate admitted
// under term t at now (the gate's own clock read), answer when it was admitted and until
// when t could admit it, by this host's wall clock: a backend that sees the request after
// that deadline knows its term may have ended before the request reached it (a leader
// that froze right after admitting), and can refuse it. It is the one allocation of an
// admitted request (hence Gate.AdmissionTimes), and provides only these two keys: the
// term's others come from set, which must be called after it.
func setAdmission(repl *caddy.Replacer, t *elector.Term, now time.Time) {
	repl.Map(admissionTimes(t, now))
}

// admissionTimes answers the admission placeholders of a request admitted under t at now
// (see setAdmission), and no others.
func admissionTimes(t *elector.Term, now time.Time) caddy.ReplacerFunc {
	deadline := now.Add(t.Remaining(now))
	return func(key string) (any, bool) {
		switch key {
		case phAdmittedAt:
			return now.UTC().Format(time.RFC3339Nano), true
		case phDeadline:
			return deadline.UTC().Format(time.RFC3339Nano), true
		}
		return nil, false
	}
}

// setAdmitted makes the placeholders of repl answer for a request admitted here under term
// t at now (the gate's own clock read), with the admission times if times. It is the one way
// a gate sets them for a request it serves. later says the request already carries the
// placeholders of an earlier decision (the forward loop held it, refused, until this
// instance won a term): this decision's values must then take precedence, since Caddy's
// replacer asks its static values before providers added with Map, and the provider
// added first among those. Its token must be the term it is served under.
func (c *placeholderCache) setAdmitted(repl *caddy.Replacer, t *elector.Term, now time.Time, times, later bool) {
	if !later {
		if times {
			setAdmission(repl, t, now) // before the term's provider, which answers them empty
		}
		c.set(repl, t, true)
		return
	}
	answer := newTermPlaceholders(t, c.shard).admitted
	if times {
		term, admission := answer, admissionTimes(t, now)
		answer = func(key string) (any, bool) {
			if v, ok := admission(key); ok {
				return v, true
			}
			return term(key)
		}
	}
	for _, key := range []string{phElection, phIsLeader, phSelf, phID, phURL, phToken, phShard, phAdmittedAt, phDeadline} {
		v, _ := answer(key)
		repl.Set(key, v)
	}
}
