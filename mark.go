package caddyleader

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ForwardedByHeader marks a request that one instance forwarded to the leader. Its value
// names the forwarding instance, the term (fencing token) the request was forwarded to,
// when, and a MAC over those and the request's method and target (path and query) made
// with that term's secret (elector.Record.MarkKey), which only those who can read the
// election key in the store know:
//
//	Caddy-Leader-Forwarded-By: <instance id>; token=<token>; at=<unix ms>; mac=<base64url>
//
// A leader admits a marked request only under the term it names, once that term has
// settled, and never while it drains for a handover or is being released: it answers
// NotLeaderHeader and the forwarding instance sends the request on to the successor. A mark that does not verify (a client set it, or a peer
// made it for a term this process never held) is removed, and the request is admitted as
// a plain one would be. Either way, an instance that cannot admit a marked request
// answers 503 with NotLeaderHeader at once, so that the forwarding instance may send it
// elsewhere: it never forwards a marked request again nor holds it, so a request travels
// one hop at most, whatever the instances make of each other's marks. (A client that
// sets the header itself only denies its request the forward.) The gate removes every
// mark before the request goes on to the application.
const ForwardedByHeader = "Caddy-Leader-Forwarded-By"

// forwardedByKey is ForwardedByHeader in canonical form, for direct map access.
var forwardedByKey = http.CanonicalHeaderKey(ForwardedByHeader)

// maxMarkAge is how far a mark's time may be from the receiver's clock: a mark goes out
// with every try, so only the hop's latency and the skew between the instances' wall
// clocks need to fit in it. It bounds how long a mark captured on the wire can be
// replayed, for the same method and URI, within the same term.
const maxMarkAge = 30 * time.Second

// forwardMark is a parsed ForwardedByHeader.
type forwardMark struct {
	by    string
	token int64
	at    int64 // Unix milliseconds
	mac   []byte
}

// signMark makes the mark with which instance by forwards a request (method, uri) to the
// holder of term token, whose MarkKey is key. The uri is the request target sent on the
// wire, path and query (see requestTarget); not the Host: reverse_proxy sets Host to the
// upstream's address for TLS transports.
func signMark(by string, token int64, key string, at time.Time, method, uri string) string {
	ms := at.UnixMilli()
	mac := markMAC([]byte(key), by, token, ms, method, uri)
	return by + "; token=" + strconv.FormatInt(token, 10) + "; at=" + strconv.FormatInt(ms, 10) +
		"; mac=" + base64.RawURLEncoding.EncodeToString(mac)
}

// markMAC is the HMAC-SHA256 of a mark's fields and the request's, each length-prefixed
// so that no two different inputs run together into the same bytes.
func markMAC(key []byte, by string, token, at int64, method, uri string) []byte {
	h := hmac.New(sha256.New, key)
	var n [8]byte
	for _, field := range []string{by, strconv.FormatInt(token, 10), strconv.FormatInt(at, 10), method, uri} {
		binary.BigEndian.PutUint64(n[:], uint64(len(field)))
		h.Write(n[:])
		h.Write([]byte(field))
	}
	return h.Sum(nil)
}

// parseMark reads a ForwardedByHeader value; a bare instance id (as sent by versions that
// did not sign) parses with no token and no MAC, and so never verifies.
func parseMark(v string) forwardMark {
	by, rest, _ := strings.Cut(v, ";")
	m := forwardMark{by: strings.TrimSpace(by)}
	for _, param := range strings.Split(rest, ";") {
		name, val, _ := strings.Cut(strings.TrimSpace(param), "=")
		switch name {
		case "token":
			m.token, _ = strconv.ParseInt(val, 10, 64)
		case "at":
			m.at, _ = strconv.ParseInt(val, 10, 64)
		case "mac":
			m.mac, _ = base64.RawURLEncoding.DecodeString(val)
		}
	}
	return m
}

// verify reports whether m was made with key for a request with this method and request
// target (path and query), no further than maxMarkAge from now.
func (m forwardMark) verify(key []byte, method, uri string, now time.Time) bool {
	if m.mac == nil || m.token == 0 {
		return false
	}
	if age := now.Sub(time.UnixMilli(m.at)); age > maxMarkAge || age < -maxMarkAge {
		return false
	}
	return hmac.Equal(m.mac, markMAC(key, m.by, m.token, m.at, method, uri))
}

// requestTarget is the path and query of r as a request line carries them. On the
// sending side that is what Go's transport writes; on the receiving side it is the same
// string, read back from the request line, so both ends of a hop MAC the same bytes.
func requestTarget(r *http.Request) string {
	if r.RequestURI != "" && r.RequestURI[0] == '/' {
		return r.RequestURI // as received, in origin form
	}
	return r.URL.RequestURI()
}

// takeMark removes the forwarding mark from r. It reports whether r came with one
// (hopped: a peer, or a client posing as one, forwarded it), and returns the term it was
// genuinely forwarded to: a term of this instance, authenticated with that term's
// MarkKey. A mark that does not verify gives forwarded false; the request is then
// admitted as a plain one would be, but never forwarded again. Only requests that carry
// the header pay for the check.
func (g *Gate) takeMark(r *http.Request, rt *gateRoute) (token int64, forwarded, hopped bool) {
	vals := r.Header[forwardedByKey]
	if len(vals) == 0 {
		return 0, false, false
	}
	delete(r.Header, forwardedByKey)
	if len(vals) != 1 {
		return 0, false, true
	}
	m := parseMark(vals[0])
	key, ok := rt.election.MarkKey(m.token)
	if !ok {
		return 0, false, true
	}
	// The mark covers the request as it was sent, before any rewrite on this side.
	orig := original(r)
	if !m.verify(key, orig.Method, requestTarget(orig), time.Now()) {
		return 0, false, true
	}
	return m.token, true, true
}
