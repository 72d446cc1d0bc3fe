package faultproxy

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	// guard bounds every wait for something that must happen, so that a
	// broken proxy fails the test instead of hanging it. It is never a
	// latency expectation.
	guard = 10 * time.Second

	// quiet is how long a read waits to confirm that nothing arrives.
	quiet = 200 * time.Millisecond
)

func TestProxy(t *testing.T) {
	tests := []struct {
		name string
		run  func(t *testing.T, p *Proxy, echo *echoServer)
	}{
		{
			name: "bytes_pass_through_both_ways",
			run: func(t *testing.T, p *Proxy, echo *echoServer) {
				c := dial(t, p)
				roundTrip(t, c, []byte("hello"))
				roundTrip(t, c, payload(1<<20))
			},
		},
		{
			name: "url_and_addr_name_the_loopback_listener",
			run: func(t *testing.T, p *Proxy, echo *echoServer) {
				if !strings.HasPrefix(p.Addr(), "127.0.0.1:") {
					t.Errorf("Addr() = %q, want 127.0.0.1:PORT", p.Addr())
				}
				if want := "http://" + p.Addr(); p.URL() != want {
					t.Errorf("URL() = %q, want %q", p.URL(), want)
				}
			},
		},
		{
			name: "blackhole_holds_bytes_and_heal_delivers_them_in_order",
			run: func(t *testing.T, p *Proxy, echo *echoServer) {
				c := dial(t, p)
				roundTrip(t, c, []byte("warm"))
				p.Blackhole()
				write(t, c, []byte("abc"))
				wantSilence(t, c)
				write(t, c, []byte("def"))
				p.Heal()
				wantRead(t, c, []byte("abcdef"))
			},
		},
		{
			name: "blackhole_holds_more_than_its_buffer_and_heal_delivers_it_all_in_order",
			run: func(t *testing.T, p *Proxy, echo *echoServer) {
				c := dial(t, p)
				p.Blackhole()
				data := payload(4 << 20)
				written := writeAsync(c, data)
				wantSilence(t, c)
				p.Heal()
				wantRead(t, c, data)
				if err := <-written; err != nil {
					t.Fatalf("write: %v", err)
				}
			},
		},
		{
			name: "blackhole_accepts_new_connections_but_does_not_reach_the_target",
			run: func(t *testing.T, p *Proxy, echo *echoServer) {
				p.Blackhole()
				c := dial(t, p)
				write(t, c, []byte("x"))
				wantSilence(t, c)
				if n := echo.acceptedCount(); n != 0 {
					t.Errorf("target accepted %d connections through a blackholed proxy, want 0", n)
				}
				p.Heal()
				wantRead(t, c, []byte("x"))
			},
		},
		{
			name: "blackhole_new_holds_new_connections_and_lets_open_ones_flow",
			run: func(t *testing.T, p *Proxy, echo *echoServer) {
				open := dial(t, p)
				roundTrip(t, open, []byte("warm"))
				p.BlackholeNew()
				roundTrip(t, open, []byte("still"))
				fresh := dial(t, p)
				write(t, fresh, []byte("x"))
				wantSilence(t, fresh)
				if n := echo.acceptedCount(); n != 1 {
					t.Errorf("target accepted %d connections, want only the one open before BlackholeNew", n)
				}
				p.Heal()
				wantRead(t, fresh, []byte("x"))
			},
		},
		{
			name: "tap_sees_what_clients_send",
			run: func(t *testing.T, p *Proxy, echo *echoServer) {
				var mu sync.Mutex
				var seen []byte
				p.Tap(func(b []byte) { mu.Lock(); seen = append(seen, b...); mu.Unlock() })
				c := dial(t, p)
				roundTrip(t, c, []byte("hello"))
				mu.Lock()
				defer mu.Unlock()
				if string(seen) != "hello" {
					t.Errorf("tap saw %q, want the client's %q (and not the echo)", seen, "hello")
				}
			},
		},
		{
			name: "delay_delivers_no_earlier_than_the_delay_each_way",
			run: func(t *testing.T, p *Proxy, echo *echoServer) {
				c := dial(t, p)
				roundTrip(t, c, []byte("warm"))
				const d = 100 * time.Millisecond
				p.Delay(d)
				start := time.Now()
				roundTrip(t, c, []byte("ping"))
				if took := time.Since(start); took < 2*d {
					t.Errorf("round trip through a %v delay each way took %v, want at least %v", d, took, 2*d)
				}
			},
		},
		{
			name: "delay_preserves_order",
			run: func(t *testing.T, p *Proxy, echo *echoServer) {
				c := dial(t, p)
				p.Delay(20 * time.Millisecond)
				var want []byte
				written := make(chan error, 1)
				go func() {
					for i := range 200 {
						msg := []byte{byte(i)}
						if _, err := c.Write(msg); err != nil {
							written <- err
							return
						}
					}
					written <- nil
				}()
				for i := range 200 {
					want = append(want, byte(i))
				}
				wantRead(t, c, want)
				if err := <-written; err != nil {
					t.Fatalf("write: %v", err)
				}
			},
		},
		{
			name: "delay_zero_releases_held_bytes",
			run: func(t *testing.T, p *Proxy, echo *echoServer) {
				c := dial(t, p)
				roundTrip(t, c, []byte("warm"))
				p.Delay(time.Hour)
				write(t, c, []byte("held"))
				wantSilence(t, c)
				p.Delay(0)
				wantRead(t, c, []byte("held"))
			},
		},
		{
			name: "heal_removes_the_delay",
			run: func(t *testing.T, p *Proxy, echo *echoServer) {
				c := dial(t, p)
				roundTrip(t, c, []byte("warm"))
				p.Delay(time.Hour)
				write(t, c, []byte("held"))
				p.Heal()
				wantRead(t, c, []byte("held"))
			},
		},
		{
			name: "reset_closes_both_sides_and_new_connections_work",
			run: func(t *testing.T, p *Proxy, echo *echoServer) {
				c := dial(t, p)
				roundTrip(t, c, []byte("warm"))
				p.Reset()
				wantClosed(t, c)
				echo.waitAllClosed(t)
				roundTrip(t, dial(t, p), []byte("again"))
			},
		},
		{
			name: "reset_closes_blackholed_connections",
			run: func(t *testing.T, p *Proxy, echo *echoServer) {
				held := dial(t, p)
				roundTrip(t, held, []byte("warm"))
				p.Blackhole()
				waiting := dial(t, p) // accepted, never dialled through
				waitLinks(t, p, 2)
				write(t, held, []byte("lost"))
				p.Reset()
				wantClosed(t, held)
				wantClosed(t, waiting)
				echo.waitAllClosed(t)
			},
		},
		{
			name: "half_close_reaches_the_target_and_its_close_comes_back",
			run: func(t *testing.T, p *Proxy, echo *echoServer) {
				c := dial(t, p)
				write(t, c, []byte("bye"))
				if err := c.(*net.TCPConn).CloseWrite(); err != nil {
					t.Fatal(err)
				}
				c.SetReadDeadline(time.Now().Add(guard))
				got, err := io.ReadAll(c)
				if err != nil {
					t.Fatalf("read to end: %v", err)
				}
				if string(got) != "bye" {
					t.Errorf("read %q before end of stream, want %q", got, "bye")
				}
			},
		},
		{
			name: "unreachable_target_closes_the_client_connection",
			run: func(t *testing.T, _ *Proxy, _ *echoServer) {
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				down := ln.Addr().String()
				ln.Close()
				p := newProxy(t, down)
				wantClosed(t, dial(t, p))
			},
		},
		{
			name: "close_closes_every_connection_and_is_idempotent",
			run: func(t *testing.T, p *Proxy, echo *echoServer) {
				flowing := dial(t, p)
				roundTrip(t, flowing, []byte("warm"))
				p.Delay(time.Hour)
				delayed := dial(t, p)
				write(t, flowing, []byte("held"))
				if err := p.Close(); err != nil {
					t.Fatalf("first Close: %v", err)
				}
				if err := p.Close(); err != nil {
					t.Fatalf("second Close: %v", err)
				}
				// Close returns only after every proxy goroutine has
				// ended, so both ends of every link must be closed.
				wantClosed(t, flowing)
				wantClosed(t, delayed)
				echo.waitAllClosed(t)
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			echo := startEcho(t)
			tt.run(t, newProxy(t, echo.addr()), echo)
		})
	}
}

