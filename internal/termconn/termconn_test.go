package termconn

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/etcdbackend"
	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
	"github.com/caddyleader/caddy-leader/internal/testkit/fleet"
)

const prefix = "/termconn-test/"

// member is one candidate whose clock a test can move forward.
type member struct {
	e    *elector.Election
	skew atomic.Int64
}

func (m *member) now() time.Time { return time.Now().Add(time.Duration(m.skew.Load())) }

func startMember(t testing.TB, endpoints []string, id, election string) *member {
	t.Helper()
	m := &member{}
	backend, err := etcdbackend.New(etcdbackend.Config{Endpoints: endpoints, Prefix: prefix, DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	_, es := fleet.StartCandidate(t, elector.Config{
		ID: id, TTL: 2 * time.Second, DrainTimeout: 5 * time.Second, Backend: backend,
		Logger: zaptest.NewLogger(t).Named(id), Now: m.now,
	}, election)
	m.e = es[0]
	return m
}

// pair starts two members of a fresh election and returns the leader first.
func pair(t testing.TB, endpoints []string, election string) (leader, follower *member) {
	a := startMember(t, endpoints, "a", election)
	b := startMember(t, endpoints, "b", election)
	if i, _ := fleet.WaitAgreed(t, 10*time.Second, []*elector.Election{a.e, b.e}); i == 1 {
		return b, a
	}
	return a, b
}

// admitPipe admits the server end of a pipe on m and returns both ends.
func admitPipe(t *testing.T, m *member, opt Options) (*Conn, net.Conn) {
	t.Helper()
	server, client := net.Pipe()
	t.Cleanup(func() { server.Close(); client.Close() })
	c, term := For(m.e).Admit(server, opt)
	if c == nil {
		t.Fatalf("not admitted: %+v", term)
	}
	return c, client
}

// waitCut waits until c is cut and its peer sees the connection closed.
func waitCut(t *testing.T, c *Conn, peer net.Conn) {
	t.Helper()
	_ = peer.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := peer.Read(make([]byte, 1)); err == nil {
		t.Fatal("the peer read a byte from a connection that should be cut")
	}
	if !c.Cut() {
		t.Fatal("the peer's read failed but the connection is not marked cut")
	}
}

func TestGuard(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	endpoints := cluster.Endpoints()

	t.Run("refused_on_a_follower", func(t *testing.T) {
		_, follower := pair(t, endpoints, "refused")
		server, client := net.Pipe()
		defer server.Close()
		defer client.Close()
		if c, _ := For(follower.e).Admit(server, Options{Kind: "test"}); c != nil {
			t.Fatal("a follower admitted a connection")
		}
	})

	t.Run("handover_cuts_before_the_key_is_released", func(t *testing.T) {
		leader, follower := pair(t, endpoints, "handover")
		reports := make(chan Cut, 4)
		For(leader.e).SetReporter(func(c Cut) { reports <- c })
		c, peer := admitPipe(t, leader, Options{Kind: "test"})
		resigned := make(chan error, 1)
		go func() { resigned <- leader.e.Resign(context.Background(), time.Minute) }()
		waitCut(t, c, peer)
		if _, err := c.Write([]byte("x")); !errors.Is(err, ErrCut) {
			t.Fatalf("write on a cut connection: %v, want ErrCut", err)
		}
		// The handover waits for the connection's handler: no successor before Done.
		time.Sleep(200 * time.Millisecond)
		if _, leads := follower.e.Check(); leads {
			t.Fatal("the follower leads while the cut connection's handler has not returned")
		}
		select {
		case err := <-resigned:
			t.Fatalf("resign returned (%v) before the connection was done", err)
		default:
		}
		want := Cut{Election: "handover", Token: c.Term().Token, Kind: "test", Reason: ReasonHandover, Count: 1}
		if got := <-reports; got != want {
			t.Errorf("reported %+v, want %+v", got, want)
		}
		c.Done()
		if err := <-resigned; err != nil {
			t.Fatal(err)
		}
		fleet.WaitAgreed(t, 10*time.Second, []*elector.Election{follower.e})
	})

	t.Run("drain_lets_a_connection_go_on_then_cuts_it", func(t *testing.T) {
		leader, _ := pair(t, endpoints, "drain")
		c, peer := admitPipe(t, leader, Options{Kind: "test", Drain: 500 * time.Millisecond})
		defer c.Done()
		go func() { _ = leader.e.Resign(context.Background(), time.Minute) }()
		for !leader.e.Term().Draining {
			time.Sleep(time.Millisecond)
		}
		go func() { _, _ = c.Write([]byte("x")) }()
		_ = peer.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		if _, err := peer.Read(make([]byte, 1)); err != nil {
			t.Fatalf("no byte during the drain: %v", err)
		}
		waitCut(t, c, peer)
	})

	t.Run("deadline_cuts_without_the_store", func(t *testing.T) {
		leader, _ := pair(t, endpoints, "deadline")
		c, peer := admitPipe(t, leader, Options{Kind: "test"})
		defer c.Done()
		go func() { _, _ = peer.Write([]byte("late")) }()
		leader.skew.Store(int64(3 * time.Second)) // past the lease and heartbeat deadlines
		if n, err := c.Read(make([]byte, 8)); !errors.Is(err, ErrCut) {
			t.Fatalf("read after the deadline: %d bytes, %v; want ErrCut", n, err)
		}
		if !c.Cut() {
			t.Fatal("not cut")
		}
	})

	t.Run("a_follower_cuts_what_it_handed_to_a_term_that_ended", func(t *testing.T) {
		leader, follower := pair(t, endpoints, "followed")
		server, peer := net.Pipe()
		t.Cleanup(func() { server.Close(); peer.Close() })
		term := follower.e.Term()
		if term.Holds() || term.Token != leader.e.Term().Token {
			t.Fatalf("the follower does not follow the leader's term: %+v", term)
		}
		c := For(follower.e).Follow(server, term, Options{Kind: "test"})
		defer c.Done()
		go func() { _, _ = peer.Write([]byte("x")) }()
		if _, err := c.Read(make([]byte, 1)); err != nil {
			t.Fatalf("no byte through the handed connection while its term lasts: %v", err)
		}
		if err := leader.e.Resign(context.Background(), time.Minute); err != nil {
			t.Fatal(err)
		}
		waitCut(t, c, peer)
	})

	t.Run("key_deleted_cuts", func(t *testing.T) {
		leader, _ := pair(t, endpoints, "deleted")
		c, peer := admitPipe(t, leader, Options{Kind: "test"})
		defer c.Done()
		if _, err := cluster.Client(t).Delete(context.Background(), prefix+"deleted"); err != nil {
			t.Fatal(err)
		}
		waitCut(t, c, peer)
	})
}
