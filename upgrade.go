package caddyleader

import (
	"bufio"
	"net"
	"net/http"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/internal/termconn"
)

// A request that upgrades its connection (a websocket, or any protocol switch that
// reverse_proxy tunnels) can carry bytes for hours after the gate admitted it; reverse_proxy
// keeps such a tunnel open until one side closes it. The gate therefore hands every
// connection hijacked from an admitted request to the term's connection guard, which cuts
// it the moment that term stops admitting (a handover begins, its release begins, a
// deadline passes, the key goes) and lets no byte through it after. The request stays in
// flight until the tunnel ends, so a handover does not release the key before it is cut.

// upgrading reports whether r asks to switch protocols, the requests whose connection a
// handler may hijack and keep after its response.
func upgrading(r *http.Request) bool {
	return len(r.Header["Upgrade"]) > 0
}

// serveUpgrade is serve for a request that may hijack its connection under term t.
func (g *Gate) serveUpgrade(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, e *elector.Election, t *elector.Term) error {
	defer e.Exit()
	tw := &trackedWriter{ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: w}, guard: termconn.For(e), term: t}
	defer tw.done()
	return next.ServeHTTP(tw, r)
}

// trackedWriter tracks the connection its request hijacks.
type trackedWriter struct {
	*caddyhttp.ResponseWriterWrapper
	guard *termconn.Guard
	term  *elector.Term
	conn  *termconn.Conn
}

// Hijack implements http.Hijacker: the connection is tracked under the request's term.
func (w *trackedWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	w.conn = w.guard.Track(conn, w.term, termconn.Options{Kind: "http"})
	return w.conn, brw, nil
}

// done ends the tracking once the handler has returned.
func (w *trackedWriter) done() {
	if w.conn != nil {
		w.conn.Done()
	}
}

// Interface guards
var _ http.Hijacker = (*trackedWriter)(nil)
