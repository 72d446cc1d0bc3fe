package main

import (
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"

	"github.com/caddyleader/caddy-leader/internal/testkit/pgtest"
)

// pgMissing is what --store postgres says when no PostgreSQL server binaries are found.
const pgMissing = `--store postgres needs PostgreSQL's server programs (initdb, pg_ctl), and none were found
(looked at pg_config --bindir and /usr/lib/postgresql/*/bin). Install them, for example:
    sudo apt-get install postgresql      # Debian, Ubuntu
    brew install postgresql              # macOS
then run ./xcaddy.sh demo --store postgres again; ./xcaddy.sh demo alone runs on etcd.`

// postgres is the demo's own PostgreSQL server: initdb into the demo's temporary directory,
// started and stopped with pg_ctl, on 127.0.0.1 only, trusting local connections.
type postgres struct {
	bin  string // the server programs' directory
	data string
	log  string
	port int
	cred *syscall.Credential // whom to run as when the demo runs as root; nil otherwise
}

// newPostgres finds the server programs the way the tests do (internal/testkit/pgtest), or exits
// with how to install them.
func newPostgres() *postgres {
	bin := pgtest.Bin()
	if bin == "" {
		die(pgMissing)
	}
	return &postgres{bin: bin}
}

// DSN is the connection string the instances use.
func (p *postgres) DSN() string {
	return fmt.Sprintf("postgres://%s@%s:%d/postgres?sslmode=disable", pgtest.Superuser, host, p.port)
}

// startPostgres creates and starts the server and returns once it accepts connections.
func (d *demo) startPostgres() {
	p := d.pg
	p.data, p.log = filepath.Join(d.tmp, "postgres"), filepath.Join(d.logs, "postgres.log")
	if os.Geteuid() == 0 {
		// PostgreSQL refuses to run as root: run it as the postgres user (Debian's package
		// creates one), which must be able to reach its data directory and log.
		u, err := user.Lookup("postgres")
		if err != nil {
			die("running as root, and there is no postgres user to run PostgreSQL as: run the demo as another user")
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		p.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		for _, dir := range []string{d.tmp, d.logs} {
			if err := os.Chmod(dir, 0o711); err != nil {
				d.fail(err.Error())
			}
		}
		if err := os.WriteFile(p.log, nil, 0o600); err != nil {
			d.fail(err.Error())
		}
		if err := os.Mkdir(p.data, 0o700); err != nil {
			d.fail(err.Error())
		}
		for _, path := range []string{p.log, p.data} {
			if err := os.Chown(path, uid, gid); err != nil {
				d.fail(err.Error())
			}
		}
	}
	if out, err := p.command("initdb", "-D", p.data, "-U", pgtest.Superuser, "--auth=trust", "-E", "UTF8", "--no-sync").CombinedOutput(); err != nil {
		d.fail(fmt.Sprintf("initdb: %v\n%s", err, out))
	}
	opts := fmt.Sprintf("-c listen_addresses=%s -c port=%d -c unix_socket_directories='' -c fsync=off", host, p.port)
	d.mu.Lock()
	d.pgStarted = true // from here on, exit stops it
	d.mu.Unlock()
	if out, err := p.command("pg_ctl", "start", "-D", p.data, "-l", p.log, "-w", "-t", "30", "-o", opts).CombinedOutput(); err != nil {
		d.fail(fmt.Sprintf("pg_ctl start: %v\n%s", err, out), "postgres")
	}
}

// stop stops the server fast: the instances are gone by then.
func (p *postgres) stop() {
	_ = p.command("pg_ctl", "stop", "-D", p.data, "-m", "fast", "-w", "-t", "20").Run()
}

func (p *postgres) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(p.bin, name), args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	if p.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred}
	}
	return cmd
}

var endpointsLine = regexp.MustCompile(`(?m)^([ \t]*)endpoints .*$`)

// postgresCaddyfile writes demo/Caddyfile with its etcd endpoints replaced by a `store
// postgres` block, and returns its path: the site stays the same file's.
func (d *demo) postgresCaddyfile() string {
	b, err := os.ReadFile(caddyfile)
	if err != nil {
		die(caddyfile + " is missing: run the demo from the repository root, as ./xcaddy.sh demo")
	}
	if !endpointsLine.Match(b) {
		die(caddyfile + ": no 'endpoints' line in the leader block to replace with the postgres store")
	}
	block := "${1}store postgres {\n${1}\tdsn " + strings.ReplaceAll(d.pg.DSN(), "$", "$$") + "\n${1}}"
	out := endpointsLine.ReplaceAll(b, []byte(block))
	path := filepath.Join(d.tmp, "Caddyfile")
	if err := os.WriteFile(path, out, 0o600); err != nil {
		d.fail(err.Error())
	}
	return path
}

// storeName is the store in words.
func (d *demo) storeName() string {
	if d.pg != nil {
		return "PostgreSQL"
	}
	return "etcd"
}

// startStore starts the store the instances elect through, and says where it is.
func (d *demo) startStore() {
	if d.pg == nil {
		d.startEtcd()
		d.note(fmt.Sprintf("etcd    %s:%d  (pid %d)", host, d.etcdPort, d.etcd.Pid()))
		return
	}
	d.startPostgres()
	d.note(fmt.Sprintf("postgres %s  (%s, data in %s)", d.pg.DSN(), d.pg.bin, d.pg.data))
}
