package caddyleader

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

// NotLeaderHeader is set on the 503 an instance answers to a forwarded request when it no
// longer leads. It tells the forwarding instance that the application never saw the
// request, so it may send it to the new leader instead.
const NotLeaderHeader = "Caddy-Leader-Not-Leader"

// notLeaderElsewhere is the value of NotLeaderHeader from an instance that knows it will not
// lead soon: a process started again at the leader's address while its previous process's
// key stands, or one that sees another instance hold the key. The forwarding instance then
// waits until its own view of the election changes before it sends the request anywhere
// again. Any other value (the election's name) may come from an instance about to lead (a
// successor whose campaign has not answered yet, one still proving its predecessor
// stopped, an ex-leader that has not seen its successor): it is asked again after a pause.
const notLeaderElsewhere = "elsewhere"

// replayLimit is the largest request body a forward keeps in memory so that it can be sent
// again when the instance it went to had just stopped leading. Larger and streamed bodies
// go straight through and are not retried.
const replayLimit = 64 << 10

// The instance that answered NotLeaderHeader may be the one this instance takes for the
// leader: the ex-leader, whose stepping down has not reached this instance yet, a process
// started again at the leader's address, or the successor, which has not yet confirmed its
// own win or is still waiting for its predecessor to stop. One that knows it will not lead
// soon says so (notLeaderElsewhere) and is asked nothing until this instance's view of the
// election changes; any other is asked again after a pause that starts at
// firstNotLeaderPause and doubles up to maxNotLeaderPause, or sooner if the election
// changes. Hold bounds the whole.
const (
	firstNotLeaderPause = 5 * time.Millisecond
	maxNotLeaderPause   = 100 * time.Millisecond
)

// forward proxies r to the leader, holding it (up to Hold) across what a leader change
// throws at it: a leader that turns out to have let go in the meantime (it answers 503 with
// NotLeaderHeader without passing the request on), or one that no longer accepts
// connections (it crashed; its lease has not run out yet). Between tries the request waits
// for a settled term and is served right here if this instance has won it. It is tried
// again only when it certainly did not reach the application: the connection failed, or
// the ex-leader refused it, and then only if its body can be sent again. What goes to the
// leader is the request as the client sent it (see asSent); what is served here, should
// this instance win meanwhile, is the request as this route's rewrites left it.
func (g *Gate) forward(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, rt *gateRoute) error {
	body, replayable, err := bufferBody(r)
	if err != nil {
		return caddyhttp.Error(http.StatusBadRequest, err)
	}
	if g.routes != nil {
		caddyhttp.SetVar(r.Context(), routeVar, rt) // for routedUpstreams
	}
	deadline := time.Now().Add(g.hold)
	pause := firstNotLeaderPause
	for try := 1; ; try++ {
		if body != nil {
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		if try > 1 {
			ctx, cancel := context.WithDeadline(r.Context(), deadline)
			t, settled := g.waitSettled(ctx, rt.election)
			cancel()
			if !settled {
				return g.reject(w, http.StatusServiceUnavailable, rt.errNoLeader)
			}
			if t.Holds() {
				if t, at, admitted := rt.election.EnterAt(); admitted {
					// This instance won the next term: serve here, under this term's
					// token, not the one the request was first seen with.
					repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
					return g.serveHere(w, r, next, rt, repl, t, at, true)
				}
			}
			// A try that did not go through may still be dialing in the background and
			// reading the request's variables: give this try its own.
			r = r.WithContext(withOwnVars(r.Context()))
		}
		changed := rt.election.Changed()
		catcher := newNotLeaderCatcher(w)
		err := g.forwarder.ServeHTTP(catcher, asSent(r), next)
		switch {
		case catcher.caught:
			catcher.restoreHeader()
			wait := pause
			if catcher.elsewhere {
				wait = time.Until(deadline) // nothing but a change is worth a new try
			}
			if !replayable || !waitForChange(r.Context(), changed, wait, deadline) {
				return g.reject(w, http.StatusServiceUnavailable, rt.errNoLeader)
			}
			pause = min(2*pause, maxNotLeaderPause)
		case err == nil:
			return nil // the leader answered
		case !notSent(err):
			return g.forwardFailed(w, err, rt)
		}
		if time.Now().After(deadline) {
			return g.forwardFailed(w, err, rt)
		}
	}
}

// waitForChange waits until changed is closed or pause has passed, and reports whether that
// happened before deadline (and before ctx ended).
func waitForChange(ctx context.Context, changed <-chan struct{}, pause time.Duration, deadline time.Time) bool {
	left := time.Until(deadline)
	if left <= 0 {
		return false
	}
	timer := time.NewTimer(min(pause, left))
	defer timer.Stop()
	select {
	case <-changed:
		return true
	case <-timer.C:
		return pause < left
	case <-ctx.Done():
		return false
	}
}

// withOwnVars gives ctx a copy of Caddy's request variables.
func withOwnVars(ctx context.Context) context.Context {
	vars, ok := ctx.Value(caddyhttp.VarsCtxKey).(map[string]any)
	if !ok || vars == nil {
		return ctx
	}
	return context.WithValue(ctx, caddyhttp.VarsCtxKey, maps.Clone(vars))
}

// notSent reports whether a forward failed before anything reached the leader: no
// connection could be made, or no leader was there to try.
func notSent(err error) bool {
	if err == nil {
		return false
	}
	var dial reverseproxy.DialError
	var he caddyhttp.HandlerError
	// reverse_proxy's own 503 means "no upstreams available": GetUpstreams had no leader.
	return errors.As(err, &dial) || errors.As(err, &he) && he.StatusCode == http.StatusServiceUnavailable
}

// forwardFailed turns a forward that got no answer from the leader within Hold (it died, or
// went away before a successor was known) into what the client would see with no leader:
// 503 with Retry-After.
func (g *Gate) forwardFailed(w http.ResponseWriter, err error, rt *gateRoute) error {
	if err == nil {
		return g.reject(w, http.StatusServiceUnavailable, rt.errNoLeader)
	}
	var he caddyhttp.HandlerError
	if errors.As(err, &he) && he.StatusCode >= 500 {
		// %v, not %w: caddyhttp.Error would keep the wrapped error's status.
		return g.reject(w, http.StatusServiceUnavailable, fmt.Errorf("forwarding to the leader of election %q: %v", rt.name, err))
	}
	return err
}

// bufferBody reads a small request body into memory so that it can be sent more than once.
// It reports whether the request can be replayed (no body, or a buffered one).
func bufferBody(r *http.Request) ([]byte, bool, error) {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return nil, true, nil
	}
	if r.ContentLength < 0 || r.ContentLength > replayLimit {
		return nil, false, nil
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, r.ContentLength))
	if err != nil {
		return nil, false, fmt.Errorf("reading the request body: %v", err)
	}
	return body, true, nil
}

