// Package pgtest starts real PostgreSQL servers on 127.0.0.1 for tests: initdb and pg_ctl
// from the installed binaries, a free port, and a data directory that is removed afterwards.
package pgtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/caddyleader/caddy-leader/internal/testkit/freeport"
)

// CIEnv names the environment variable that, when set, turns a missing PostgreSQL from a
// skipped test into a failed one, so that CI cannot pass by testing nothing.
const CIEnv = "CI"

// Superuser is the name of the superuser every server is initialised with. Local
// connections are trusted: no password.
const Superuser = "postgres"

// Server is one PostgreSQL server (a "cluster" in PostgreSQL's words) in a temp directory.
type Server struct {
	bin  string
	dir  string // the data directory
	log  string
	Port int
	cred *syscall.Credential // whom to run as when the test runs as root

	mu      sync.Mutex
	running bool
}

// Options change the server that StartWith starts.
type Options struct {
	// Settings are extra postgresql.conf lines ("name = value").
	Settings []string
}

// Bin returns the directory of the PostgreSQL server binaries, or "" if there are none:
// pg_config --bindir first, then the newest /usr/lib/postgresql/*/bin (Debian's layout).
func Bin() string {
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		dir := strings.TrimSpace(string(out))
		if _, err := os.Stat(filepath.Join(dir, "initdb")); err == nil {
			return dir
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d
		}
	}
	return ""
}

