package etcdtest

import (
	"io"
	"net"
	"sync"
)

// front owns a member's advertised client port and forwards each connection
// to the port etcd itself listens on. It exists so that Stop can cut client
// connections at once: etcd's own shutdown gives open watch and lease
// keep-alive streams its request timeout (about 7s) to end, during which a
// stopping member would go on serving them.
type front struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool

	wg sync.WaitGroup
}

// serveFront forwards connections accepted on ln to target until close.
func serveFront(ln net.Listener, target string) *front {
	f := &front{ln: ln, target: target, conns: make(map[net.Conn]struct{})}
	f.wg.Add(1)
	go f.accept()
	return f
}

func (f *front) accept() {
	defer f.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return // closed; Accept errors on loopback are not transient
		}
		f.wg.Add(1)
		go f.forward(c)
	}
}

// forward pipes c to a new connection to target. gRPC never half-closes, so
// the end of either direction ends both.
func (f *front) forward(c net.Conn) {
	defer f.wg.Done()
	if !f.track(c) {
		return
	}
	defer f.untrack(c)
	up, err := net.Dial("tcp", f.target)
	if err != nil {
		return // etcd not serving yet: the client sees a closed connection and retries
	}
	if !f.track(up) {
		return
	}
	defer f.untrack(up)

	done := make(chan struct{}, 2)
	go func() { io.Copy(up, c); done <- struct{}{} }()
	go func() { io.Copy(c, up); done <- struct{}{} }()
	<-done
	c.Close()
	up.Close()
	<-done
}

// track registers c for close; it closes c and reports false if the front
// is already closed.
func (f *front) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		c.Close()
		return false
	}
	f.conns[c] = struct{}{}
	return true
}

func (f *front) untrack(c net.Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.conns, c)
	c.Close()
}

// down cuts every connection and makes the front close new ones at once, as a
// crashed member's port would refuse them, while it keeps the port: another
// process cannot take it before the member restarts.
func (f *front) down() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	for c := range f.conns {
		c.Close()
	}
}

// up forwards new connections again after down.
func (f *front) up() {
	f.mu.Lock()
	f.closed = false
	f.mu.Unlock()
}

// close stops accepting, cuts every connection and waits for all
// forwarding goroutines to end.
func (f *front) close() {
	f.mu.Lock()
	f.closed = true
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.ln.Close()
	f.wg.Wait()
}
