package leaderl4

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/mholt/caddy-l4/layer4"
	"go.uber.org/zap"

	caddyleader "github.com/caddyleader/caddy-leader"
	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/internal/termconn"
)

// What a follower does with a gated connection.
const (
	FollowerClose = "close"
	FollowerProxy = "proxy"
)

// Defaults of the gate.
const (
	// DefaultHold covers a graceful handover many times over, and is short enough that
	// clients connecting while a crashed leader's lease runs out fail fast.
	DefaultHold = 2 * time.Second
	// lookupTimeout bounds the store request that finds the leader's layer-4 address.
	lookupTimeout = 2 * time.Second
)

// Gate is the layer-4 `leader_gate` handler: it admits a connection only while this
// instance leads the election, by the same test as the HTTP `leader_gate`, and elsewhere
// closes it or hands it to the leader.
//
// An admitted connection belongs to the term that admitted it: it counts as in flight (a
// handover waits for it, as for a gated HTTP request) and is cut when that term stops
// admitting: when it begins a handover (after Drain), when its release begins, when its
// lease or heartbeat deadline passes unrenewed, or when the key is deleted or taken over.
// The deadlines are the leader's own, on its own clock, which end before any successor can
// take the key; and from the deadline on, not a byte more is relayed either way, even
// before the connection is closed.
//
// On a follower, `follower close` (the default) closes the connection at once, and
// `follower proxy` sets `{l4.leader.address}` to the leader's layer-4 address (its
// Advertise, which each instance announces with its candidacy) and passes the connection
// on, for a `proxy` handler to dial. While no leader is known or the leader is handing
// over, a follower waits up to Hold for the next one (and admits the connection itself if
// it won meanwhile).
//
// The gate sets these placeholders (the `leader` matcher sets all but the last):
//
// Placeholder | Description
// ------------|-------------
// `{l4.leader.election}` | The election's name
// `{l4.leader.is_leader}` | `true` if this instance admitted the connection as leader, else `false`
// `{l4.leader.self}` | This instance's id
// `{l4.leader.id}` | The current leader's instance id; empty if none is known
// `{l4.leader.token}` | The fencing token of the current term; empty if none is known
// `{l4.leader.address}` | The leader's layer-4 address (on a follower in proxy mode); empty if unknown
// `{l4.leader.dial}` | Where to dial for this connection: Upstream on the leader, the leader's address on a follower
type Gate struct {
	// Election is the name of the election whose leader may take the connections.
	// Default: `default`.
	Election string `json:"election,omitempty"`

	// Follower is what an instance that does not lead does with a connection: `close`
	// closes it; `proxy` passes it on with `{l4.leader.address}` set to the leader's
	// layer-4 address, and closes it when that is unknown. Default: `close`.
	Follower string `json:"follower,omitempty"`

	// Advertise is the address (host:port) at which peers reach this instance's layer-4
	// server, announced in the election's candidate registry for the followers' `proxy`
	// mode. Placeholders are expanded. Default: none; followers in proxy mode then cannot
	// reach this instance when it leads.
	Advertise string `json:"advertise,omitempty"`

	// Upstream is the local service (host:port) that `{l4.leader.dial}` names on the
	// leader, so that one route with `proxy {l4.leader.dial}` serves on the leader and
	// hands over on a follower. Default: none (`{l4.leader.dial}` is then empty on the
	// leader).
	Upstream string `json:"upstream,omitempty"`

	// Drain is how long an admitted connection may go on once its term begins a planned
	// handover (shutdown, resign, transfer), so that it can finish on its own; it is cut
	// after that. The handover waits for it, up to the leader app's drain_timeout, after
	// which the term's release begins and cuts it anyway. Default: 0 (cut at once).
	Drain caddy.Duration `json:"drain,omitempty"`

	// Hold is how long a connection on a follower waits for a leader while none is known
	// or the leader is handing over, before the follower action applies; 0 does not
	// wait. Default: 2s.
	Hold *caddy.Duration `json:"hold,omitempty"`

	election *elector.Election
	guard    *termconn.Guard
	leaders  *leaderAddresses
	logger   *zap.Logger
	// warnedNoUpstream is set once noUpstream has warned; shared by copies of the gate.
	warnedNoUpstream *atomic.Bool
}

// CaddyModule returns the Caddy module information.
func (*Gate) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "layer4.handlers.leader_gate",
		New: func() caddy.Module { return new(Gate) },
	}
}

// Provision implements caddy.Provisioner.
func (g *Gate) Provision(ctx caddy.Context) error {
	g.logger = ctx.Logger()
	g.warnedNoUpstream = new(atomic.Bool)
	repl := caddy.NewReplacer()
	g.Advertise = repl.ReplaceKnown(g.Advertise, "")
	if g.Follower == "" {
		g.Follower = FollowerClose
	}
	if g.Hold == nil {
		hold := caddy.Duration(DefaultHold)
		g.Hold = &hold
	}
	if err := g.check(); err != nil {
		return err
	}
	e, err := caddyleader.JoinElection(ctx, "layer4 leader_gate", &g.Election)
	if err != nil {
		return err
	}
	g.election, g.guard, g.leaders = e, termconn.For(e), leadersOf(e)
	if g.Advertise != "" {
		e.SetLayer4Address(g.Advertise)
	}
	return nil
}