func version(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

// Require returns the binaries' directory, or skips the test when PostgreSQL is not
// installed (fails it when the CI variable is set).
func Require(t testing.TB) string {
	t.Helper()
	bin := Bin()
	if bin == "" {
		if os.Getenv(CIEnv) != "" {
			t.Fatalf("pgtest: PostgreSQL is not installed (initdb not found), and %s is set", CIEnv)
		}
		t.Skip("pgtest: PostgreSQL is not installed (initdb not found)")
	}
	return bin
}

// Start initialises and starts a server; t.Cleanup stops it and removes its files.
func Start(t testing.TB) *Server {
	t.Helper()
	return StartWith(t, Options{})
}

// StartWith is Start with opts. With -short (the quick tier of tests) it skips the test
// instead: a real store is for the full run.
func StartWith(t testing.TB, opts Options) *Server {
	t.Helper()
	if testing.Short() {
		t.Skip("pgtest: starts a PostgreSQL server; skipped with -short")
	}
	s := newServer(t)
	s.run(t, filepath.Join(s.bin, "initdb"), "-D", s.dir, "-U", Superuser, "--auth=trust", "-E", "UTF8", "--no-sync")
	s.configure(t, opts.Settings)
	s.Start(t)
	return s
}

func newServer(t testing.TB) *Server {
	t.Helper()
	bin := Require(t)
	ports, err := freeport.Pick(1)
	if err != nil {
		t.Fatal(err)
	}
	// Not t.TempDir: its parents are private to this user, and the server may run as
	// another (PostgreSQL refuses to run as root).
	base, err := os.MkdirTemp("", "pgtest-")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{bin: bin, dir: filepath.Join(base, "data"), log: filepath.Join(base, "server.log"), Port: ports[0]}
	t.Cleanup(func() {
		s.stop("immediate")
		if t.Failed() {
			if b, err := os.ReadFile(s.log); err == nil {
				t.Logf("pgtest: server log of port %d:\n%s", s.Port, tail(string(b), 40))
			}
		}
		os.RemoveAll(base)
	})
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			u, err = user.Lookup("nobody")
		}
		if err != nil {
			t.Fatalf("pgtest: running as root and no unprivileged user to run PostgreSQL as: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(base, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func tail(s string, lines int) string {
	l := strings.Split(s, "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}

func (s *Server) configure(t testing.TB, extra []string) {
	t.Helper()
	conf := []string{
		"listen_addresses = '127.0.0.1'",
		fmt.Sprintf("port = %d", s.Port),
		"unix_socket_directories = ''",
		// Tests crash servers on purpose, never the machine: durability against power
		// loss only costs time here.
		"fsync = off",
		"full_page_writes = off",
		"shared_buffers = 16MB",
		"max_connections = 60",
		"wal_level = replica",
		"max_wal_senders = 4",
		"shared_preload_libraries = 'pg_stat_statements'",
	}
	conf = append(conf, extra...)
	f, err := os.OpenFile(filepath.Join(s.dir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("\n" + strings.Join(conf, "\n") + "\n"); err != nil {
		t.Fatal(err)
	}
	hba := "host all all 127.0.0.1/32 trust\nhost replication all 127.0.0.1/32 trust\n"
	if err := os.WriteFile(filepath.Join(s.dir, "pg_hba.conf"), []byte(hba), 0o600); err != nil {
		t.Fatal(err)
	}
	if s.cred != nil {
		os.Chown(filepath.Join(s.dir, "pg_hba.conf"), int(s.cred.Uid), int(s.cred.Gid))
	}
}

// run runs a PostgreSQL tool as the server's user and fails the test if it fails.
func (s *Server) run(t testing.TB, name string, args ...string) {
	t.Helper()
	if out, err := s.command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("pgtest: %s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, out)
	}
}

func (s *Server) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	return cmd
}

// Start starts the server (again, after Stop or Crash) on the same port and waits until
// it accepts connections.
func (s *Server) Start(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.run(t, filepath.Join(s.bin, "pg_ctl"), "start", "-w", "-t", "60", "-D", s.dir, "-l", s.log)
	s.running = true
}

// Stop shuts the server down cleanly (pg_ctl stop -m fast).
func (s *Server) Stop(t testing.TB) {
	t.Helper()
	if err := s.stop("fast"); err != nil {
		t.Fatal(err)
	}
}

// Crash stops the server as a crash would (pg_ctl stop -m immediate): no checkpoint,
// clients cut off at once, crash recovery on the next start.
func (s *Server) Crash(t testing.TB) {
	t.Helper()
	if err := s.stop("immediate"); err != nil {
		t.Fatal(err)
	}
}

func (s *Server) stop(mode string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.running {
		return nil
	}
	out, err := s.command(filepath.Join(s.bin, "pg_ctl"), "stop", "-w", "-m", mode, "-D", s.dir).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pgtest: pg_ctl stop -m %s: %v\n%s", mode, err, out)
	}
	s.running = false
	return nil
}

// Log returns what the server has logged so far.
func (s *Server) Log(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile(s.log)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return fmt.Sprintf("127.0.0.1:%d", s.Port) }

// DSN is a connection URL for the superuser to database postgres, with TLS off.
func (s *Server) DSN() string {
	return fmt.Sprintf("postgres://%s@%s/postgres?sslmode=disable", Superuser, s.Addr())
}

// connect opens a connection as the superuser, for a request of 30 s at most; done
// closes it.
func (s *Server) connect(t testing.TB) (ctx context.Context, conn *pgx.Conn, done func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	conn, err := pgx.Connect(ctx, s.DSN())
	if err != nil {
		cancel()
		t.Fatalf("pgtest: connect: %v", err)
	}
	return ctx, conn, func() {
		conn.Close(ctx)
		cancel()
	}
}

// Exec runs sql (one or more statements, no parameters) as the superuser.
func (s *Server) Exec(t testing.TB, sql string) {
	t.Helper()
	ctx, conn, done := s.connect(t)
	defer done()
	if _, err := conn.Exec(ctx, sql, pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatalf("pgtest: %s: %v", sql, err)
	}
}

// QueryInt runs a query that returns one integer, as the superuser.
func (s *Server) QueryInt(t testing.TB, sql string) int64 {
	t.Helper()
	ctx, conn, done := s.connect(t)
	defer done()
	var n int64
	if err := conn.QueryRow(ctx, sql).Scan(&n); err != nil {
		t.Fatalf("pgtest: %s: %v", sql, err)
	}
	return n
}

// StartReplica starts an asynchronous streaming replica of s (pg_basebackup -R), on a
// port of its own; t.Cleanup stops it.
func (s *Server) StartReplica(t testing.TB) *Server {
	t.Helper()
	return s.StartReplicaVia(t, s.Addr())
}

// StartReplicaVia is StartReplica for a replica that streams from addr (host:port), a
// fault proxy in front of s, say, so that a test can make it miss writes.
func (s *Server) StartReplicaVia(t testing.TB, addr string) *Server {
	t.Helper()
	r := newServer(t)
	s.run(t, filepath.Join(s.bin, "pg_basebackup"), "-h", "127.0.0.1", "-p", strconv.Itoa(s.Port),
		"-U", Superuser, "-D", r.dir, "-R", "-X", "stream", "--no-sync")
	f, err := os.OpenFile(filepath.Join(r.dir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(f, "\nport = %d\nhot_standby = on\n", r.Port)
	f.Close()
	// pg_basebackup -R wrote primary_conninfo to postgresql.auto.conf, which is read last.
	auto, err := os.OpenFile(filepath.Join(r.dir, "postgresql.auto.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := strings.Cut(addr, ":")
	fmt.Fprintf(auto, "primary_conninfo = 'host=%s port=%s user=%s'\n", host, port, Superuser)
	auto.Close()
	r.Start(t)
	return r
}

// Promote makes a replica a primary (pg_ctl promote) and waits until it accepts writes.
func (s *Server) Promote(t testing.TB) {
	t.Helper()
	s.run(t, filepath.Join(s.bin, "pg_ctl"), "promote", "-w", "-D", s.dir)
}
