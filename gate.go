package caddyleader

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddyleader/caddy-leader/elector"
)

// What a follower does with a gated request.
const (
	FollowerReject   = "reject"
	FollowerRedirect = "redirect"
)

// DefaultRetryAfter is the Retry-After a follower sends with a rejection.
const DefaultRetryAfter = time.Second

// Gate is the `leader_gate` handler: it lets a request through only while this instance
// leads the election, and otherwise rejects it or redirects it to the leader.
//
// "Leads" is decided afresh for every request: this instance must hold the election key and
// its lease deadline (measured on the local clocks from before its last successful renewal)
// must still be ahead. A process that wakes up from a pause longer than its lease therefore
// rejects the very first request it sees. Admitted requests are counted, and a leader that
// hands over (shutdown, resign, reload without the election) waits for them to finish
// before releasing the key.
//
// A rejection sets Retry-After and returns an HTTP error, so `handle_errors` can shape the
// response. A redirect sends the original request URI to the leader's advertise URL, with
// 503 and Retry-After when no leader (other than a handing-over self) is known.
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
type Gate struct {
	// Election is the name of the election whose leader may serve the gated requests.
	// Default: `default`.
	Election string `json:"election,omitempty"`

	// Follower is what an instance that does not lead does with a gated request:
	// `reject` answers with StatusCode and Retry-After; `redirect` sends the client to
	// the leader's advertise URL (which needs `advertise` in the leader app). Default:
	// `reject`.
	Follower string `json:"follower,omitempty"`

	// StatusCode is the response status on a follower: for `reject` a 4xx or 5xx code
	// (default 503), for `redirect` 307 or 308, the codes that keep the method and body
	// (default 307).
	StatusCode int `json:"status_code,omitempty"`

	// RetryAfter is the value of the Retry-After header sent with rejections, rounded up
	// to whole seconds. Default: 1s.
	RetryAfter caddy.Duration `json:"retry_after,omitempty"`

	election     *elector.Election
	placeholders *placeholderCache
	retryAfter   string
	errNotLeader error
	errNoLeader  error
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
	if g.Follower == FollowerRedirect && app.Advertise == "" {
		return errors.New("leader_gate: follower redirect needs the leader app's advertise URL: set `advertise` in the global leader option")
	}
	g.bind(app.election(g.Election))
	return nil
}

// bind connects the checked gate to its election and prepares what requests reuse.
func (g *Gate) bind(e *elector.Election) {
	g.election = e
	g.placeholders = new(placeholderCache)
	secs := (time.Duration(g.RetryAfter) + time.Second - 1) / time.Second
	g.retryAfter = strconv.FormatInt(int64(secs), 10)
	g.errNotLeader = fmt.Errorf("this instance does not lead election %q", g.Election)
	g.errNoLeader = fmt.Errorf("no leader of election %q is known", g.Election)
}

func (g *Gate) setDefaults() {
	if g.Election == "" {
		g.Election = DefaultElection
	}
	if g.Follower == "" {
		g.Follower = FollowerReject
	}
	if g.StatusCode == 0 {
		g.StatusCode = http.StatusServiceUnavailable
		if g.Follower == FollowerRedirect {
			g.StatusCode = http.StatusTemporaryRedirect
		}
	}
	if g.RetryAfter == 0 {
		g.RetryAfter = caddy.Duration(DefaultRetryAfter)
	}
}

// check names the first bad field.
func (g *Gate) check() error {
	if err := checkElectionName(g.Election); err != nil {
		return fmt.Errorf("leader_gate: election: %v", err)
	}
	if err := checkFollower(g.Follower, g.StatusCode); err != nil {
		return fmt.Errorf("leader_gate: %v", err)
	}
	if g.RetryAfter < 0 {
		return fmt.Errorf("leader_gate: retry_after: %s is negative", time.Duration(g.RetryAfter))
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
	default:
		return fmt.Errorf("follower: %q is not one of reject, redirect", follower)
	}
	return nil
}

// ServeHTTP implements caddyhttp.MiddlewareHandler.
func (g *Gate) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	t, admitted := g.election.Enter()
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	g.placeholders.set(repl, t, admitted)
	if admitted {
		defer g.election.Exit()
		return next.ServeHTTP(w, r)
	}
	if g.Follower == FollowerRedirect && t.Leader.URL != "" && !t.Holds() {
		w.Header().Set("Location", strings.TrimSuffix(t.Leader.URL, "/")+originalURI(r))
		w.WriteHeader(g.StatusCode)
		return nil
	}
	w.Header().Set("Retry-After", g.retryAfter)
	if g.Follower == FollowerRedirect {
		return caddyhttp.Error(http.StatusServiceUnavailable, g.errNoLeader)
	}
	return caddyhttp.Error(g.StatusCode, g.errNotLeader)
}

// originalURI is the request URI as the client sent it, before any rewrite: the leader
// applies the same rewrites itself.
func originalURI(r *http.Request) string {
	if orig, ok := r.Context().Value(caddyhttp.OriginalRequestCtxKey).(http.Request); ok {
		return orig.RequestURI
	}
	return r.RequestURI
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Gate)(nil)
	_ caddyhttp.MiddlewareHandler = (*Gate)(nil)
)
