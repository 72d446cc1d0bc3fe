package e2e

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/websocket"

	"github.com/caddyleader/caddy-leader/internal/fleet"
)

// TestWebsocketFaults is TestFaults for websockets through the HTTP leader_gate: each
// instance proxies admitted upgrades to one websocket service, which records every message
// by the instance that admitted its connection (reverse_proxy's X-Served-By header), and a
// tunnel must not carry a message of the old term after the new term's first.
func TestWebsocketFaults(t *testing.T) {
	rec := startWebsocketService(t)
	nodes := startNodes(t, 3, fleet.Config{Backend: rec.url, Follower: "forward"})
	runFaults(t, nodes, allFaults(), rec.log, func(alive func() []*node) stopper {
		return startWebsocketWriters(writerCount, func() []string {
			var urls []string
			for _, nd := range alive() {
				urls = append(urls, strings.Replace(nd.URL(), "http://", "ws://", 1)+"/gated/ws")
			}
			return urls
		})
	})
}

// websocketService is a websocket server that acknowledges and records every message.
type websocketService struct {
	url string
	mu  sync.Mutex
	by  map[string][]entry // by the instance that admitted the connection
}

func startWebsocketService(t *testing.T) *websocketService {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &websocketService{url: "http://" + ln.Addr().String(), by: map[string][]entry{}}
	srv := &http.Server{Handler: websocket.Handler(s.serve)}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return s
}

func (s *websocketService) serve(ws *websocket.Conn) {
	servedBy := ws.Request().Header.Get("X-Served-By")
	for {
		var msg string
		if err := websocket.Message.Receive(ws, &msg); err != nil {
			return
		}
		s.mu.Lock()
		s.by[servedBy] = append(s.by[servedBy], entry{tag: msg, at: time.Now()})
		s.mu.Unlock()
		if err := websocket.Message.Send(ws, "ok"); err != nil {
			return
		}
	}
}

// log is the serviceLog of node nd: the messages of the connections it admitted.
func (s *websocketService) log(_ *testing.T, nd *node, from int) []entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	es := s.by[nd.ID]
	if from >= len(es) {
		return nil
	}
	return append([]entry(nil), es[from:]...)
}

// startWebsocketWriters starts n clients that keep sending tagged messages over a websocket,
// waiting for each acknowledgement, and reconnect through the next URL when one fails.
func startWebsocketWriters(n int, urls func() []string) *writers {
	w := &writers{stop: make(chan struct{})}
	for id := range n {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			seq, turn := 0, id
			for {
				select {
				case <-w.stop:
					return
				default:
				}
				list := urls()
				target := list[turn%len(list)]
				turn++
				ws, err := dialWebsocket(target)
				if err != nil {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				for {
					seq++
					_ = ws.SetDeadline(time.Now().Add(replyTimeout))
					var ack string
					if websocket.Message.Send(ws, fmt.Sprintf("w%d.%d", id, seq)) != nil || websocket.Message.Receive(ws, &ack) != nil {
						break
					}
					w.acked.Add(1)
					select {
					case <-w.stop:
						ws.Close()
						return
					case <-time.After(5 * time.Millisecond):
					}
				}
				ws.Close()
				time.Sleep(10 * time.Millisecond)
			}
		}()
	}
	return w
}

// dialWebsocket opens a websocket whose handshake is bounded by replyTimeout too (a frozen
// instance accepts connections but never answers).
func dialWebsocket(target string) (*websocket.Conn, error) {
	cfg, err := websocket.NewConfig(target, "http://127.0.0.1/")
	if err != nil {
		return nil, err
	}
	conn, err := net.DialTimeout("tcp", cfg.Location.Host, replyTimeout)
	if err != nil {
		return nil, err
	}
	_ = conn.SetDeadline(time.Now().Add(replyTimeout))
	ws, err := websocket.NewClient(cfg, conn)
	if err != nil {
		conn.Close()
		return nil, err
	}
	return ws, nil
}
