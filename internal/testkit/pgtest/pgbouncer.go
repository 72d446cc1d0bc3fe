package pgtest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/freeport"
)

// PgBouncerBin is where Debian's pgbouncer package installs the pooler.
const PgBouncerBin = "/usr/sbin/pgbouncer"

// PgBouncer is a PgBouncer in transaction pooling mode in front of one Server.
type PgBouncer struct {
	Port int
}

// StartPgBouncer starts PgBouncer in transaction mode in front of s, on a free port; it
// skips the test when PgBouncer is not installed (fails it when the CI variable is set).
// t.Cleanup stops it.
func StartPgBouncer(t testing.TB, s *Server) *PgBouncer {
	t.Helper()
	bin := PgBouncerBin
	if _, err := os.Stat(bin); err != nil {
		if p, err := exec.LookPath("pgbouncer"); err == nil {
			bin = p
		} else if os.Getenv(CIEnv) != "" {
			t.Fatalf("pgtest: pgbouncer is not installed, and %s is set", CIEnv)
		} else {
			t.Skip("pgtest: pgbouncer is not installed")
		}
	}
	ports, err := freeport.Pick(1)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "pgbouncer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ini := fmt.Sprintf(`[databases]
postgres = host=127.0.0.1 port=%d dbname=postgres
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
max_client_conn = 200
default_pool_size = 4
ignore_startup_parameters = extra_float_digits
logfile = %s
`, s.Port, ports[0], filepath.Join(dir, "users.txt"), filepath.Join(dir, "pgbouncer.log"))
	files := map[string]string{"pgbouncer.ini": ini, "users.txt": fmt.Sprintf("%q \"\"\n", Superuser)}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if s.cred != nil {
		os.Chown(dir, int(s.cred.Uid), int(s.cred.Gid))
	}
	cmd := s.command(bin, filepath.Join(dir, "pgbouncer.ini"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			if b, err := os.ReadFile(filepath.Join(dir, "pgbouncer.log")); err == nil {
				t.Logf("pgbouncer log:\n%s", tail(string(b), 30))
			}
		}
	})
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	for deadline := time.Now().Add(10 * time.Second); ; {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pgtest: pgbouncer does not listen on %s: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return &PgBouncer{Port: ports[0]}
}

// DSN is a connection URL through the pooler.
func (p *PgBouncer) DSN() string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/postgres?sslmode=disable", Superuser, p.Port)
}