func newProxy(t *testing.T, target string) *Proxy {
	t.Helper()
	p, err := New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func dial(t *testing.T, p *Proxy) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatalf("dial proxy: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// waitLinks waits until the proxy has accepted n connections, which a
// client cannot tell while the link is blackholed. The proxy has no event
// for it, so this polls.
func waitLinks(t *testing.T, p *Proxy, n int) {
	t.Helper()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	timeout := time.After(guard)
	for {
		p.mu.Lock()
		got := len(p.links)
		p.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-tick.C:
		case <-timeout:
			t.Fatalf("proxy accepted %d connections, want %d", got, n)
		}
	}
}

func payload(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i * 7 / 3)
	}
	return b
}

func write(t *testing.T, c net.Conn, b []byte) {
	t.Helper()
	c.SetWriteDeadline(time.Now().Add(guard))
	if _, err := c.Write(b); err != nil {
		t.Fatalf("write: %v", err)
	}
}

// writeAsync writes b from another goroutine, for payloads that a stalled
// link will not take in one go.
func writeAsync(c net.Conn, b []byte) <-chan error {
	errc := make(chan error, 1)
	go func() {
		c.SetWriteDeadline(time.Now().Add(guard))
		_, err := c.Write(b)
		errc <- err
	}()
	return errc
}

