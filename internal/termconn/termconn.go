// Package termconn ties connections to the leader term that admitted them and cuts them
// when that term stops admitting, by the leader's own deadline.
package termconn

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
)

// Why a connection was cut, as counted by caddy_leader_connections_cut_total.
const (
	ReasonHandover = "handover"  // the term began to hand over (after its drain, if any)
	ReasonReleased = "released"  // the term's release began
	ReasonDeadline = "deadline"  // its lease or heartbeat deadline passed unrenewed
	ReasonEnded    = "ended"     // the key was deleted, taken over or released
	ReasonShutdown = "shut down" // the guard was told to cut everything (CutAll)
)

// ErrCut is what a cut connection's Read and Write return.
var ErrCut = errors.New("connection cut: the leader term that admitted it no longer admits")

// Guard tracks the connections admitted under the terms of one election on this instance.
// There is one per election (see For), shared by every handler and config that uses it, so
// that a reload neither loses track of a connection nor watches it twice.
type Guard struct {
	e *elector.Election

	mu      sync.Mutex
	conns   map[*Conn]struct{} // admitted, not yet cut or done
	running bool               // the watcher runs

	reporter atomic.Pointer[func(Cut)]
	// group, when set, labels the guard's metrics instead of the election's name, with
	// no token: a shard set's elections are counted together (see SetMetricGroup).
	group atomic.Pointer[string]
}

// SetMetricGroup makes the guard count its connections in the metrics under group instead
// of its election's name, and without a series per term: for the elections of a shard set,
// which may have thousands, each with terms of its own.
func (g *Guard) SetMetricGroup(group string) { g.group.Store(&group) }

// labels are the election and token labels of a connection admitted under term t.
func (g *Guard) labels(t *elector.Term) (election, token string) {
	if group := g.group.Load(); group != nil {
		return *group, ""
	}
	return t.Election, termLabel(t.Token)
}

// Cut is a batch of connections cut at once for one reason, as a reporter hears of it.
type Cut struct {
	Election string
	Token    int64 // the term that admitted them
	Kind     string
	Reason   string
	Count    int
}

// SetReporter makes fn hear of every batch of connections the guard cuts (the leader app
// turns them into events); it replaces the previous reporter. fn must not block.
func (g *Guard) SetReporter(fn func(Cut)) { g.reporter.Store(&fn) }

// report tells the reporter of the connections in cut that this call closed.
func (g *Guard) report(cut []*Conn, reasons []string, closed []bool) {
	fn := g.reporter.Load()
	if fn == nil {
		return
	}
	batches := map[Cut]int{}
	for i, c := range cut {
		if closed[i] {
			batches[Cut{Election: c.term.Election, Token: c.term.Token, Kind: c.kind, Reason: reasonOr(reasons[i])}]++
		}
	}
	for b, n := range batches {
		b.Count = n
		(*fn)(b)
	}
}

func reasonOr(reason string) string {
	if reason == "" {
		return ReasonEnded
	}
	return reason
}

var guards sync.Map // *elector.Election -> *Guard

// For returns the Guard of election e.
func For(e *elector.Election) *Guard {
	if g, ok := guards.Load(e); ok {
		return g.(*Guard)
	}
	g, _ := guards.LoadOrStore(e, &Guard{e: e, conns: make(map[*Conn]struct{})})
	return g.(*Guard)
}

// Options say how a connection is tracked.
type Options struct {
	// Kind labels the connection in the metrics: "layer4" or "http".
	Kind string
	// Drain is how long a connection may go on once its term begins a planned handover,
	// before it is cut; 0 cuts it at once. Whatever the drain, it is cut when the term's
	// release begins or a deadline passes, and the handover waits for it (it counts as in
	// flight until Done), so the key is never released while it still carries bytes.
	Drain time.Duration
}

// Admit admits conn under the election's current term if that term leads now, counting it
// as in flight (as Election.Enter does) and tracking it until Done. It returns the wrapped
// connection, whose Read and Write fail with ErrCut once the term stops admitting, and the
// Term it decided on. On refusal it returns nil.
func (g *Guard) Admit(conn net.Conn, opt Options) (*Conn, *elector.Term) {
	t, ok := g.e.Enter()
	if !ok {
		return nil, t
	}
	return g.track(conn, t, opt, false), t
}

