// Package safety proves, fault by fault, that a fleet of real Caddy processes never has two
// leaders admitting at once: a recording backend, the clients' load, the checker of their
// logs, and the runner of fault scenarios that every store's end-to-end tests share.
package safety

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/websocket"
)

// Arrival is one request as the application behind the gated route received it.
type Arrival struct {
	ReqID    string
	ServedBy string
	Token    int64
	// Shard is the request's shard, from X-Shard (see fleet.Config.Shards); -1 when the
	// fleet has no shard set.
	Shard  int
	Marked bool // still carried the forwarding mark: the gate should have removed it
	// URI is the request URI as the application got it; OriginalURI is the one the serving
	// instance was sent, before its rewrites.
	URI, OriginalURI string

	At   time.Time // when it arrived here
	Done time.Time // when its handler returned; zero until then (and for ws and upload)
	// Cancelled is set when the request's context ended before its delay was over: the
	// instance that sent it aborted the call.
	Cancelled bool
	// Entered and Admitted bound when the serving instance's gate admitted it (see
	// Config.Backend); zero when the header is missing or unparsable.
	Entered, Admitted time.Time
}

// Backend is the application behind /gated: it records every request, echoes
// websockets on /gated/ws, and answers uploads to /gated/upload with their SHA-256. Other
// paths answer after the delay set with SetDelay, or after the request's `delay` query
// parameter (a Go duration), unless the request is cancelled first.
type Backend struct {
	Server   *httptest.Server
	delay    atomic.Int64  // a time.Duration
	quit     chan struct{} // closed when the test ends: delayed requests are answered at once
	mu       sync.Mutex
	arrivals []Arrival
}

func StartBackend(t *testing.T) *Backend {
	t.Helper()
	b := &Backend{quit: make(chan struct{})}
	mux := http.NewServeMux()
	mux.Handle("/gated/ws", websocket.Handler(func(c *websocket.Conn) { _, _ = io.Copy(c, c) }))
	mux.HandleFunc("/gated/upload", func(w http.ResponseWriter, r *http.Request) {
		b.record(r)
		h := sha256.New()
		if _, err := io.Copy(h, r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprint(w, hex.EncodeToString(h.Sum(nil)))
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		a, i := b.record(r)
		// Go's server notices a client going away only once the body has been read.
		_, _ = io.Copy(io.Discard, r.Body)
		delay := time.Duration(b.delay.Load())
		if d, err := time.ParseDuration(r.URL.Query().Get("delay")); err == nil {
			delay = d
		}
		cancelled := false
		if delay > 0 {
			timer := time.NewTimer(delay)
			select {
			case <-timer.C:
			case <-b.quit:
				timer.Stop()
			case <-r.Context().Done():
				timer.Stop()
				cancelled = true
			}
		}
		if !cancelled {
			fmt.Fprintf(w, "%s %d", a.ServedBy, a.Token)
		}
		b.finish(i, cancelled)
	})
	b.Server = httptest.NewServer(mux)
	t.Cleanup(func() {
		close(b.quit)
		b.Server.Close()
	})
	return b
}

// record logs r's arrival and returns it with its index in the log.
func (b *Backend) record(r *http.Request) (Arrival, int) {
	token, _ := strconv.ParseInt(r.Header.Get("X-Fencing-Token"), 10, 64)
	shard, err := strconv.Atoi(r.Header.Get("X-Shard"))
	if err != nil {
		shard = -1
	}
	a := Arrival{
		ReqID:       r.Header.Get("X-Req-Id"),
		ServedBy:    r.Header.Get("X-Served-By"),
		Token:       token,
		Shard:       shard,
		Marked:      r.Header.Get("Caddy-Leader-Forwarded-By") != "",
		URI:         r.URL.RequestURI(),
		OriginalURI: r.Header.Get("X-Original-URI"),
		Entered:     parseStamp(r.Header.Get("X-Gate-Entered")),
		Admitted:    parseStamp(r.Header.Get("X-Admitted-At")),
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	a.At = time.Now() // under the lock, so that the log is in order of arrival
	b.arrivals = append(b.arrivals, a)
	return a, len(b.arrivals) - 1
}

// finish records that the request logged at index i has been answered or was cancelled.
func (b *Backend) finish(i int, cancelled bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.arrivals[i].Done = time.Now()
	b.arrivals[i].Cancelled = cancelled
}

// SetDelay makes every request (without a delay parameter) wait d before it is answered.
func (b *Backend) SetDelay(d time.Duration) { b.delay.Store(int64(d)) }

// parseStamp reads a `{time.now}` placeholder's value, Go's time.Time String format
// (with the monotonic reading, which is dropped); zero if it cannot.
func parseStamp(v string) time.Time {
	if i := strings.Index(v, " m="); i >= 0 {
		v = v[:i]
	}
	t, err := time.Parse("2006-01-02 15:04:05.999999999 -0700 MST", v)
	if err != nil {
		return time.Time{}
	}
	return t
}

func (b *Backend) Log() []Arrival {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]Arrival(nil), b.arrivals...)
}

// Since is the log of the requests that arrived at from or later.
func (b *Backend) Since(from time.Time) []Arrival {
	var out []Arrival
	for _, a := range b.Log() {
		if !a.At.Before(from) {
			out = append(out, a)
		}
	}
	return out
}