func roundTrip(t *testing.T, c net.Conn, b []byte) {
	t.Helper()
	written := writeAsync(c, b)
	wantRead(t, c, b)
	if err := <-written; err != nil {
		t.Fatalf("write: %v", err)
	}
}

func wantRead(t *testing.T, c net.Conn, want []byte) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(guard))
	got := make([]byte, len(want))
	if n, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("read %d of %d bytes: %v", n, len(want), err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("read bytes differ from those sent (%d bytes)", len(want))
	}
}

// wantSilence checks that nothing arrives on c for a short while.
func wantSilence(t *testing.T, c net.Conn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(quiet))
	buf := make([]byte, 1)
	n, err := c.Read(buf)
	if n > 0 {
		t.Fatalf("read %q through a link that should hold it back", buf[:n])
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read on a held link: %v, want a deadline error", err)
	}
}

// wantClosed checks that the proxy closed c: a read ends with end of stream
// or a reset, not with the guard deadline.
func wantClosed(t *testing.T, c net.Conn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(guard))
	_, err := io.Copy(io.Discard, c)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("connection still open after %v", guard)
	}
}

// echoServer writes back whatever it reads and closes a connection after
// end of stream. It counts the connections it accepts and those still open.
type echoServer struct {
	ln net.Listener

	mu       sync.Mutex
	accepted int
	open     int
	changed  chan struct{} // closed and replaced when open changes
}

func startEcho(t *testing.T) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &echoServer{ln: ln, changed: make(chan struct{})}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			e.track(+1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer e.track(-1)
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	return e
}

func (e *echoServer) addr() string { return e.ln.Addr().String() }

func (e *echoServer) track(delta int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if delta > 0 {
		e.accepted++
	}
	e.open += delta
	close(e.changed)
	e.changed = make(chan struct{})
}

func (e *echoServer) acceptedCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.accepted
}

// waitAllClosed waits until the target has seen every connection closed.
func (e *echoServer) waitAllClosed(t *testing.T) {
	t.Helper()
	timeout := time.After(guard)
	for {
		e.mu.Lock()
		open, changed := e.open, e.changed
		e.mu.Unlock()
		if open == 0 {
			return
		}
		select {
		case <-changed:
		case <-timeout:
			t.Fatalf("target still has %d connections open after %v", open, guard)
		}
	}
}
