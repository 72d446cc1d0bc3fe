//go:build unix

package e2e

import (
	"context"
	"encoding/csv"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/freeport"
)

// The HAProxy recipe's files, which TestHAProxy runs as they are.
const (
	haproxyCaddyfile     = "../deploy/haproxy/Caddyfile"
	haproxyForward       = "../deploy/haproxy/forward.cfg"
	haproxyActivePassive = "../deploy/haproxy/active-passive.cfg"
)

// haproxyBin finds Debian's haproxy. Without it the test skips, except in CI (the CI
// environment variable is set), where ./test.sh (run by .ci/run) installs it and its absence is a failure.
func haproxyBin(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("haproxy"); err == nil {
		return p
	}
	// Debian installs it in /usr/sbin, which a user's PATH may leave out.
	if _, err := os.Stat("/usr/sbin/haproxy"); err == nil {
		return "/usr/sbin/haproxy"
	}
	if os.Getenv("CI") != "" {
		t.Fatal("haproxy is not installed, and CI is set: ./test.sh installs it (apt-get install haproxy)")
	}
	t.Skip("haproxy is not installed (apt-get install haproxy); skipped outside CI")
	return ""
}

// startRecipeInstance starts the recipe's Caddyfile as instance id on the given ports, with
// the environment the Caddyfile reads. The instance belongs to owner, which kills it when
// it ends.
func startRecipeInstance(owner *testing.T, id string, httpPort, adminPort int, etcd []string, app string) (*Instance, error) {
	caddyfile, err := filepath.Abs(haproxyCaddyfile)
	if err != nil {
		return nil, err
	}
	in := newInstance(owner, id, httpPort, adminPort)
	env := []string{
		"CADDY_ADMIN=" + fmt.Sprintf("127.0.0.1:%d", adminPort),
		"ETCD_ENDPOINTS=" + strings.Join(etcd, " "),
		"HOSTNAME=" + id,
		"ADVERTISE_URL=" + in.URL(),
		"PORT=" + strconv.Itoa(httpPort),
		"APP_UPSTREAM=" + strings.TrimPrefix(app, "http://"),
	}
	if err := in.Launch(caddyBin, env, "run", "--adapter", "caddyfile", "--config", caddyfile); err != nil {
		return nil, fmt.Errorf("instance %s: %v\n--- log ---\n%s", id, err, in.Tail())
	}
	return in, nil
}

// HAProxy is one haproxy process started by a test.
type HAProxy struct {
	// URL is where clients reach the frontend.
	URL       string
	statsURL  string
	logPath   string
	cmd       *exec.Cmd
	exited    chan struct{}
	servers   map[string]*Instance // by HAProxy server name
	serverIDs []string             // HAProxy server names, in the config's order
}

