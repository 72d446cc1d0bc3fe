package main

import (
	"bufio"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/fleet"
)

const (
	host       = "127.0.0.1"
	caddyfile  = "demo/Caddyfile"
	caddyBin   = "./caddy"
	etcdBin    = "./etcd-local"
	nodeCount  = 3
	firstBase  = 18080
	blockCount = 6 // port blocks tried from firstBase, 100 apart
)

// demo is the state of one run: its output, its processes and its progress.
type demo struct {
	mode                         mode
	ci                           bool
	store                        string // etcd or postgres
	config                       string // the Caddyfile the instances run
	interactive                  bool   // prompts wait for Enter only where someone can press it
	bold, green, red, dim, reset string

	ttl       time.Duration // read from demo/Caddyfile, so that the checks follow the config
	writeMode string        // the first `follower` mode in demo/Caddyfile
	writeDoes string        // what a follower does with /write, in words

	httpPort  [nodeCount + 1]int // indexed by node number, 1 to 3
	adminPort [nodeCount + 1]int
	etcdPort  int
	peerPort  int
	tmp, logs string

	client *http.Client  // one connection per request, like the curl commands it prints
	input  <-chan string // lines typed on stdin; closed at its end

	passed   int
	stepNo   int
	stepName string
	checking bool // false while exploring by hand: then a surprise is only reported

	mu        sync.Mutex // guards what the cleanup on a signal reads
	node      [nodeCount + 1]*fleet.Process
	etcd      *fleet.Process
	pg        *postgres // with --store postgres
	pgStarted bool      // pg_ctl start has been run: exit stops it
	writer    *writer
	failed    bool
	keepLogs  bool // keep the logs on exit even when nothing failed (--keep-logs)
	closing   sync.Once
}

func newDemo(m mode, ci bool, store string) *demo {
	d := &demo{mode: m, ci: ci, store: store, config: caddyfile, checking: true, client: fleet.NewClient(false)}
	bins := []string{caddyBin, etcdBin}
	if store == "postgres" {
		bins = bins[:1]
		d.pg = newPostgres()
	}
	for _, bin := range bins {
		if fi, err := os.Stat(bin); err != nil || fi.Mode()&0o111 == 0 {
			die(bin + " is missing: run it as ./xcaddy.sh demo, which builds it")
		}
	}
	if !ci && terminal(os.Stdout) && os.Getenv("NO_COLOR") == "" {
		d.bold, d.green, d.red, d.dim, d.reset = "\x1b[1m", "\x1b[32m", "\x1b[31m", "\x1b[2m", "\x1b[0m"
	}
	d.interactive = !ci && terminal(os.Stdin) && terminal(os.Stdout)
	d.readCaddyfile()
	d.pickPorts()
	tmp, err := os.MkdirTemp(os.Getenv("TMPDIR"), "caddy-leader-demo.")
	if err != nil {
		die("cannot create a temporary directory")
	}
	d.tmp, d.logs = tmp, filepath.Join(tmp, "logs")
	if err := os.MkdirAll(d.logs, 0o700); err != nil {
		die("cannot create a temporary directory")
	}
	if d.pg != nil {
		d.pg.port = d.etcdPort
		d.config = d.postgresCaddyfile()
	}
	return d
}

var digits = regexp.MustCompile(`^[0-9]+$`)

func die(msg string) {
	fmt.Fprintf(os.Stderr, "demo: %s\n", msg)
	os.Exit(1)
}

func terminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// readCaddyfile reads the ttl and the follower mode of /write from demo/Caddyfile.
func (d *demo) readCaddyfile() {
	b, err := os.ReadFile(caddyfile)
	if err != nil {
		die(caddyfile + " is missing: run the demo from the repository root, as ./xcaddy.sh demo")
	}
	var ttl, follower string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		if f[0] == "ttl" && ttl == "" {
			ttl = f[1]
		}
		if f[0] == "follower" && follower == "" {
			follower = f[1]
		}
	}
	secs, _ := strings.CutSuffix(ttl, "s")
	n, err := strconv.Atoi(secs)
	if err != nil || !digits.MatchString(secs) {
		die(caddyfile + ": cannot read a ttl in whole seconds (like 'ttl 3s') from it")
	}
	d.ttl = time.Duration(n) * time.Second
	d.writeMode = follower
	switch follower {
	case "forward":
		d.writeDoes = "forward writes to the leader"
	case "redirect":
		d.writeDoes = "redirect writes to the leader"
	default:
		d.writeDoes = "answer 503 on /write"
	}
}

