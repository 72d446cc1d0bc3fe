package caddyleader

import (
	"net/http"
	"strconv"

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

	// ShardSet names a shard set of the leader app: the matcher then matches where this
	// instance owns the shard of the request's key (see ShardSet), and sets the
	// placeholders of that shard. It needs ShardKey, and excludes Election. Default: none.
	ShardSet string `json:"shard_set,omitempty"`

	// ShardKey is the request's key in ShardSet, with placeholders, as leader_gate's
	// shard_key. Default: none.
	ShardKey string `json:"shard_key,omitempty"`

	election     *elector.Election
	placeholders *placeholderCache
	routes       []*gateRoute // one per shard, with a shard set
	key          shardKey
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
	if m.ShardSet != "" || m.ShardKey != "" {
		return m.provisionShards(ctx)
	}
	_, e, err := joinElection(ctx, "leader matcher", &m.Election)
	if err != nil {
		return err
	}
	m.election = e
	m.placeholders = new(placeholderCache)
	return nil
}

// provisionShards sets up a matcher that tests a shard set.
func (m *Matcher) provisionShards(ctx caddy.Context) error {
	_, set, key, err := joinShardSet(ctx, "leader matcher", m.Election, m.ShardSet, m.ShardKey)
	if err != nil {
		return err
	}
	m.key = key
	m.routes = make([]*gateRoute, len(set.elections))
	for s, e := range set.elections {
		m.routes[s] = newGateRoute(e.Name(), e, strconv.Itoa(s))
	}
	return nil
}

// MatchWithError implements caddyhttp.RequestMatcherWithError.
func (m *Matcher) MatchWithError(r *http.Request) (bool, error) {
	repl, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	e, placeholders := m.election, m.placeholders
	if m.routes != nil {
		rt := m.routes[m.key.requestShard(r, len(m.routes))]
		e, placeholders = rt.election, rt.placeholders
	}
	t, leading := e.Check()
	if repl != nil {
		placeholders.set(repl, t, leading)
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
