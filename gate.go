package caddyleader

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/caddyleader/caddy-leader/elector"
)

// What a follower does with a gated request.
const (
	FollowerReject   = "reject"
	FollowerRedirect = "redirect"
	FollowerForward  = "forward"
)

// Defaults of the gate.
const (
	DefaultRetryAfter = time.Second
	// DefaultHold covers a graceful handover (tens of milliseconds) many times over, yet
	// is short enough that requests arriving while a crashed leader's lease runs out
	// (up to a ttl) fail fast with Retry-After instead of piling up.
	DefaultHold = 2 * time.Second
)

// Gate is the `leader_gate` handler: it lets a request through only while this instance
// leads the election, and otherwise rejects it, redirects it to the leader, or forwards it
// to the leader.
//
// "Leads" is decided afresh for every request: this instance must hold the election key and
// its lease deadline (measured on the local clocks from before its last successful renewal)
// must still be ahead. A process that wakes up from a pause longer than its lease therefore
// rejects the very first request it sees. Admitted requests are counted, and a leader that
// hands over (shutdown, resign, reload without the election) announces it, waits for them
// to finish, and only then releases the key.
//
// While no leader is known, or the leader is handing over, a gated request on a follower
// waits up to Hold for the next leader, and is then served (if this instance won),
// forwarded, redirected or rejected.
//
// A rejection sets Retry-After and returns an HTTP error, so `handle_errors` can shape the
// response. A redirect sends the original request URI to the leader's advertise URL. A
// forward proxies the request, with the method and URI the client sent (before any
// rewrite), to the leader with Caddy's reverse_proxy (streamed bodies, upgrades such as
// websockets, trailers, X-Forwarded-* headers); it is retried within Hold only when that
// cannot send it twice (the connection failed, or the method is GET). When no leader is
// known after Hold, redirect and forward answer 503 with Retry-After. A request that
// arrived forwarded is never forwarded again, and none is forwarded to this instance's
// own address (see ForwardedByHeader and heldElsewhereAsSelf).
//
// The gate sets these placeholders (the matcher sets them too):
//
// Placeholder | Description
// ------------|-------------
// `{http.leader.election}` | The election's name
// `{http.leader.is_leader}` | `true` if this instance admitted the request as leader, else `false`
// `{http.leader.self}` | This instance's id
// `{http.leader.id}` | The current leader's instance id; empty if none is known
// `{http.leader.url}` | The current leader's advertise URL; empty if none is known
// `{http.leader.token}` | The fencing token (etcd create revision) of the current term; empty if none is known
// `{http.leader.shard}` | With `shard_set`: the number of the request's shard (its election is `<set>.<shard>`, and the placeholders above are that shard's: `{http.leader.id}` is its owner, `{http.leader.token}` its term's token); empty otherwise
// `{http.leader.admitted_at}` | With `admission_times`: when this instance admitted the request (RFC 3339, UTC, its wall clock at the admission check); empty otherwise
// `{http.leader.deadline}` | With `admission_times`: until when the admitting term could admit it if nothing changed (its lease, heartbeat or failsafe deadline, as `admitted_at`), so a backend that receives the request later knows the term may have ended first; empty otherwise
type Gate struct {
	// Election is the name of the election whose leader may serve the gated requests.
	// Default: `default`.
	Election string `json:"election,omitempty"`

	// Follower is what an instance that does not lead does with a gated request:
	// `reject` answers with StatusCode and Retry-After; `redirect` sends the client to
	// the leader's advertise URL; `forward` proxies the request to the leader. Redirect
	// and forward need `advertise` in the leader app. Default: `reject`.
	Follower string `json:"follower,omitempty"`

	// StatusCode is the response status on a follower: for `reject` a 4xx or 5xx code
	// (default 503), for `redirect` 307 or 308, the codes that keep the method and body
	// (default 307). Not used by `forward`.
	StatusCode int `json:"status_code,omitempty"`

	// RetryAfter is the value of the Retry-After header sent with rejections, rounded up
	// to whole seconds. Default: 1s.
	RetryAfter caddy.Duration `json:"retry_after,omitempty"`

	// Hold is how long a gated request on a follower waits for a leader while none is
	// known or the leader is handing over, before the follower action applies; 0 does
	// not wait. The wait ends early when the client goes away. Default: 2s.
	Hold *caddy.Duration `json:"hold,omitempty"`

	// CancelOnLoss cancels the context of every admitted request the moment this
	// instance's term ends (its lease deadline passes, or it learns it was deposed), so
	// that upstream calls made for it are aborted. Off by default: cancelling cannot
	// recall a request that already reached the backend (the fencing token protects
	// against those), it turns an operation that might have completed into an ambiguous
	// failure for the client, and it costs a cancellable context per request. Turn it on
	// for long-lived leader-only work: websockets, long polls, streams.
	CancelOnLoss bool `json:"cancel_on_loss,omitempty"`

	// AdmissionTimes sets `{http.leader.admitted_at}` and `{http.leader.deadline}` on every
	// request this gate admits: when it was admitted (the admission check's own clock read)
	// and until when the admitting term could admit it if nothing changed, so that a
	// backend can tell a late arrival from a late admission and refuse work that arrives
	// after the term may have ended. It costs each admitted request one small allocation,
	// so it is off by default; without it both placeholders are empty. Default: off.
	AdmissionTimes bool `json:"admission_times,omitempty"`

	// TransportRaw configures how `forward` reaches the leader, exactly like
	// reverse_proxy's transport. Default: HTTP, with TLS when this instance's advertise
	// URL is https (the fleet is expected to advertise one scheme).
	TransportRaw json.RawMessage `json:"transport,omitempty" caddy:"namespace=http.reverse_proxy.transport inline_key=protocol"`

	// ShardSet names a shard set of the leader app (see ShardSet): the gate then admits a
	// request on the owner of its key's shard, under that shard's term, instead of on the
	// leader of Election, and forwards, redirects or rejects it elsewhere as for an
	// election. It needs ShardKey, and excludes Election. Default: none.
	ShardSet string `json:"shard_set,omitempty"`

	// ShardKey is the request's key in ShardSet, with placeholders: a path segment
	// (`{http.request.uri.path.1}`), a header (`{http.request.header.X-Tenant}`), a query
	// value (`{http.request.uri.query.room}`), or any text built from them. Requests
	// without the key share the shard of the empty key. Default: none.
	ShardKey string `json:"shard_key,omitempty"`

	route     *gateRoute   // the election's, or nil with a shard set
	routes    []*gateRoute // one per shard, with a shard set
	key       shardKey
	hold      time.Duration
	forwarder *reverseproxy.Handler
	selfDial  string // host:port of this instance's advertise URL; empty without one
	counts    gateCounters
	// retryAfter is the Retry-After header's value.
	retryAfter string
}

