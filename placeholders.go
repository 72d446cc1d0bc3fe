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
	deadline := now.Add(t.Remaining(now))
	repl.Map(func(key string) (any, bool) {
		switch key {
		case phAdmittedAt:
			return now.UTC().Format(time.RFC3339Nano), true
		case phDeadline:
			return deadline.UTC().Format(time.RFC3339Nano), true
		}
		return nil, false
	})
}

// setTermPlaceholders makes the leader placeholders of repl answer for t and admitted,
// taking precedence over any set earlier in the request (Caddy's replacer asks its
// static values before providers added with Map). For the rare request whose term changes
// while it is held: its token must be the term it is served under.
func setTermPlaceholders(repl *caddy.Replacer, t *elector.Term, shard string, admitted bool) {
	p := newTermPlaceholders(t, shard)
	provider := p.refused
	if admitted {
		provider = p.admitted
	}
	for _, key := range []string{phElection, phIsLeader, phSelf, phID, phURL, phToken, phShard} {
		v, _ := provider(key)
		repl.Set(key, v)
	}
}
