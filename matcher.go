package caddyleader

import (
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddyleader/caddy-leader/elector"
)

// Matcher is the `leader` request matcher: it matches while this instance leads the
// election, by the same per-request test as `leader_gate` (key held, lease deadline ahead).
// Under `not` it matches on every instance that does not lead. It sets the same
// placeholders as the gate.
//
// Unlike the gate, a matcher cannot see when a request ends, so requests it routes are not
// counted as in flight and a handover does not wait for them: use `leader_gate` where a new
// leader must not start before the old one's requests are done.
type Matcher struct {
	// Election is the name of the election. Default: `default`.
	Election string `json:"election,omitempty"`

	election     *elector.Election
	placeholders *placeholderCache
}

// CaddyModule returns the Caddy module information.
func (Matcher) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.matchers.leader",
		New: func() caddy.Module { return new(Matcher) },
	}
}

// Provision implements caddy.Provisioner.
func (m *Matcher) Provision(ctx caddy.Context) error {
	_, e, err := joinElection(ctx, "leader matcher", &m.Election)
	if err != nil {
		return err
	}
	m.election = e
	m.placeholders = new(placeholderCache)
	return nil
}

// MatchWithError implements caddyhttp.RequestMatcherWithError.
func (m *Matcher) MatchWithError(r *http.Request) (bool, error) {
	t, leading := m.election.Check()
	if repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer); ok {
		m.placeholders.set(repl, t, leading)
	}
	return leading, nil
}

// Match implements caddyhttp.RequestMatcher.
func (m *Matcher) Match(r *http.Request) bool {
	ok, _ := m.MatchWithError(r)
	return ok
}

// Interface guards
var (
	_ caddy.Provisioner                 = (*Matcher)(nil)
	_ caddyhttp.RequestMatcherWithError = (*Matcher)(nil)
	_ caddyhttp.RequestMatcher          = (*Matcher)(nil)
)

func init() {
	caddy.RegisterModule(CandidateMatcher{})
}

// CandidateMatcher is the `leader_candidate` request matcher: it matches while this
// instance is a healthy candidate of the election, whether it leads or not: it takes part,
// and etcd has confirmed its lease recently enough that the lease deadline is still
// ahead. It suits the health check of a load balancer that spreads traffic over every
// instance able to serve or take over (with `leader_gate` forwarding the rest); for
// active/passive routing, health-check with the `leader` matcher instead.
type CandidateMatcher struct {
	// Election is the name of the election. Default: `default`.
	Election string `json:"election,omitempty"`

	election *elector.Election
}

// CaddyModule returns the Caddy module information.
func (CandidateMatcher) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.matchers.leader_candidate",
		New: func() caddy.Module { return new(CandidateMatcher) },
	}
}

// Provision implements caddy.Provisioner.
func (m *CandidateMatcher) Provision(ctx caddy.Context) error {
	_, e, err := joinElection(ctx, "leader_candidate matcher", &m.Election)
	m.election = e
	return err
}

// MatchWithError implements caddyhttp.RequestMatcherWithError.
func (m *CandidateMatcher) MatchWithError(*http.Request) (bool, error) {
	return m.election.Healthy(), nil
}

// Match implements caddyhttp.RequestMatcher.
func (m *CandidateMatcher) Match(r *http.Request) bool {
	ok, _ := m.MatchWithError(r)
	return ok
}

// Interface guards
var (
	_ caddy.Provisioner                 = (*CandidateMatcher)(nil)
	_ caddyhttp.RequestMatcherWithError = (*CandidateMatcher)(nil)
	_ caddyhttp.RequestMatcher          = (*CandidateMatcher)(nil)
)