// gateRoute is what a gate needs of one election it admits requests for: the election,
// the placeholders of its terms, the errors that name it and, for forward, the upstreams
// that reach its leader. A gate has one, or one per shard of its set.
type gateRoute struct {
	name         string
	election     *elector.Election
	placeholders *placeholderCache
	upstreams    *LeaderUpstreams // with forward
	errNotLeader error
	errNoLeader  error
	errForwarded error
}

func newGateRoute(name string, e *elector.Election, shard string) *gateRoute {
	return &gateRoute{
		name: name, election: e, placeholders: &placeholderCache{shard: shard},
		errNotLeader: fmt.Errorf("this instance does not lead election %q", name),
		errNoLeader:  fmt.Errorf("no leader of election %q is known", name),
		errForwarded: fmt.Errorf("a request forwarded as to the leader of election %q reached an instance that does not lead it", name),
	}
}

// CaddyModule returns the Caddy module information.
func (Gate) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.leader_gate",
		New: func() caddy.Module { return new(Gate) },
	}
}

// Provision implements caddy.Provisioner.
func (g *Gate) Provision(ctx caddy.Context) error {
	g.setDefaults()
	if err := g.check(); err != nil {
		return err
	}
	app, err := appFrom(ctx, "leader_gate")
	if err != nil {
		return err
	}
	if g.Follower != FollowerReject && app.Advertise == "" {
		return fmt.Errorf("leader_gate: follower %s needs the leader app's advertise URL: set `advertise` in the global leader option", g.Follower)
	}
	if g.ShardSet != "" {
		set, err := app.shardSet(g.ShardSet)
		if err != nil {
			return fmt.Errorf("leader_gate: shard_set: %v", err)
		}
		g.bindShards(set)
	} else {
		if err := app.checkNotShard(g.Election); err != nil {
			return fmt.Errorf("leader_gate: election: %v", err)
		}
		g.bind(app.election(g.Election))
	}
	g.selfDial, _ = leaderDial(app.Advertise)
	if g.Follower == FollowerForward {
		return g.provisionForwarder(ctx, app)
	}
	return nil
}

