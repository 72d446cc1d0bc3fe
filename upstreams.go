package caddyleader

import (
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"

	"github.com/caddyleader/caddy-leader/elector"
)

func init() {
	caddy.RegisterModule(LeaderUpstreams{})
}

// LeaderUpstreams is the `leader` dynamic upstream source of reverse_proxy: it answers the
// current leader's advertise address (host:port), so that a follower proxies to the
// leader. It answers no upstream, which makes reverse_proxy retry within its
// lb_try_duration and then answer 503, while no leader is known, while the leader is
// handing over, and when the leader's record names this instance while this process does
// not hold the key (a previous process of this instance, killed and restarted before its
// lease ran out), or names this instance's advertise address: a proxy never sends a
// request to itself. (No leader for a moment is routine, a handover or a shard's move:
// an error would make reverse_proxy log an ERROR and fall back to static upstreams, which
// a proxy to the leader has none of.)
//
// It also carries the loop guard: it marks every request it routes with the
// Caddy-Leader-Forwarded-By header naming this instance and authenticated for the
// leader's term, and it refuses a request that arrived with that header (from a peer or
// from a client), whoever it names, so that a request travels one hop at most. On the
// leader, `leader_gate` removes the mark before the application sees it; a route that
// uses the `leader` matcher instead should remove it with `request_header`.
type LeaderUpstreams struct {
	// Election is the name of the election whose leader receives the requests.
	// Default: `default`.
	Election string `json:"election,omitempty"`

	// ShardSet names a shard set of the leader app: each request then goes to the owner
	// of its key's shard (see ShardSet), so that Caddy as the fleet's load balancer sends
	// every key straight to the instance that owns it. It needs ShardKey, and excludes
	// Election. Default: none.
	ShardSet string `json:"shard_set,omitempty"`

	// ShardKey is the request's key in ShardSet, with placeholders, as leader_gate's
	// shard_key. Default: none.
	ShardKey string `json:"shard_key,omitempty"`

	shards   []*LeaderUpstreams // one per shard, with a shard set
	key      shardKey
	election *elector.Election
	self     string
	selfDial string // host:port of this instance's advertise URL
	dial     *atomic.Pointer[termDial]
	logger   *zap.Logger
}

func newLeaderUpstreams(name string, e *elector.Election, self, selfDial string) *LeaderUpstreams {
	return &LeaderUpstreams{Election: name, election: e, self: self, selfDial: selfDial, dial: new(atomic.Pointer[termDial]), logger: zap.NewNop()}
}

// termDial caches the dial address of one Term's leader.
type termDial struct {
	term *elector.Term
	dial string
	err  error
}

// CaddyModule returns the Caddy module information.
func (LeaderUpstreams) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.upstreams.leader",
		New: func() caddy.Module { return new(LeaderUpstreams) },
	}
}

// Provision implements caddy.Provisioner.
func (u *LeaderUpstreams) Provision(ctx caddy.Context) error {
	if u.election != nil {
		return nil // set up by the gate that embeds it
	}
	if u.ShardSet != "" || u.ShardKey != "" {
		return u.provisionShards(ctx)
	}
	app, e, err := joinElection(ctx, "leader upstreams", &u.Election)
	if err != nil {
		return err
	}
	if app.Advertise == "" {
		return errors.New("leader upstreams: proxying to the leader needs the leader app's advertise URL: set `advertise` in the global leader option")
	}
	selfDial, err := leaderDial(app.Advertise)
	if err != nil {
		return fmt.Errorf("leader upstreams: advertise: %v", err)
	}
	*u = *newLeaderUpstreams(u.Election, e, app.InstanceID, selfDial)
	u.logger = ctx.Logger()
	return nil
}

