package e2e

import (
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/websocket"

	"github.com/caddyleader/caddy-leader/internal/testkit/fleet"
)

// TestWebsocketFaults is TestFaults for websockets through the HTTP leader_gate: each
// instance proxies admitted upgrades to one websocket service, which records every message
// by the instance that admitted its connection (reverse_proxy's X-Served-By header), and a
// tunnel must not carry a message of the old term after the new term's first.
func TestWebsocketFaults(t *testing.T) {
	rec := startWebsocketService(t)
	nodes := startNodes(t, 3, fleet.Config{Backend: rec.url, Follower: "forward"})
	runFaults(t, nodes, allFaults(), rec.log, "http", func(alive func() []*node) stopper {
		return startWriters(writerCount, func() []string {
			var urls []string
			for _, nd := range alive() {
				urls = append(urls, strings.Replace(nd.URL(), "http://", "ws://", 1)+"/gated/ws")
			}
			return urls
		}, dialWebsocket)
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

// dialWebsocket opens a websocket whose handshake is bounded by replyTimeout too (a frozen
// instance accepts connections but never answers).
func dialWebsocket(target string) (session, error) {
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
	return websocketSession{ws}, nil
}

// websocketSession sends each write as a message and waits for the acknowledgement.
type websocketSession struct{ *websocket.Conn }

func (s websocketSession) write(tag string) error {
	_ = s.SetDeadline(time.Now().Add(replyTimeout))
	if err := websocket.Message.Send(s.Conn, tag); err != nil {
		return err
	}
	var ack string
	return websocket.Message.Receive(s.Conn, &ack)
}