// Follow tracks conn, which this instance, a follower, hands to the leader of term t (the
// layer-4 gate's follower proxy): it is cut as soon as this instance sees that term end
// (another term, no leader known, or the leader handing over), so that the clients of a
// leader that froze or was cut off reconnect and reach its successor rather than stay
// attached to it. It counts as nothing in flight.
func (g *Guard) Follow(conn net.Conn, t *elector.Term, opt Options) *Conn {
	c := g.track(conn, t, opt, true)
	c.exited.Store(true)
	return c
}

// Track tracks conn, already admitted under term t by Election.Enter (the caller's request
// holds the in-flight count, so Done does not end it). For an HTTP connection hijacked
// from a request admitted by the gate.
func (g *Guard) Track(conn net.Conn, t *elector.Term, opt Options) *Conn {
	c := g.track(conn, t, opt, false)
	c.exited.Store(true) // the request's own Exit ends the count
	return c
}

func (g *Guard) track(conn net.Conn, t *elector.Term, opt Options, follower bool) *Conn {
	c := &Conn{Conn: conn, g: g, term: t, drain: opt.Drain, kind: opt.Kind, follower: follower}
	election, token := g.labels(t)
	gauge := metrics.open.WithLabelValues(election, opt.Kind, token)
	gauge.Inc()
	c.gauge = gauge
	g.mu.Lock()
	g.conns[c] = struct{}{}
	start := !g.running
	g.running = true
	g.mu.Unlock()
	// A running watcher need not look again: the connection was admitted under the
	// term that admits now, whose deadline and changes it already waits for (connections
	// of any earlier term were cut when that term changed).
	if start {
		go g.watch()
	}
	return c
}

// Open is the number of tracked connections not yet cut or done.
func (g *Guard) Open() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.conns)
}

// CutAll cuts every tracked connection.
func (g *Guard) CutAll() {
	g.mu.Lock()
	all := make([]*Conn, 0, len(g.conns))
	for c := range g.conns {
		all = append(all, c)
	}
	g.mu.Unlock()
	reasons, closed := make([]string, len(all)), make([]bool, len(all))
	for i, c := range all {
		reasons[i], closed[i] = ReasonShutdown, c.cut(ReasonShutdown)
	}
	g.report(all, reasons, closed)
}

