package faultproxy

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

const (
	// chunkSize is the most the proxy reads at once; each read becomes
	// one chunk with one delivery time.
	chunkSize = 32 << 10

	// queuedChunks bounds what the proxy holds per direction while a link
	// is blackholed or delayed. Beyond it the proxy stops reading, and TCP
	// flow control stalls the sender as a real slow link would.
	queuedChunks = 16
)

// link is one accepted connection and, once dialled, its connection to the
// target.
type link struct {
	client   net.Conn
	accepted time.Time

	// ctx ends when the link is closed; it cancels a pending dial and
	// wakes goroutines waiting for a chunk to become due.
	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	upstream net.Conn // nil until dialled
}

// chunk is bytes read from one side, to be written to the other no earlier
// than the link allows. A chunk with eof set carries the reader's end of
// stream, which is held and delayed like data.
type chunk struct {
	data   []byte
	readAt time.Time
	eof    bool
}

func newLink(c net.Conn, accepted time.Time) *link {
	ctx, cancel := context.WithCancel(context.Background())
	return &link{client: c, accepted: accepted, ctx: ctx, cancel: cancel}
}

// close closes both sides; it is safe to call more than once and from any
// goroutine.
func (l *link) close() {
	l.cancel()
	l.client.Close()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.upstream != nil {
		l.upstream.Close()
	}
}

// setUpstream records the dialled connection, or closes it and reports
// false if the link was closed during the dial.
func (l *link) setUpstream(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ctx.Err() != nil {
		c.Close()
		return false
	}
	l.upstream = c
	return true
}

// serve dials the target once the link lets a connection through, then
// forwards both directions until both have ended or the link is closed.
func (p *Proxy) serve(l *link) {
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		delete(p.links, l)
		p.mu.Unlock()
	}()
	defer l.close()

	// A blackholed link must not reach the target: the connection attempt
	// is part of what is lost.
	if !p.due(l.ctx, l.accepted, true) {
		return
	}
	var d net.Dialer
	up, err := d.DialContext(l.ctx, "tcp", p.target)
	if err != nil {
		return // the client sees its connection closed, as when the target is down
	}
	if !l.setUpstream(up) {
		return
	}

	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.pipe(l, l.client, up, p.tapped) }()
	go func() { defer wg.Done(); p.pipe(l, up, l.client, nil) }()
	wg.Wait()
}

// pipe moves bytes from src to dst in order, each chunk no earlier than
// the link allows. It returns after passing on src's end of stream, or
// after closing the link on any error.
// tap, if set, returns the callback that sees what is read from src.
func (p *Proxy) pipe(l *link, src, dst net.Conn, tap func() func([]byte)) {
	queue := make(chan chunk, queuedChunks)
	done := make(chan struct{})
	go func() {
		defer close(done)
		read(l, src, queue, tap)
	}()
	defer func() { <-done }()

	for {
		var c chunk
		select {
		case c = <-queue:
		case <-l.ctx.Done():
			return
		}
		if !p.due(l.ctx, c.readAt, false) {
			return
		}
		if c.eof {
			// Pass on a half-close so that request/response protocols
			// that signal the end of input still work through the proxy.
			if hc, ok := dst.(interface{ CloseWrite() error }); ok && hc.CloseWrite() == nil {
				return
			}
			l.close()
			return
		}
		if _, err := dst.Write(c.data); err != nil {
			l.close()
			return
		}
	}
}

// read queues what it reads from src, stamped with the time it was read,
// until end of stream or an error; an error closes the link. Each chunk is
// shown to the callback tap returns, if any.
func read(l *link, src net.Conn, queue chan<- chunk, tap func() func([]byte)) {
	buf := make([]byte, chunkSize)
	for {
		n, err := src.Read(buf)
		c := chunk{readAt: time.Now()}
		if n > 0 {
			c.data = append([]byte(nil), buf[:n]...)
			if tap != nil {
				if f := tap(); f != nil {
					f(append([]byte(nil), c.data...))
				}
			}
			if !enqueue(l, queue, c) {
				return
			}
		}
		if errors.Is(err, io.EOF) {
			enqueue(l, queue, chunk{readAt: c.readAt, eof: true})
			return
		}
		if err != nil {
			l.close()
			return
		}
	}
}

func enqueue(l *link, queue chan<- chunk, c chunk) bool {
	select {
	case queue <- c:
		return true
	case <-l.ctx.Done():
		return false
	}
}
