// Package faultproxy is a loopback TCP proxy that cuts, stalls or delays a link, for fault-injection tests.
package faultproxy

import (
	"context"
	"net"
	"sync"
	"time"
)

// Proxy forwards TCP connections from a loopback port to one target. Faults
// apply to the whole link, in both directions, to current and future
// connections alike. Its methods are safe for concurrent use.
type Proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	links   map[*link]struct{}
	stalled bool          // set by Blackhole
	newOnly bool          // set by BlackholeNew
	delay   time.Duration // set by Delay
	tap     func([]byte)  // set by Tap
	// changed is closed and replaced whenever stalled or delay changes,
	// waking every writer to re-check when its next chunk is due.
	changed chan struct{}
	closed  bool

	wg sync.WaitGroup // the accept loop and every link
}

// New listens on 127.0.0.1:0 and forwards every accepted connection to
// target (host:port), dialling target once per accepted connection.
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{
		ln:      ln,
		target:  target,
		links:   make(map[*link]struct{}),
		changed: make(chan struct{}),
	}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the proxy's address, "127.0.0.1:PORT".
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// URL returns the proxy's address as "http://127.0.0.1:PORT", the form etcd
// clients take as an endpoint.
func (p *Proxy) URL() string { return "http://" + p.Addr() }

// Blackhole stops moving bytes in both directions on every current and
// future connection, without closing anything. Bytes are held back, like
// packets lost and retransmitted later, so a peer sees a silent link. The
// proxy keeps reading into a bounded buffer and then stops reading, so a
// sender that goes on writing is held back by TCP flow control. New
// connections are still accepted, but the proxy does not dial target for
// them until the link flows again.
func (p *Proxy) Blackhole() {
	p.set(func() { p.stalled = true })
}

// BlackholeNew holds every connection accepted from now on, as Blackhole
// does, while the connections already through keep flowing: a stateful
// firewall that drops new flows. A client that keeps its connections alive
// still gets through; one that connects anew does not.
func (p *Proxy) BlackholeNew() {
	p.set(func() { p.newOnly = true })
}

// Heal undoes Blackhole, BlackholeNew and Delay: held bytes are delivered,
// in order, and forwarding resumes at full speed.
func (p *Proxy) Heal() {
	p.set(func() { p.stalled, p.newOnly, p.delay = false, false, 0 })
}

// Tap calls f with a copy of every chunk of bytes read from a client, as it
// is read (before any fault holds it back), so that a test can capture what
// crossed the link; nil stops it. f must not block.
func (p *Proxy) Tap(f func([]byte)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.tap = f
}

// tapped is the current Tap callback, or nil.
func (p *Proxy) tapped() func([]byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.tap
}

// Delay makes every chunk of bytes arrive d after the proxy read it, in both
// directions, preserving order; a new connection reaches target d after the
// proxy accepted it. The delay applies to bytes already held, too. 0 removes
// the delay.
func (p *Proxy) Delay(d time.Duration) {
	p.set(func() { p.delay = max(d, 0) })
}

func (p *Proxy) set(change func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	change()
	close(p.changed)
	p.changed = make(chan struct{})
}

// Reset closes every current connection on both sides, dropping any bytes
// held for it. New connections are accepted as usual. A connection dialled
// a moment before may still wait in the listen backlog, and is then not
// current yet: Reset does not close it.
func (p *Proxy) Reset() {
	for _, l := range p.snapshot() {
		l.close()
	}
}

// Close stops listening, closes every connection and returns once all of
// the proxy's goroutines have ended. Closing a closed proxy does nothing.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()

	err := p.ln.Close()
	// No link can be added once closed is set, so this closes them all.
	p.Reset()
	p.wg.Wait()
	return err
}

func (p *Proxy) snapshot() []*link {
	p.mu.Lock()
	defer p.mu.Unlock()
	ls := make([]*link, 0, len(p.links))
	for l := range p.links {
		ls = append(ls, l)
	}
	return ls
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			// Closed, or out of file descriptors; on loopback in a
			// test neither is worth retrying.
			return
		}
		l := newLink(c, time.Now())
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			l.close()
			continue
		}
		p.links[l] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go p.serve(l)
	}
}

// due waits until bytes read at readAt may be delivered: the link is not
// blackholed and the delay since readAt has passed; a connection not yet
// dialled (dial) waits out BlackholeNew too. It reports false if ctx ends
// first.
func (p *Proxy) due(ctx context.Context, readAt time.Time, dial bool) bool {
	for {
		p.mu.Lock()
		stalled, delay, changed := p.stalled || dial && p.newOnly, p.delay, p.changed
		p.mu.Unlock()

		if stalled {
			select {
			case <-changed:
				continue
			case <-ctx.Done():
				return false
			}
		}
		wait := time.Until(readAt.Add(delay))
		if wait <= 0 {
			return true
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-changed:
		case <-ctx.Done():
			t.Stop()
			return false
		}
		t.Stop()
	}
}