// check names the first bad field.
func (g *Gate) check() error {
	switch g.Follower {
	case FollowerClose, FollowerProxy:
	default:
		return fmt.Errorf("layer4 leader_gate: follower: %q is not one of close, proxy", g.Follower)
	}
	for field, addr := range map[string]string{"advertise": g.Advertise, "upstream": g.Upstream} {
		if err := checkHostPort(addr); err != nil {
			return fmt.Errorf("layer4 leader_gate: %s: %v", field, err)
		}
	}
	if err := g.checkProxy(); err != nil {
		return fmt.Errorf("layer4 leader_gate: %v", err)
	}
	if g.Drain < 0 {
		return fmt.Errorf("layer4 leader_gate: drain: %s is negative", time.Duration(g.Drain))
	}
	if *g.Hold < 0 {
		return fmt.Errorf("layer4 leader_gate: hold: %s is negative", time.Duration(*g.Hold))
	}
	return nil
}

// checkProxy names what `follower proxy` needs and lacks: advertise, or every follower
// would find no address to pass connections to and close each one, logging nothing; and
// upstream, or the leader's {l4.leader.dial} would be empty and its proxy dial nothing.
func (g *Gate) checkProxy() error {
	if g.Follower != FollowerProxy {
		return nil
	}
	switch {
	case g.Advertise == "":
		return errors.New("follower proxy needs advertise <host:port>, the address at which peers reach this instance's layer-4 server: without it no follower learns where the leader is, and each closes every connection")
	case g.Upstream == "":
		return errors.New("follower proxy needs upstream <host:port>, the local service that {l4.leader.dial} names on the leader: without it the leader's proxy {l4.leader.dial} dials nothing")
	}
	return nil
}

// noUpstream answers {l4.leader.dial} on the leader of a gate without upstream: empty, and
// a warning the first time, since a `proxy {l4.leader.dial}` after this gate dials nothing.
// The Caddyfile cannot see that proxy when it parses the gate, so this is said when it asks.
func (g *Gate) noUpstream(key string) (any, bool) {
	if key != phDial {
		return nil, false
	}
	if g.warnedNoUpstream.CompareAndSwap(false, true) {
		g.logger.Warn("{l4.leader.dial} is empty on the leader: this leader_gate has no upstream, so a proxy to {l4.leader.dial} dials nothing; set upstream <host:port> to the local service",
			zap.String("election", g.Election))
	}
	return "", true
}

// checkHostPort checks an optional host:port; one with placeholders is checked when used.
func checkHostPort(addr string) error {
	if addr == "" || caddy.NewReplacer().ReplaceKnown(addr, "") != addr {
		return nil
	}
	if _, port, err := net.SplitHostPort(addr); err != nil || port == "" {
		return fmt.Errorf("%q is not a host:port", addr)
	}
	return nil
}

// Handle implements layer4.NextHandler.
func (g *Gate) Handle(cx *layer4.Connection, next layer4.Handler) error {
	c, t := g.guard.Admit(cx.Conn, termconn.Options{Kind: "layer4", Drain: time.Duration(g.Drain)})
	if c == nil && *g.Hold > 0 && !t.Settled(g.election.Now()) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(*g.Hold))
		g.election.WaitSettled(ctx)
		cancel()
		c, t = g.guard.Admit(cx.Conn, termconn.Options{Kind: "layer4", Drain: time.Duration(g.Drain)})
	}
	repl := cx.Replacer()
	if c != nil {
		defer c.Done()
		cx.Conn = c
		setPlaceholders(repl, t, true, g.Advertise)
		if g.Upstream != "" {
			repl.Set(phDial, g.Upstream)
		} else {
			repl.Map(g.noUpstream)
		}
		return next.Handle(cx)
	}
	if g.Follower == FollowerClose || t.Holds() || !t.LeaderKnown() || t.Leader.HandingOver {
		setPlaceholders(repl, t, false, "")
		return cx.Close()
	}
	addr, err := g.leaders.address(t)
	if err != nil || addr == "" {
		if c := g.logger.Check(zap.DebugLevel, "no layer-4 address for the leader: closing the connection"); c != nil {
			c.Write(zap.String("election", g.Election), zap.String("leader", t.Leader.ID), zap.Error(err))
		}
		setPlaceholders(repl, t, false, "")
		return cx.Close()
	}
	setPlaceholders(repl, t, false, addr)
	repl.Set(phDial, addr)
	// Handed to the leader of t, and cut when this instance sees t end: a client of a
	// leader that froze or was cut off reconnects and reaches the successor.
	fc := g.guard.Follow(cx.Conn, t, termconn.Options{Kind: "layer4"})
	defer fc.Done()
	cx.Conn = fc
	return next.Handle(cx)
}

// Interface guards
var (
	_ caddy.Provisioner  = (*Gate)(nil)
	_ layer4.NextHandler = (*Gate)(nil)
)