// watch cuts each tracked connection when its term stops admitting. It runs while any
// connection is tracked, waking at every change of the election and at the nearest
// deadline or drain end.
func (g *Guard) watch() {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		changed := g.e.Changed()
		now := g.e.Now()
		next := time.Hour
		var cut []*Conn
		var reasons []string
		g.mu.Lock()
		for c := range g.conns {
			if reason, ok := c.admits(now); !ok {
				cut = append(cut, c)
				reasons = append(reasons, reason)
			} else {
				next = min(next, c.wakeIn(now))
			}
		}
		last := len(g.conns) == len(cut)
		if last {
			g.running = false
			for _, c := range cut {
				delete(g.conns, c)
			}
		}
		g.mu.Unlock()
		closed := make([]bool, len(cut))
		for i, c := range cut {
			closed[i] = c.cut(reasons[i])
		}
		g.report(cut, reasons, closed)
		if last {
			return
		}
		timer.Reset(max(next, 0))
		select {
		case <-changed:
		case <-timer.C:
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// forget stops tracking c.
func (g *Guard) forget(c *Conn) {
	g.mu.Lock()
	delete(g.conns, c)
	g.mu.Unlock()
}

// Conn is a connection admitted under one term. Its Read and Write check, on every call,
// that the term still admits (one atomic load and a clock read), so that nothing more is read
// from or written to this connection once a deadline has passed, even before the watcher
// closes it. Bytes read before the deadline and still buffered by whoever relays them, and a
// write to the other side already under way, are beyond its reach (docs/layer4.md).
type Conn struct {
	net.Conn

	g    *Guard
	term *elector.Term // the snapshot that admitted it (leading, not draining)
	// follower is set on a connection this instance hands to another instance's term
	// (see Guard.Follow) rather than one it admitted itself.
	follower bool
	drain    time.Duration
	kind     string
	gauge    interface{ Dec() }

	// drainUntil is when (ns since base) the drain of the handover ends; 0 until the
	// handover is first seen.
	drainUntil atomic.Int64
	isCut      atomic.Bool
	exited     atomic.Bool // the in-flight count was ended (or belongs to someone else)
	doneOnce   sync.Once
	cutOnce    sync.Once
}

// base anchors drain deadlines on the monotonic clock.
var base = time.Now()

// Term is the term the connection was admitted under.
func (c *Conn) Term() *elector.Term { return c.term }

// Cut reports whether the connection was cut.
func (c *Conn) Cut() bool { return c.isCut.Load() }

// admits reports whether the connection's term still admits it at now, and if not, why.
func (c *Conn) admits(now time.Time) (string, bool) {
	if c.isCut.Load() {
		return "", false
	}
	if c.follower {
		cur := c.g.e.Term()
		if cur.Token != c.term.Token || cur.Holds() || !cur.LeaderKnown() || cur.Leader.HandingOver {
			return ReasonEnded, false
		}
		return "", true
	}
	// The admitting snapshot shares its lease and heartbeat deadlines with every later
	// snapshot of the same term, so this reads the term's deadlines as they are now.
	if c.term.Remaining(now) <= 0 {
		return ReasonDeadline, false
	}
	cur := c.g.e.Term()
	switch {
	case cur.Token != c.term.Token || !cur.Holds():
		return ReasonEnded, false
	case cur.Releasing:
		return ReasonReleased, false
	case !cur.Draining:
		return "", true
	case c.drain <= 0:
		return ReasonHandover, false
	}
	until := c.drainUntil.Load()
	if until == 0 {
		c.drainUntil.CompareAndSwap(0, int64(now.Add(c.drain).Sub(base)))
		until = c.drainUntil.Load()
	}
	if int64(now.Sub(base)) >= until {
		return ReasonHandover, false
	}
	return "", true
}

// wakeIn is how long from now the connection's admission may end without the election
// changing: at the term's deadline or the end of its drain.
func (c *Conn) wakeIn(now time.Time) time.Duration {
	if c.follower {
		return time.Hour // only a change of the election ends it
	}
	d := c.term.Remaining(now)
	if until := c.drainUntil.Load(); until != 0 {
		d = min(d, time.Duration(until-int64(now.Sub(base))))
	}
	return d
}

// Read implements net.Conn: bytes read after the term stopped admitting are dropped.
func (c *Conn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		if reason, ok := c.admits(c.g.e.Now()); !ok {
			c.cutAndReport(reason)
			return 0, ErrCut
		}
	}
	if err != nil && c.isCut.Load() {
		err = ErrCut
	}
	return n, err
}

// Write implements net.Conn: nothing is written once the term stopped admitting.
func (c *Conn) Write(b []byte) (int, error) {
	if reason, ok := c.admits(c.g.e.Now()); !ok {
		c.cutAndReport(reason)
		return 0, ErrCut
	}
	return c.Conn.Write(b)
}

// CloseWrite half-closes the connection if the underlying one can (TCP).
func (c *Conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}

// cut closes the connection for reason, once; it reports whether this call closed it.
func (c *Conn) cut(reason string) bool {
	closed := false
	c.cutOnce.Do(func() {
		closed = true
		c.isCut.Store(true)
		c.g.forget(c)
		_ = c.Conn.Close()
		election, _ := c.g.labels(c.term)
		metrics.cut.WithLabelValues(election, c.kind, reasonOr(reason)).Inc()
	})
	return closed
}

// cutAndReport is cut for one connection that found its term over on its own.
func (c *Conn) cutAndReport(reason string) {
	closed := c.cut(reason)
	c.g.report([]*Conn{c}, []string{reason}, []bool{closed})
}

// Done ends the tracking of the connection once its handler has returned (nothing relays
// its bytes any more), and its in-flight count, which a handover waits for. It does not
// close the connection. Idempotent.
func (c *Conn) Done() {
	c.doneOnce.Do(func() {
		c.g.forget(c)
		c.gauge.Dec()
		if c.exited.CompareAndSwap(false, true) {
			c.g.e.Exit()
		}
	})
}