// StartHAProxy runs haproxy with the recipe's config file cfg in front of fleet (caddy-1 is
// fleet[0], and so on), plus a stats page for the test to read server states from.
func StartHAProxy(t *testing.T, bin, cfg string, fleet []*Instance) *HAProxy {
	t.Helper()
	ports, err := freeport.Pick(2)
	if err != nil {
		t.Fatalf("free ports: %v", err)
	}
	dir := t.TempDir()
	stats := filepath.Join(dir, "stats.cfg")
	// Test-only: a stats page that logs nothing (the test polls it).
	statsCfg := fmt.Sprintf("listen stats\n\tbind 127.0.0.1:%d\n\tmode http\n\thttp-request set-log-level silent\n\tstats enable\n\tstats uri /stats\n", ports[1])
	if err := os.WriteFile(stats, []byte(statsCfg), 0o600); err != nil {
		t.Fatal(err)
	}
	hp := &HAProxy{
		URL:      fmt.Sprintf("http://127.0.0.1:%d", ports[0]),
		statsURL: fmt.Sprintf("http://127.0.0.1:%d/stats;csv", ports[1]),
		logPath:  filepath.Join(dir, "haproxy.log"),
		exited:   make(chan struct{}),
		servers:  make(map[string]*Instance),
	}
	env := append(os.Environ(), fmt.Sprintf("HAPROXY_BIND=127.0.0.1:%d", ports[0]))
	for i, in := range fleet {
		name := fmt.Sprintf("caddy-%d", i+1)
		hp.servers[name] = in
		hp.serverIDs = append(hp.serverIDs, name)
		env = append(env, fmt.Sprintf("CADDY_%d=127.0.0.1:%d", i+1, in.HTTPPort))
	}
	logFile, err := os.Create(hp.logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	hp.cmd = exec.Command(bin, "-db", "-f", cfg, "-f", stats)
	hp.cmd.Env = env
	hp.cmd.Stdout, hp.cmd.Stderr = logFile, logFile
	hp.cmd.SysProcAttr = childProcAttr()
	if err := hp.cmd.Start(); err != nil {
		t.Fatalf("start haproxy: %v", err)
	}
	go func() {
		_ = hp.cmd.Wait()
		close(hp.exited)
	}()
	t.Cleanup(func() {
		_ = hp.cmd.Process.Signal(syscall.SIGKILL)
		<-hp.exited
		if t.Failed() {
			t.Logf("--- haproxy log (%s) ---\n%s", cfg, hp.tail())
		}
	})
	deadline := time.Now().Add(startTimeout)
	for {
		if _, err := hp.States(); err == nil {
			return hp
		}
		select {
		case <-hp.exited:
			t.Fatalf("haproxy exited during start\n%s", hp.tail())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("haproxy: stats page not up within %v\n%s", startTimeout, hp.tail())
		}
	}
}

// tail returns the end of HAProxy's log.
func (hp *HAProxy) tail() string {
	b, err := os.ReadFile(hp.logPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	const limit = 32 << 10
	if len(b) > limit {
		b = b[len(b)-limit:]
	}
	return string(b)
}

// States returns the check state ("UP", "DOWN", ...) of every server, keyed by
// "backend/server".
func (hp *HAProxy) States() (map[string]string, error) {
	resp, err := do(context.Background(), http.MethodGet, hp.statsURL, nil)
	if err != nil {
		return nil, err
	}
	records, err := csv.NewReader(strings.NewReader(strings.TrimPrefix(resp.Body, "# "))).ReadAll()
	if err != nil || len(records) == 0 {
		return nil, fmt.Errorf("stats: %v", err)
	}
	col := map[string]int{}
	for i, name := range records[0] {
		col[name] = i
	}
	states := map[string]string{}
	for _, r := range records[1:] {
		if sv := r[col["svname"]]; sv != "FRONTEND" && sv != "BACKEND" {
			states[r[col["pxname"]]+"/"+sv] = r[col["status"]]
		}
	}
	return states, nil
}

// WaitStates waits until every server of backend is UP exactly when up says so.
func (hp *HAProxy) WaitStates(t *testing.T, backend string, up func(*Instance) bool) {
	t.Helper()
	deadline := time.Now().Add(electTimeout)
	for {
		states, err := hp.States()
		ok := err == nil
		for _, name := range hp.serverIDs {
			if ok && (states[backend+"/"+name] == "UP") != up(hp.servers[name]) {
				ok = false
			}
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("haproxy backend %s: servers not in the wanted states within %v: %v (%v)", backend, electTimeout, states, err)
		}
		time.Sleep(pollInterval)
	}
}

// WaitDown waits until no backend has in UP, and returns when it saw that.
func (hp *HAProxy) WaitDown(t *testing.T, in *Instance) time.Time {
	t.Helper()
	deadline := time.Now().Add(electTimeout)
	for {
		states, err := hp.States()
		up := err != nil
		for key, state := range states {
			_, name, _ := strings.Cut(key, "/")
			if hp.servers[name] == in && state == "UP" {
				up = true
			}
		}
		if !up {
			return time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatalf("haproxy: %s still up %v later: %v (%v)", in, electTimeout, states, err)
		}
		time.Sleep(pollInterval)
	}
}

// hasBackend says whether hp's config has the named backend.
func (hp *HAProxy) hasBackend(name string) bool {
	states, _ := hp.States()
	for key := range states {
		if strings.HasPrefix(key, name+"/") {
			return true
		}
	}
	return false
}

// Replace tells hp that server in now runs as next (a restart on the same ports).
func (hp *HAProxy) Replace(in, next *Instance) {
	for name, s := range hp.servers {
		if s == in {
			hp.servers[name] = next
		}
	}
}

// writeApp is the application behind the fleet: it answers every request with the
// leader id and fencing token that Caddy sent along, and records the tokens of writes in
// the order they arrive.
type writeApp struct {
	*httptest.Server
	mu     sync.Mutex
	tokens []int64
	bad    []string
}

func startWriteApp(t *testing.T) *writeApp {
	a := &writeApp{}
	a.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		id, token := r.Header.Get("X-Leader-Id"), r.Header.Get("X-Fencing-Token")
		if r.Method == http.MethodPost {
			n, err := strconv.ParseInt(token, 10, 64)
			a.mu.Lock()
			if err != nil || id == "" {
				a.bad = append(a.bad, fmt.Sprintf("write without a leader id or token: id %q, token %q", id, token))
			}
			a.tokens = append(a.tokens, n)
			a.mu.Unlock()
		}
		fmt.Fprintf(w, "%s %s", id, token)
	}))
	t.Cleanup(a.Close)
	return a
}

