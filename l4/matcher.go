// Package leaderl4 brings caddy-leader to layer 4 (github.com/mholt/caddy-l4): the
// `leader` connection matcher and the `leader_gate` connection handler, which admits a
// connection on the leader only, hands it to the leader elsewhere, and cuts every
// connection of a term when that term stops admitting.
package leaderl4

import (
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/mholt/caddy-l4/layer4"

	caddyleader "github.com/caddyleader/caddy-leader"
	"github.com/caddyleader/caddy-leader/elector"
)

func init() {
	caddy.RegisterModule(&MatchLeader{})
	caddy.RegisterModule(&Gate{})
}

// MatchLeader is the `leader` connection matcher: it matches while this instance leads the
// election, by the same test as the HTTP `leader_gate` (key held, lease and heartbeat
// deadlines ahead, no handover under way). Under `not` it matches on every instance that
// does not lead. It sets the same placeholders as the layer-4 `leader_gate`.
//
// A matcher only decides when a connection is accepted: a connection it routes is not
// tracked, so it is not cut when the term ends and a handover does not wait for it. Put
// `leader_gate` in the route where a new leader must never overlap with the old one's
// connections.
type MatchLeader struct {
	// Election is the name of the election. Default: `default`.
	Election string `json:"election,omitempty"`

	election *elector.Election
}

// CaddyModule returns the Caddy module information.
func (*MatchLeader) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "layer4.matchers.leader",
		New: func() caddy.Module { return new(MatchLeader) },
	}
}

// Provision implements caddy.Provisioner.
func (m *MatchLeader) Provision(ctx caddy.Context) error {
	e, err := caddyleader.JoinElection(ctx, "layer4 leader matcher", &m.Election)
	m.election = e
	return err
}

// Match implements layer4.ConnMatcher. It reads nothing from the connection.
func (m *MatchLeader) Match(cx *layer4.Connection) (bool, error) {
	t, leading := m.election.Check()
	setPlaceholders(cx.Replacer(), t, leading, "")
	return leading, nil
}

// UnmarshalCaddyfile sets up the matcher from Caddyfile tokens. Syntax:
//
//	leader [<election>]
func (m *MatchLeader) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the matcher's name
	if d.NextArg() {
		m.Election = d.Val()
		if err := caddyleader.CheckElectionName(m.Election); err != nil {
			return d.Errf("leader: %v", err)
		}
	}
	if d.NextArg() {
		return d.ArgErr()
	}
	if d.NextBlock(d.Nesting()) {
		return d.Err("leader: the matcher takes no block")
	}
	return nil
}

// Interface guards
var (
	_ caddy.Provisioner     = (*MatchLeader)(nil)
	_ layer4.ConnMatcher    = (*MatchLeader)(nil)
	_ caddyfile.Unmarshaler = (*MatchLeader)(nil)
)