func (g *Gate) setDefaults() {
	if g.Election == "" && g.ShardSet == "" {
		g.Election = DefaultElection
	}
	if g.Follower == "" {
		g.Follower = FollowerReject
	}
	if g.StatusCode == 0 {
		switch g.Follower {
		case FollowerRedirect:
			g.StatusCode = http.StatusTemporaryRedirect
		default:
			g.StatusCode = http.StatusServiceUnavailable
		}
	}
	if g.RetryAfter == 0 {
		g.RetryAfter = caddy.Duration(DefaultRetryAfter)
	}
	if g.Hold == nil {
		hold := caddy.Duration(DefaultHold)
		g.Hold = &hold
	}
}

// check names the first bad field.
func (g *Gate) check() error {
	if err := g.checkShard(); err != nil {
		return fmt.Errorf("leader_gate: %v", err)
	}
	if err := checkElectionName(g.Election); g.ShardSet == "" && err != nil {
		return fmt.Errorf("leader_gate: election: %v", err)
	}
	if err := checkFollower(g.Follower, g.StatusCode); err != nil {
		return fmt.Errorf("leader_gate: %v", err)
	}
	if g.RetryAfter < 0 {
		return fmt.Errorf("leader_gate: retry_after: %s is negative", time.Duration(g.RetryAfter))
	}
	if *g.Hold < 0 {
		return fmt.Errorf("leader_gate: hold: %s is negative", time.Duration(*g.Hold))
	}
	if g.TransportRaw != nil && g.Follower != FollowerForward {
		return fmt.Errorf("leader_gate: transport: only `follower forward` uses a transport, not %q", g.Follower)
	}
	return nil
}

// checkFollower checks a follower mode and its status code.
func checkFollower(follower string, status int) error {
	switch follower {
	case FollowerReject:
		if status < 400 || status > 599 {
			return fmt.Errorf("status_code: %d is not a 4xx or 5xx status, which `follower reject` needs", status)
		}
	case FollowerRedirect:
		if status != http.StatusTemporaryRedirect && status != http.StatusPermanentRedirect {
			return fmt.Errorf("status_code: %d is not 307 or 308; `follower redirect` needs a status that keeps the method and body", status)
		}
	case FollowerForward:
		if status != 0 && status != http.StatusServiceUnavailable {
			return fmt.Errorf("status_code: `follower forward` takes no status (it answers 503 only when no leader is known)")
		}
	default:
		return fmt.Errorf("follower: %q is not one of reject, redirect, forward", follower)
	}
	return nil
}

// checkShard checks the shard options: a set and its key come together, without an
// election.
func (g *Gate) checkShard() error {
	return checkShardRoute(g.Election, g.ShardSet, g.ShardKey)
}

// bind connects the checked gate to its election and prepares what requests reuse.
func (g *Gate) bind(e *elector.Election) {
	g.route = newGateRoute(g.Election, e, "")
	g.prepare(g.Election)
}

// bindShards connects the checked gate to every shard of set.
func (g *Gate) bindShards(set *shardSet) {
	g.routes = make([]*gateRoute, len(set.elections))
	for s, e := range set.elections {
		g.routes[s] = newGateRoute(e.Name(), e, strconv.Itoa(s))
	}
	g.key, _ = parseShardKey(g.ShardKey) // checked
	g.prepare(set.name)
}

// prepare sets up what every request reuses; label names the gate's election or set in
// its metrics.
func (g *Gate) prepare(label string) {
	g.counts = newGateCounters(label)
	g.hold = time.Duration(*g.Hold)
	secs := (time.Duration(g.RetryAfter) + time.Second - 1) / time.Second
	g.retryAfter = strconv.FormatInt(int64(secs), 10)
}

// routeOf is the route of request r: the gate's election, or its key's shard.
func (g *Gate) routeOf(r *http.Request, repl *caddy.Replacer) *gateRoute {
	if g.routes == nil {
		return g.route
	}
	return g.routes[g.key.shard(r, repl, len(g.routes))]
}