// problems returns the writes that came without a token, or with a token lower than an
// earlier write's (two leaders' writes interleaved), and forgets the writes seen so far.
func (a *writeApp) problems() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	problems := a.bad
	for i := 1; i < len(a.tokens) && len(problems) < 10; i++ {
		if a.tokens[i] < a.tokens[i-1] {
			problems = append(problems, fmt.Sprintf("write %d reached the application with token %d after a write with token %d (after a graceful handover this cannot happen; after a lease lost to an overloaded machine it can: see docs/safety.md)", i, a.tokens[i], a.tokens[i-1]))
		}
	}
	a.bad, a.tokens = nil, nil
	return problems
}

// loadClient sends the load: its own connection pool, big enough for 200 req/s of
// requests that may be held for seconds.
var loadClient = &http.Client{
	Transport: &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: requestTimeout}).DialContext,
		MaxIdleConnsPerHost: 512,
	},
	Timeout: 10 * time.Second,
}

// Outcome is one request of a Load.
type Outcome struct {
	Sent    time.Time
	Latency time.Duration
	Status  int
	// RetryAfter is the Retry-After header: the gate sets it on its 503, HAProxy does not
	// on its own.
	RetryAfter string
	Body       string
	Err        error
}

// Failed says whether the client saw anything but a 200.
func (o Outcome) Failed() bool { return o.Err != nil || o.Status != http.StatusOK }

func (o Outcome) String() string {
	if o.Err != nil {
		return fmt.Sprintf("%s: %v", o.Sent.Format("15:04:05.000"), o.Err)
	}
	return fmt.Sprintf("%s: %d %q after %v", o.Sent.Format("15:04:05.000"), o.Status, o.Body, o.Latency)
}

// Load sends POSTs to url at a steady rate (an open loop: a slow answer does not slow the
// sending) until Stop.
type Load struct {
	cancel   context.CancelFunc
	sender   sync.WaitGroup
	inflight sync.WaitGroup
	mu       sync.Mutex
	outcomes []Outcome
}

// StartLoad starts sending rate POSTs a second to url.
func StartLoad(url string, rate int) *Load {
	ctx, cancel := context.WithCancel(context.Background())
	l := &Load{cancel: cancel}
	l.sender.Add(1)
	go func() {
		defer l.sender.Done()
		start := time.Now()
		for i := 0; ; i++ {
			next := start.Add(time.Duration(i) * time.Second / time.Duration(rate))
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Until(next)):
			}
			l.inflight.Add(1)
			go func() {
				defer l.inflight.Done()
				l.send(url)
			}()
		}
	}()
	return l
}

func (l *Load) send(url string) {
	o := Outcome{Sent: time.Now()}
	resp, err := loadClient.Post(url, "text/plain", strings.NewReader("write"))
	if err == nil {
		b, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		o.Status, o.RetryAfter, o.Body, err = resp.StatusCode, resp.Header.Get("Retry-After"), string(b), rerr
	}
	o.Err, o.Latency = err, time.Since(o.Sent)
	l.mu.Lock()
	l.outcomes = append(l.outcomes, o)
	l.mu.Unlock()
}

// Stop stops sending, waits for the answers to the requests sent, and returns them.
func (l *Load) Stop() []Outcome {
	l.cancel()
	l.sender.Wait()
	l.inflight.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.outcomes
}

// tally counts the failures of outcomes and finds the slowest answer.
func tally(outcomes []Outcome) (failed []Outcome, slowest time.Duration) {
	for _, o := range outcomes {
		if o.Failed() {
			failed = append(failed, o)
		}
		slowest = max(slowest, o.Latency)
	}
	return failed, slowest
}