// notLeaderCatcher passes a response through unless it is the NotLeaderHeader 503 of an
// instance that had stopped leading; that one it swallows, so the request can go elsewhere.
type notLeaderCatcher struct {
	*caddyhttp.ResponseWriterWrapper
	before http.Header // the response headers before the try, to undo what it copied in
	caught bool
	// elsewhere is set when the refusing instance knows it will not lead soon.
	elsewhere bool
}

func newNotLeaderCatcher(w http.ResponseWriter) *notLeaderCatcher {
	return &notLeaderCatcher{
		ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: w},
		before:                w.Header().Clone(),
	}
}

func (c *notLeaderCatcher) WriteHeader(status int) {
	if v := c.Header().Get(NotLeaderHeader); status == http.StatusServiceUnavailable && v != "" {
		c.caught, c.elsewhere = true, v == notLeaderElsewhere
		return
	}
	c.ResponseWriterWrapper.WriteHeader(status)
}

func (c *notLeaderCatcher) Write(b []byte) (int, error) {
	if c.caught {
		return len(b), nil
	}
	return c.ResponseWriterWrapper.Write(b)
}

// ReadFrom keeps io.Copy from reaching past Write to the client while a response is
// being swallowed.
func (c *notLeaderCatcher) ReadFrom(r io.Reader) (int64, error) {
	if c.caught {
		return io.Copy(io.Discard, r)
	}
	return c.ResponseWriterWrapper.ReadFrom(r)
}

// restoreHeader removes what the swallowed response put into the response headers.
func (c *notLeaderCatcher) restoreHeader() {
	h := c.Header()
	for k := range h {
		delete(h, k)
	}
	for k, v := range c.before {
		h[k] = v
	}
}