// setPorts lays the ports out from base: HTTP base..base+2, admin base+10..base+12, etcd
// base+20 (clients) and base+21 (peers).
func (d *demo) setPorts(base int) {
	for i := 1; i <= nodeCount; i++ {
		d.httpPort[i] = base + i - 1
		d.adminPort[i] = base + 10 + i - 1
	}
	d.etcdPort, d.peerPort = base+20, base+21
}

// busyPort returns the first port of the block at base that is in use, or 0.
func (d *demo) busyPort(base int) int {
	d.setPorts(base)
	ports := append(append([]int{}, d.httpPort[1:]...), d.adminPort[1:]...)
	for _, p := range append(ports, d.etcdPort, d.peerPort) {
		if fleet.Listening(fmt.Sprintf("%s:%d", host, p)) {
			return p
		}
	}
	return 0
}

func (d *demo) pickPorts() {
	if s := os.Getenv("DEMO_PORT_BASE"); s != "" {
		base, err := strconv.Atoi(s)
		if err != nil || !digits.MatchString(s) || base < 1024 || base > 65500 {
			die(fmt.Sprintf("DEMO_PORT_BASE=%s is not a port number between 1024 and 65500", s))
		}
		if busy := d.busyPort(base); busy != 0 {
			die(fmt.Sprintf("port %d is in use (DEMO_PORT_BASE=%d needs %d-%d, %d-%d, %d-%d): stop what uses it or pick another DEMO_PORT_BASE",
				busy, base, base, base+2, base+10, base+12, base+20, base+21))
		}
		d.setPorts(base)
		return
	}
	firstBusy := 0
	for k := range blockCount {
		base := firstBase + 100*k
		busy := d.busyPort(base)
		if busy == 0 {
			if base != firstBase {
				d.say(fmt.Sprintf("Port %d is in use, so the demo uses ports from %d (set DEMO_PORT_BASE to choose).", firstBusy, base))
			}
			d.setPorts(base)
			return
		}
		if firstBusy == 0 {
			firstBusy = busy
		}
	}
	die(fmt.Sprintf("ports from %d to %d are in use (e.g. %d): set DEMO_PORT_BASE to a free block, like DEMO_PORT_BASE=28080",
		firstBase, firstBase+100*(blockCount-1)+21, firstBusy))
}

// --- output ----------------------------------------------------------------------------

func (d *demo) say(s string)  { fmt.Println(s) }
func (d *demo) note(s string) { fmt.Printf("  %s\n", s) }
func (d *demo) cmd(s string)  { fmt.Printf("    %s%s%s\n", d.dim, s, d.reset) }

func (d *demo) ok(s string) {
	fmt.Printf("  %sok%s: %s\n", d.green, d.reset, s)
	d.passed++
}

func (d *demo) step(name string) {
	d.stepNo++
	d.stepName = name
	fmt.Printf("\n%s==> %d. %s%s\n", d.bold, d.stepNo, name, d.reset)
}

// pause waits for Enter, where someone can press it.
func (d *demo) pause(what string) {
	if d.interactive && d.mode != manual {
		fmt.Printf("\n%sPress Enter to %s (Ctrl-C stops the demo)%s ", d.dim, what, d.reset)
		<-d.lines()
	}
}

// lines returns the lines typed on stdin, read in the background so that exploring can
// poll between them.
func (d *demo) lines() <-chan string {
	if d.input == nil {
		ch := make(chan string)
		go func() {
			defer close(ch)
			sc := bufio.NewScanner(os.Stdin)
			for sc.Scan() {
				ch <- sc.Text()
			}
		}()
		d.input = ch
	}
	return d.input
}