// provisionForwarder sets up the reverse proxy that `forward` hands requests to.
func (g *Gate) provisionForwarder(ctx caddy.Context, app *App) error {
	transport := g.TransportRaw
	if transport == nil && strings.HasPrefix(app.Advertise, "https://") {
		transport = json.RawMessage(`{"protocol":"http","tls":{}}`)
	}
	var upstreams reverseproxy.UpstreamSource
	for _, rt := range append(g.routes, g.route) {
		if rt != nil {
			rt.upstreams = newLeaderUpstreams(rt.name, rt.election, app.InstanceID, g.selfDial)
			upstreams = rt.upstreams
		}
	}
	if g.routes != nil {
		upstreams = routedUpstreams{}
	}
	rp := &reverseproxy.Handler{
		TransportRaw:     transport,
		DynamicUpstreams: upstreams,
		LoadBalancing: &reverseproxy.LoadBalancing{
			// Short tries: Caddy retries failed connections (and GETs) and asks for the
			// leader anew each time; between such rounds the gate's own hold loop looks
			// whether this instance has won meanwhile.
			TryDuration: caddy.Duration(min(max(g.hold, 100*time.Millisecond), 250*time.Millisecond)),
			TryInterval: caddy.Duration(50 * time.Millisecond),
		},
		// No header operations: they would copy the request's headers again after
		// the leader upstreams set the mark for the leader they chose.
	}
	if err := rp.Provision(ctx); err != nil {
		return fmt.Errorf("leader_gate: setting up forwarding: %v", err)
	}
	g.forwarder = rp
	return nil
}

// Cleanup implements caddy.CleanerUpper.
func (g *Gate) Cleanup() error {
	if g.forwarder != nil {
		return g.forwarder.Cleanup()
	}
	return nil
}

// ServeHTTP implements caddyhttp.MiddlewareHandler.
func (g *Gate) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	// Only a peer can mark a request as forwarded here: a mark that does not verify is
	// dropped, and the request is admitted as any other would be. The application never
	// sees a mark. But a request that came with a mark, genuine or not, is never
	// forwarded again nor held here: one hop is the most a request travels, whatever the
	// instances make of each other's marks (see ForwardedByHeader).
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	rt := g.routeOf(r, repl)
	token, forwarded, hopped := g.takeMark(r, rt)
	var t *elector.Term
	var at time.Time
	var admitted bool
	if forwarded {
		t, at, admitted = rt.election.EnterForwardedAt(token)
	} else {
		t, at, admitted = rt.election.EnterAt()
	}
	if !admitted && !hopped && g.hold > 0 && !g.settled(t) {
		start := time.Now()
		t, at, admitted = g.holdForLeader(r.Context(), rt)
		g.counts.held.Observe(time.Since(start).Seconds())
	}
	if admitted {
		return g.serveHere(w, r, next, rt, repl, t, at, false)
	}
	rt.placeholders.set(repl, t, false)
	if hopped {
		// The forwarding peer holds the request and may send it to the new leader; it
		// asks this instance again soon unless this instance knows it will not lead soon.
		if t.Reason == elector.ReasonPreviousProcess || t.LeaderKnown() && !t.Holds() {
			w.Header().Set(NotLeaderHeader, notLeaderElsewhere)
		} else {
			w.Header().Set(NotLeaderHeader, rt.name)
		}
		return g.reject(w, http.StatusServiceUnavailable, rt.errForwarded)
	}
	leaderElsewhere := !t.Holds() && g.settled(t) && t.Leader.URL != ""
	switch {
	case g.Follower == FollowerReject:
		return g.reject(w, g.StatusCode, rt.errNotLeader)
	case !leaderElsewhere:
		return g.reject(w, http.StatusServiceUnavailable, rt.errNoLeader)
	case g.Follower == FollowerRedirect:
		g.counts.redirected.Inc()
		w.Header().Set("Location", strings.TrimSuffix(t.Leader.URL, "/")+originalURI(r))
		w.WriteHeader(g.StatusCode)
		return nil
	default:
		g.counts.forwarded.Inc()
		return g.forward(w, r, next, rt)
	}
}

// serveHere serves a request admitted here under term t of rt's election at at, with that
// admission's placeholders; later says an earlier decision set some already (see
// setAdmitted).
func (g *Gate) serveHere(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, rt *gateRoute, repl *caddy.Replacer, t *elector.Term, at time.Time, later bool) error {
	rt.placeholders.setAdmitted(repl, t, at, g.AdmissionTimes, later)
	g.counts.served.Inc()
	return g.serveAdmitted(w, r, next, rt, t)
}

// serveAdmitted runs a request admitted under term t of rt's election.
func (g *Gate) serveAdmitted(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, rt *gateRoute, t *elector.Term) error {
	if upgrading(r) {
		return g.serveUpgrade(w, r, next, rt.election, t)
	}
	if g.CancelOnLoss {
		return g.serveCancellable(w, r, next, rt.election, t)
	}
	return g.serve(w, r, next, rt.election)
}

