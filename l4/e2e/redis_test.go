package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/fleet"
)

// redisServer is one redis-server this test started, the TCP service behind one instance.
type redisServer struct {
	addr  string
	admin *respConn // the checker's own connection
	// ownConns is how many connections the test itself made (the readiness probe, admin).
	ownConns int
}

// startRedis starts redis-server on port, without persistence, killed when the test ends.
func startRedis(t testing.TB, port int) *redisServer {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server is not installed (apt-get install redis-server): %v", err)
	}
	dir := t.TempDir()
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	proc, err := fleet.StartProcess(fleet.ProcessSpec{
		Path: bin,
		Args: []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--dir", dir, "--daemonize", "no", "--protected-mode", "no"},
		LogPath: filepath.Join(dir, "redis.log"),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = proc.Signal(syscall.SIGKILL)
		proc.WaitExit(fleet.ExitTimeout)
	})
	if err := proc.WaitReady(10*time.Second, fleet.ListeningOn(addr)); err != nil {
		t.Fatalf("redis-server on %s: %v\n%s", addr, err, proc.Tail(4096))
	}
	admin, err := dialRESP(addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	r := &redisServer{addr: addr, admin: admin}
	r.ownConns = r.connectionsReceived(t)
	return r
}

// entry is one write as the service recorded it: who sent it and when it arrived.
type entry struct {
	tag string
	at  time.Time // the server's clock (the same host's as the test's)
}

// logScript appends the caller's tag and the server's time of arrival to the list `log`.
const logScript = `local t = redis.call('TIME'); redis.call('RPUSH', 'log', ARGV[1] .. ' ' .. t[1] .. string.format('%06d', t[2])); return 1`

// entries returns the service's log from position from on.
func (r *redisServer) entries(t testing.TB, from int) []entry {
	t.Helper()
	reply, err := r.admin.do("LRANGE", "log", strconv.Itoa(from), "-1")
	if err != nil {
		t.Fatalf("LRANGE on %s: %v", r.addr, err)
	}
	list, _ := reply.([]any)
	out := make([]entry, 0, len(list))
	for _, v := range list {
		tag, usec, _ := strings.Cut(v.(string), " ")
		n, err := strconv.ParseInt(usec, 10, 64)
		if err != nil {
			t.Fatalf("log entry %q: %v", v, err)
		}
		out = append(out, entry{tag: tag, at: time.UnixMicro(n)})
	}
	return out
}

// length is the number of entries in the service's log.
func (r *redisServer) length(t testing.TB) int {
	t.Helper()
	reply, err := r.admin.do("LLEN", "log")
	if err != nil {
		t.Fatalf("LLEN on %s: %v", r.addr, err)
	}
	return int(reply.(int64))
}

// relayedConns is how many connections the service accepted besides the test's own.
func (r *redisServer) relayedConns(t testing.TB) int {
	t.Helper()
	return r.connectionsReceived(t) - r.ownConns
}

// connectionsReceived is how many connections the service has accepted.
func (r *redisServer) connectionsReceived(t testing.TB) int {
	t.Helper()
	reply, err := r.admin.do("INFO", "stats")
	if err != nil {
		t.Fatalf("INFO on %s: %v", r.addr, err)
	}
	for _, line := range strings.Split(reply.(string), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "total_connections_received:"); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	t.Fatalf("INFO stats on %s has no total_connections_received", r.addr)
	return 0
}

// respConn speaks the Redis protocol (RESP2) over one connection.
type respConn struct {
	net.Conn
	r *bufio.Reader
}

func dialRESP(addr string, timeout time.Duration) (*respConn, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	return &respConn{Conn: c, r: bufio.NewReader(c)}, nil
}

// do sends one command and reads its reply.
func (c *respConn) do(args ...string) (any, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write([]byte(b.String())); err != nil {
		return nil, err
	}
	return c.reply()
}

// reply reads one RESP2 reply: an error reply is returned as an error.
func (c *respConn) reply() (any, error) {
	line, err := c.r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return nil, fmt.Errorf("empty reply line")
	}
	switch line[0] {
	case '+':
		return line[1:], nil
	case '-':
		return nil, fmt.Errorf("redis: %s", line[1:])
	case ':':
		return strconv.ParseInt(line[1:], 10, 64)
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return nil, err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(c.r, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(line[1:])
		if err != nil {
			return nil, err
		}
		list := make([]any, 0, max(n, 0))
		for range n {
			v, err := c.reply()
			if err != nil {
				return nil, err
			}
			list = append(list, v)
		}
		return list, nil
	}
	return nil, fmt.Errorf("unexpected reply %q", line)
}