// showLogs prints the last lines of the named logs (node-1, etcd, ...) with their paths.
func (d *demo) showLogs(names ...string) {
	for _, name := range names {
		path := filepath.Join(d.logs, name+".log")
		fmt.Fprintf(os.Stderr, "  --- last lines of %s ---\n", path)
		b, _ := os.ReadFile(path)
		lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
		if len(b) == 0 {
			lines = nil
		}
		for _, line := range lines[max(0, len(lines)-12):] {
			if len(line) > 400 {
				line = line[:400]
			}
			fmt.Fprintf(os.Stderr, "  | %s\n", line)
		}
	}
}

// fail says which step failed and why, shows the logs and exits 1.
func (d *demo) fail(msg string, logs ...string) {
	d.mu.Lock()
	d.failed = true
	d.mu.Unlock()
	fmt.Fprintf(os.Stderr, "\n%sdemo: FAILED at step %d (%s): %s%s\n", d.red, d.stepNo, d.stepName, msg, d.reset)
	d.showLogs(logs...)
	fmt.Fprintf(os.Stderr, "demo: %d passed, 1 failed\n", d.passed)
	d.exit(1)
}

// bad is fail during the walkthrough; while the user explores by hand it only says so.
func (d *demo) bad(msg string, logs ...string) {
	if d.checking {
		d.fail(msg, logs...)
	}
	d.note(fmt.Sprintf("%sunexpected%s: %s", d.red, d.reset, msg))
}

func (d *demo) interrupted(code int) {
	fmt.Printf("\n%s\n", "demo: interrupted; stopping everything it started and removing "+d.tmp)
	d.exit(code)
}

func (d *demo) internalError(r any) {
	d.mu.Lock()
	d.failed = true
	d.mu.Unlock()
	name := d.stepName
	if name == "" {
		name = "starting"
	}
	fmt.Fprintf(os.Stderr, "demo: internal error (step %d, %s): %v; please report it\n%s", d.stepNo, name, r, debug.Stack())
	d.exit(1)
}

// exit stops everything the demo started, removes its files (keeping the logs after a
// failure or with --keep-logs) and exits with code. Only the first call does so; a later one (a signal during
// the cleanup) waits for it.
func (d *demo) exit(code int) {
	d.closing.Do(func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.writer != nil {
			d.writer.halt()
		}
		var nodes []*fleet.Process
		for _, p := range d.node {
			if p != nil {
				nodes = append(nodes, p)
			}
		}
		stopAll(nodes)
		if d.etcd != nil {
			stopAll([]*fleet.Process{d.etcd})
		}
		if d.pgStarted {
			d.pg.stop()
		}
		if d.tmp != "" {
			if d.failed || d.keepLogs {
				os.RemoveAll(filepath.Join(d.tmp, "etcd"))
				os.RemoveAll(filepath.Join(d.tmp, "postgres"))
				for i := 1; i <= nodeCount; i++ {
					os.RemoveAll(filepath.Join(d.tmp, fmt.Sprintf("node-%d", i)))
				}
				fmt.Fprintf(os.Stderr, "demo: the logs are kept in %s (remove it when done)\n", d.logs)
			} else {
				os.RemoveAll(d.tmp)
				fmt.Fprintf(os.Stderr, "demo: removed %s, logs included (--keep-logs keeps them)\n", d.tmp)
			}
		}
		os.Exit(code)
	})
	select {} // another exit is under way and ends the process
}

// stopAll stops the processes together: SIGTERM, up to 10s to exit, then SIGKILL.
func stopAll(ps []*fleet.Process) {
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.Stop(10 * time.Second)
		}()
	}
	wg.Wait()
}

// logsFate says what becomes of the logs when the demo exits, where it prints their paths.
func (d *demo) logsFate() string {
	if d.keepLogs {
		return "kept when the demo exits"
	}
	return "deleted when the demo exits unless a step fails; --keep-logs keeps them"
}