// serve runs an admitted request and ends its count. (A function of its own, so that its
// one defer is open-coded: this is the path every gated request on the leader takes.)
func (g *Gate) serve(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, e *elector.Election) error {
	defer e.Exit()
	return next.ServeHTTP(w, r)
}

// serveCancellable is serve with the request's context cancelled when term t ends.
func (g *Gate) serveCancellable(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, e *elector.Election, t *elector.Term) error {
	defer e.Exit()
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	defer context.AfterFunc(t.Context(), cancel)()
	return next.ServeHTTP(w, r.WithContext(ctx))
}

// holdForLeader waits (up to Hold, or until the client leaves) for a settled term, then
// tries to enter again: this instance may be the new leader.
func (g *Gate) holdForLeader(ctx context.Context, rt *gateRoute) (*elector.Term, time.Time, bool) {
	ctx, cancel := context.WithTimeout(ctx, g.hold)
	defer cancel()
	g.waitSettled(ctx, rt.election)
	return rt.election.EnterAt()
}

// settled is Term.Settled, except that a leader record of this very instance which this
// process does not hold (see heldElsewhereAsSelf) counts as no leader: requests wait for
// the next term rather than go to this instance's own address.
func (g *Gate) settled(t *elector.Term) bool {
	return t.Settled(time.Now()) && !heldElsewhereAsSelf(t, g.selfDial)
}

// waitSettled is Election.WaitSettled with settled's view of a term: it returns the first
// term that settles, or the newest one and false once ctx ends.
func (g *Gate) waitSettled(ctx context.Context, e *elector.Election) (*elector.Term, bool) {
	for {
		changed := e.Changed()
		t := e.Term()
		if g.settled(t) {
			return t, true
		}
		select {
		case <-ctx.Done():
			return e.Term(), false
		case <-changed:
		}
	}
}

// heldElsewhereAsSelf reports whether t's leader record names this instance, by its id
// or by its address (selfDial, the host:port of its advertise URL), while this process
// does not hold the key. That is a previous process of this instance whose lease has not
// run out yet (it was killed and restarted at once), or a second instance configured with
// this one's id or address. Either way the address in the record leads back here, and a
// request forwarded there would come back to be forwarded again.
func heldElsewhereAsSelf(t *elector.Term, selfDial string) bool {
	if t.Holds() || !t.LeaderKnown() {
		return false
	}
	if t.Leader.ID == t.Self {
		return true
	}
	dial, err := leaderDial(t.Leader.URL)
	return err == nil && selfDial != "" && strings.EqualFold(dial, selfDial)
}

func (g *Gate) reject(w http.ResponseWriter, status int, err error) error {
	g.counts.rejected.Inc()
	w.Header().Set("Retry-After", g.retryAfter)
	return caddyhttp.Error(status, err)
}

// originalURI is the request URI as the client sent it, before any rewrite: the leader
// applies the same rewrites itself.
func originalURI(r *http.Request) string { return original(r).RequestURI }

// original is the request as the client sent it, before any rewrite (handle_path,
// uri strip_prefix, rewrite, method), as Caddy's server kept it: its method, RequestURI
// and URL. It is r itself outside a Caddy server.
func original(r *http.Request) *http.Request {
	if orig, ok := r.Context().Value(caddyhttp.OriginalRequestCtxKey).(http.Request); ok && orig.URL != nil {
		return &orig
	}
	return r
}

// asSent is r with the method and URI the client sent, for forwarding: the leader routes
// the request through its own rewrites, as it would have had the client sent it there,
// and not into whatever route the rewritten path would reach.
func asSent(r *http.Request) *http.Request {
	orig := original(r)
	if orig == r {
		return r
	}
	out := new(http.Request)
	*out = *r
	u := *orig.URL
	out.URL, out.Method, out.RequestURI = &u, orig.Method, orig.RequestURI
	return out
}

// leaderDial is the host:port a leader's advertise URL is reached at.
func leaderDial(advertise string) (string, error) {
	u, err := url.Parse(advertise)
	if err != nil || u.Host == "" {
		return "", fmt.Errorf("leader advertise URL %q has no host", advertise)
	}
	if u.Port() != "" {
		return u.Host, nil
	}
	port := "80"
	if u.Scheme == "https" {
		port = "443"
	}
	return u.Host + ":" + port, nil
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Gate)(nil)
	_ caddy.CleanerUpper          = (*Gate)(nil)
	_ caddyhttp.MiddlewareHandler = (*Gate)(nil)
)