// provisionShards sets up a source that follows a shard set.
func (u *LeaderUpstreams) provisionShards(ctx caddy.Context) error {
	app, set, key, err := joinShardSet(ctx, "leader upstreams", u.Election, u.ShardSet, u.ShardKey)
	if err != nil {
		return err
	}
	if app.Advertise == "" {
		return errors.New("leader upstreams: proxying to a shard's owner needs the leader app's advertise URL: set `advertise` in the global leader option")
	}
	selfDial, err := leaderDial(app.Advertise)
	if err != nil {
		return fmt.Errorf("leader upstreams: advertise: %v", err)
	}
	u.key = key
	u.shards = make([]*LeaderUpstreams, len(set.elections))
	for s, e := range set.elections {
		u.shards[s] = newLeaderUpstreams(e.Name(), e, app.InstanceID, selfDial)
		u.shards[s].logger = ctx.Logger()
	}
	return nil
}

// errAlreadyForwarded refuses a second hop.
var errAlreadyForwarded = errors.New("leader upstreams: the request was already forwarded by an instance; not forwarding it again")

// markVar is the request variable in which GetUpstreams keeps the mark it set, to tell a
// retry of its own forward (reverse_proxy keeps the headers of the first try) from a
// request that arrived marked.
const markVar = "leader_upstreams_mark"

// GetUpstreams implements reverseproxy.UpstreamSource.
func (u *LeaderUpstreams) GetUpstreams(r *http.Request) ([]*reverseproxy.Upstream, error) {
	if u.shards != nil {
		return u.shards[u.key.requestShard(r, len(u.shards))].GetUpstreams(r)
	}
	if v := r.Header.Get(ForwardedByHeader); v != "" && v != caddyhttp.GetVar(r.Context(), markVar) {
		return nil, errAlreadyForwarded
	}
	t := u.election.Term()
	if t.Holds() || !t.Settled(time.Now()) || heldElsewhereAsSelf(t, u.selfDial) {
		if c := u.logger.Check(zap.DebugLevel, "no leader to forward to"); c != nil {
			c.Write(zap.String("election", u.Election))
		}
		return nil, nil
	}
	d := u.dial.Load()
	if d == nil || d.term != t {
		dial, err := leaderDial(t.Leader.URL)
		d = &termDial{term: t, dial: dial, err: err}
		u.dial.Store(d)
	}
	if d.err != nil {
		return nil, d.err
	}
	// The mark authenticates this hop to the leader of t (see ForwardedByHeader). On the
	// first try r's headers are the ones reverse_proxy copies for every later try, so
	// the mark goes upstream on every try, even where header operations apply.
	mark := u.self
	if t.Leader.MarkKey != "" {
		// r is reverse_proxy's copy of the request, whose RequestURI is the incoming
		// one: what goes on the wire is its URL's.
		mark = signMark(u.self, t.Token, t.Leader.MarkKey, time.Now(), r.Method, r.URL.RequestURI())
	}
	r.Header.Set(ForwardedByHeader, mark)
	caddyhttp.SetVar(r.Context(), markVar, mark)
	return []*reverseproxy.Upstream{{Dial: d.dial}}, nil
}

// routeVar is the request variable in which a gate that routes by key keeps the route of
// the request it forwards, for routedUpstreams.
const routeVar = "leader_gate_route"

// routedUpstreams is the upstream source of a gate that routes by key: the leader of the
// request's shard, as the gate chose it.
type routedUpstreams struct{}

// GetUpstreams implements reverseproxy.UpstreamSource.
func (routedUpstreams) GetUpstreams(r *http.Request) ([]*reverseproxy.Upstream, error) {
	rt, ok := caddyhttp.GetVar(r.Context(), routeVar).(*gateRoute)
	if !ok {
		return nil, errors.New("leader_gate: a forwarded request lost its shard")
	}
	return rt.upstreams.GetUpstreams(r)
}

// Interface guards
var (
	_ caddy.Provisioner           = (*LeaderUpstreams)(nil)
	_ reverseproxy.UpstreamSource = (*LeaderUpstreams)(nil)
	_ reverseproxy.UpstreamSource = routedUpstreams{}
)
