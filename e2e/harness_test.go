//go:build unix

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/freeport"
)

// ttl is every instance's lease TTL: etcd's minimum for its default 1s election timeout,
// so that failovers take seconds.
const ttl = 2 * time.Second

// Bounds on waits. They say when to give up, not how fast things should be.
const (
	// startTimeout bounds a Caddy process becoming ready (admin API and HTTP port answer).
	startTimeout = 20 * time.Second
	// electTimeout bounds a fresh fleet agreeing on its first leader.
	electTimeout = 15 * time.Second
	// exitTimeout bounds a signalled process exiting; SIGTERM may drain for the default
	// drain_timeout (10s).
	exitTimeout = 30 * time.Second
	// requestTimeout bounds one HTTP request to an instance. A stopped process never
	// answers, so it must be short.
	requestTimeout = 2 * time.Second
	// pollInterval spaces the polls of a condition.
	pollInterval = 20 * time.Millisecond
)

// caddyBin is the Caddy binary that TestMain built from ./cmd/caddy.
var caddyBin string

func TestMain(m *testing.M) { os.Exit(runMain(m)) }

func runMain(m *testing.M) int {
	flag.Parse()
	if testing.Short() {
		return m.Run() // every test skips itself
	}
	dir, err := os.MkdirTemp("", "caddy-leader-e2e-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
		return 1
	}
	defer os.RemoveAll(dir)
	caddyBin = filepath.Join(dir, "caddy")
	if err := buildCaddy(caddyBin); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
		return 1
	}
	return m.Run()
}

// buildCaddy builds the module's Caddy command into out. The go command finds the module
// from the working directory, which `go test` sets to this package's directory.
func buildCaddy(out string) error {
	args := []string{"build", "-o", out}
	if os.Getenv("E2E_CADDY_RACE") == "1" {
		args = append(args, "-race")
	}
	args = append(args, "github.com/caddyleader/caddy-leader/cmd/caddy")
	// `go test` puts its own GOROOT/bin first in PATH, so this is the same toolchain.
	cmd := exec.Command("go", args...)
	var output bytes.Buffer
	cmd.Stdout, cmd.Stderr = &output, &output
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, output.Bytes())
	}
	return nil
}

// needCaddy skips the test under -short: end-to-end tests start real processes.
func needCaddy(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end test: starts etcd and Caddy processes; skipped with -short")
	}
}

// Config is what differs between the configurations the tests give an instance. Ports,
// instance id and directories come from the instance.
type Config struct {
	// Endpoints are the etcd endpoints of the leader app.
	Endpoints []string
	// Store, when set, is the leader app's store module (`{"module": "postgres", ...}`),
	// which replaces Endpoints.
	Store map[string]any
	// InstanceEndpoints, where it has an entry for an instance's id, replaces Endpoints for
	// that instance: each instance can reach etcd through proxies of its own.
	InstanceEndpoints map[string][]string
	// DrainTimeout is the leader app's drain_timeout as written in JSON; empty leaves the
	// default.
	DrainTimeout string
	// CancelOnLoss sets leader_gate's cancel_on_loss.
	CancelOnLoss bool
	// TTL is the leader app's ttl as written in JSON; empty means the package's ttl.
	TTL string
	// Follower is leader_gate's follower mode; empty means reject.
	Follower string
	// FollowerStatus is leader_gate's status_code; 0 leaves the default.
	FollowerStatus int
	// Variant ends every /gated response body, so that two configs differ harmlessly.
	Variant string
	// Hold is leader_gate's hold as written in JSON; empty leaves the default.
	Hold string
	// Backend, when set, is the URL of an upstream that admitted /gated requests are
	// proxied to (instead of a static response), with the serving instance and token in
	// the X-Served-By and X-Fencing-Token headers. Two more headers time the gate's
	// decision on the instance that served the request: X-Gate-Entered is set just before
	// leader_gate runs, X-Admitted-At when the proxy sends the admitted request on (both
	// `{time.now}`, Go's time.Time format). A Variant is sent as X-Config-Variant.
	Backend string
}

// json renders c as the complete Caddy configuration of instance in:
//
//	/gated*  leader_gate, then 200 "<self> <token> <method> <variant>"
//	/leader  200 "<self> <token>" where the leader matcher matches, else 503
//	/health  200 while the instance is a healthy candidate (leader_candidate), else 503
//	/whoami  200 "<self> <leader id> <token> <is_leader>" after the leader matcher ran
//	/plain   200 "plain", touching nothing of the plugin (a control for /gated)
func (c Config) json(in *Instance) []byte {
	ttlText := c.TTL
	if ttlText == "" {
		ttlText = ttl.String()
	}
	follower := c.Follower
	if follower == "" {
		follower = "reject"
	}
	gate := map[string]any{"handler": "leader_gate", "follower": follower}
	if c.FollowerStatus != 0 {
		gate["status_code"] = c.FollowerStatus
	}
	if c.Hold != "" {
		gate["hold"] = c.Hold
	}
	if c.CancelOnLoss {
		gate["cancel_on_loss"] = true
	}
	endpoints := c.Endpoints
	if eps, ok := c.InstanceEndpoints[in.ID]; ok {
		endpoints = eps
	}
	respond := func(status int, body string) map[string]any {
		return map[string]any{"handler": "static_response", "status_code": status, "body": body}
	}
	route := func(match []map[string]any, handle ...map[string]any) map[string]any {
		r := map[string]any{"handle": handle, "terminal": true}
		if match != nil {
			r["match"] = match
		}
		return r
	}
	path := func(p string) []map[string]any { return []map[string]any{{"path": []string{p}}} }
	leader := []map[string]any{{"leader": map[string]any{}}}
	subroute := func(routes ...map[string]any) map[string]any {
		return map[string]any{"handler": "subroute", "routes": routes}
	}
	const whoami = "{http.leader.self} {http.leader.id} {http.leader.token} {http.leader.is_leader}"
	gated := respond(200, "{http.leader.self} {http.leader.token} {http.request.method} "+c.Variant)
	gatedRoute := route(path("/gated*"), gate, gated)
	if c.Backend != "" {
		set := map[string][]string{
			"X-Served-By":     {"{http.leader.self}"},
			"X-Fencing-Token": {"{http.leader.token}"},
			"X-Admitted-At":   {"{time.now}"},
		}
		if c.Variant != "" {
			set["X-Config-Variant"] = []string{c.Variant}
		}
		gated = map[string]any{
			"handler":   "reverse_proxy",
			"upstreams": []map[string]any{{"dial": strings.TrimPrefix(c.Backend, "http://")}},
			"headers":   map[string]any{"request": map[string]any{"set": set}},
		}
		entered := map[string]any{"handler": "headers", "request": map[string]any{"set": map[string][]string{
			"X-Gate-Entered": {"{time.now}"},
		}}}
		gatedRoute = route(path("/gated*"), entered, gate, gated)
	}

	leaderApp := map[string]any{
		"endpoints":   endpoints,
		"ttl":         ttlText,
		"instance_id": in.ID,
		"advertise":   in.URL(),
	}
	if c.Store != nil {
		delete(leaderApp, "endpoints")
		leaderApp["store"] = c.Store
	}
	if c.DrainTimeout != "" {
		leaderApp["drain_timeout"] = c.DrainTimeout
	}
	cfg := map[string]any{
		"admin": map[string]any{
			"listen": fmt.Sprintf("127.0.0.1:%d", in.AdminPort),
			"config": map[string]any{"persist": false},
		},
		"storage": map[string]any{"module": "file_system", "root": filepath.Join(in.dir, "storage")},
		"logging": map[string]any{"logs": map[string]any{"default": map[string]any{"level": "INFO"}}},
		"apps": map[string]any{
			"leader": leaderApp,
			"http": map[string]any{
				"grace_period": "2s",
				"servers": map[string]any{
					"e2e": map[string]any{
						"listen":          []string{fmt.Sprintf("127.0.0.1:%d", in.HTTPPort)},
						"automatic_https": map[string]any{"disable": true},
						"routes": []any{
							gatedRoute,
							route(path("/leader"), subroute(
								route(leader, respond(200, "{http.leader.self} {http.leader.token}")),
								route(nil, respond(503, "not the leader")),
							)),
							route(path("/health"), subroute(
								route([]map[string]any{{"leader_candidate": map[string]any{}}}, respond(200, "healthy")),
								route(nil, respond(503, "not a healthy candidate")),
							)),
							route(path("/whoami"), subroute(
								route(leader, respond(200, whoami)),
								route(nil, respond(200, whoami)),
							)),
							route(path("/plain"), respond(200, "plain")),
						},
					},
				},
			},
		},
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		panic(err) // maps of strings and numbers always marshal
	}
	return b
}

// Instance is one Caddy process with its own loopback ports and directories.
type Instance struct {
	ID        string
	HTTPPort  int
	AdminPort int

	t       *testing.T
	dir     string
	logPath string
	cmd     *exec.Cmd
	exited  chan struct{} // closed once the process has been waited for
	waitErr error         // set before exited is closed
}

// StartInstance starts `caddy run` with cfg and returns once its admin API and HTTP port
// answer. The process is killed (SIGKILL) when the test ends; if the test failed, its log
// is printed.
func StartInstance(t *testing.T, id string, cfg Config) *Instance {
	t.Helper()
	const attempts = 3 // a port found free can be taken before Caddy binds it
	var lastLog string
	for attempt := 1; attempt <= attempts; attempt++ {
		in, err := startInstance(t, id, cfg)
		if err == nil {
			return in
		}
		lastLog = in.tail()
		if !strings.Contains(lastLog, "address already in use") {
			t.Fatalf("instance %s: %v\n--- log ---\n%s", id, err, lastLog)
		}
		t.Logf("instance %s, attempt %d: port taken, retrying: %v", id, attempt, err)
	}
	t.Fatalf("instance %s: no free ports after %d attempts\n--- log ---\n%s", id, attempts, lastLog)
	return nil
}

func startInstance(t *testing.T, id string, cfg Config) (*Instance, error) {
	ports, err := freeport.Pick(2)
	if err != nil {
		t.Fatalf("free ports: %v", err)
	}
	in := &Instance{
		ID:        id,
		HTTPPort:  ports[0],
		AdminPort: ports[1],
		t:         t,
		dir:       t.TempDir(),
		exited:    make(chan struct{}),
	}
	in.logPath = filepath.Join(in.dir, "caddy.log")
	configPath := filepath.Join(in.dir, "caddy.json")
	if err := os.WriteFile(configPath, cfg.json(in), 0o600); err != nil {
		t.Fatal(err)
	}
	logFile, err := os.Create(in.logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close() // the child has its own descriptor

	home := filepath.Join(in.dir, "home")
	env := []string{
		"HOME=" + home,
		"XDG_DATA_HOME=" + filepath.Join(home, "data"),
		"XDG_CONFIG_HOME=" + filepath.Join(home, "config"),
		"XDG_CACHE_HOME=" + filepath.Join(home, "cache"),
	}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "HOME=") && !strings.HasPrefix(kv, "XDG_") {
			env = append(env, kv)
		}
	}
	in.cmd = exec.Command(caddyBin, "run", "--config", configPath)
	in.cmd.Dir = in.dir
	in.cmd.Env = env
	in.cmd.Stdout, in.cmd.Stderr = logFile, logFile
	in.cmd.SysProcAttr = childProcAttr()
	if err := in.cmd.Start(); err != nil {
		t.Fatalf("instance %s: start caddy: %v", id, err)
	}
	go func() {
		in.waitErr = in.cmd.Wait()
		close(in.exited)
	}()
	t.Cleanup(func() {
		_ = in.cmd.Process.Signal(syscall.SIGKILL)
		select {
		case <-in.exited:
		case <-time.After(exitTimeout):
			t.Errorf("instance %s: still running %v after SIGKILL", id, exitTimeout)
		}
		if trouble := in.trouble(); trouble != "" {
			t.Errorf("instance %s: its log shows %q", id, trouble)
			t.Logf("--- log of instance %s from that line ---\n%s", id, in.from(trouble))
		}
		if t.Failed() {
			t.Logf("--- log of instance %s (%s) ---\n%s", id, in.URL(), in.tail())
		}
	})

	deadline := time.Now().Add(startTimeout)
	for {
		select {
		case <-in.exited:
			return in, fmt.Errorf("caddy exited during start: %v", in.waitErr)
		default:
		}
		_, adminErr := in.admin(http.MethodGet, "/config/", nil)
		_, httpErr := in.Get("/whoami")
		if adminErr == nil && httpErr == nil {
			return in, nil
		}
		if time.Now().After(deadline) {
			_ = in.cmd.Process.Signal(syscall.SIGKILL)
			return in, fmt.Errorf("not ready within %v: admin: %v; http: %v", startTimeout, adminErr, httpErr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// StartFleet starts n instances, c0 to c<n-1>, with the same cfg.
func StartFleet(t *testing.T, n int, cfg Config) []*Instance {
	t.Helper()
	fleet := make([]*Instance, n)
	for i := range fleet {
		fleet[i] = StartInstance(t, fmt.Sprintf("c%d", i), cfg)
	}
	return fleet
}

// URL is the instance's HTTP base URL, which it also advertises.
func (in *Instance) URL() string { return fmt.Sprintf("http://127.0.0.1:%d", in.HTTPPort) }

func (in *Instance) String() string { return in.ID }

// tail returns the end of the instance's log.
func (in *Instance) tail() string {
	const limit = 64 << 10
	b, err := os.ReadFile(in.logPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	if len(b) > limit {
		b = append([]byte("...\n"), b[len(b)-limit:]...)
	}
	return string(b)
}

// from returns the instance's log from the first occurrence of line on (up to 32 KiB): a
// race report or a panic's stack, which the tail of a busy log may no longer hold.
func (in *Instance) from(line string) string {
	b, _ := os.ReadFile(in.logPath)
	s := string(b)
	i := strings.Index(s, line)
	if i < 0 {
		return ""
	}
	return s[i:min(len(s), i+32<<10)]
}

// trouble returns the first line of the instance's log that shows a crash, a panic in a
// handler or (with E2E_CADDY_RACE=1) a data race; empty if there is none.
func (in *Instance) trouble() string {
	b, err := os.ReadFile(in.logPath)
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "panic: ") || strings.HasPrefix(line, "fatal error: ") ||
			strings.Contains(line, "http: panic serving") || strings.Contains(line, "WARNING: DATA RACE") {
			return line
		}
	}
	return ""
}

func (in *Instance) signal(sig syscall.Signal) {
	in.t.Helper()
	if err := in.cmd.Process.Signal(sig); err != nil {
		in.t.Fatalf("instance %s: %v: %v", in.ID, sig, err)
	}
}

// waitExit waits for the process to exit after a signal.
func (in *Instance) waitExit() {
	in.t.Helper()
	select {
	case <-in.exited:
	case <-time.After(exitTimeout):
		in.t.Fatalf("instance %s: still running %v after a signal to exit", in.ID, exitTimeout)
	}
}

// Kill sends SIGKILL and waits for the process to exit.
func (in *Instance) Kill() {
	in.t.Helper()
	in.signal(syscall.SIGKILL)
	in.waitExit()
}

// Term sends SIGTERM and waits for Caddy to shut down.
func (in *Instance) Term() {
	in.t.Helper()
	in.signal(syscall.SIGTERM)
	in.waitExit()
}

// Stop freezes the process (SIGSTOP).
func (in *Instance) Stop() {
	in.t.Helper()
	in.signal(syscall.SIGSTOP)
}

// Cont resumes a frozen process (SIGCONT).
func (in *Instance) Cont() {
	in.t.Helper()
	in.signal(syscall.SIGCONT)
}

// Reload loads cfg through the admin API's /load. It fails the test unless Caddy accepts
// the config; LoadConfig is for configs that must be refused.
func (in *Instance) Reload(cfg Config) {
	in.t.Helper()
	status, body, err := in.LoadConfig(cfg)
	if err != nil || status != http.StatusOK {
		in.t.Fatalf("instance %s: reload: status %d, error %v, body %s", in.ID, status, err, body)
	}
}

// LoadConfig posts cfg to the admin API's /load and returns the response.
func (in *Instance) LoadConfig(cfg Config) (status int, body string, err error) {
	resp, err := in.admin(http.MethodPost, "/load", cfg.json(in))
	if err != nil {
		return 0, "", err
	}
	return resp.Status, resp.Body, nil
}

// Response is the part of an HTTP response the tests look at.
type Response struct {
	Status int
	Header http.Header
	Body   string
}

// client talks to instances: never through a proxy, never following redirects.
var client = &http.Client{
	Transport: &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: requestTimeout}).DialContext,
		MaxIdleConnsPerHost: 64,
	},
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

// Get requests path from the instance's HTTP server.
func (in *Instance) Get(path string) (Response, error) {
	return in.Do(context.Background(), http.MethodGet, path, nil)
}

// Do sends one request to the instance's HTTP server, bounded by requestTimeout.
func (in *Instance) Do(ctx context.Context, method, path string, body []byte) (Response, error) {
	return do(ctx, method, in.URL()+path, body)
}

func (in *Instance) admin(method, path string, body []byte) (Response, error) {
	return do(context.Background(), method, fmt.Sprintf("http://127.0.0.1:%d%s", in.AdminPort, path), body)
}

func do(ctx context.Context, method, url string, body []byte) (Response, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return Response{}, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := client.Do(req)
	if err != nil {
		return Response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return Response{}, err
	}
	return Response{Status: resp.StatusCode, Header: resp.Header, Body: string(b)}, nil
}

// Gated is a parsed 200 answer of /gated.
type Gated struct {
	Self    string
	Token   int64
	Method  string
	Variant string
}

func parseGated(body string) (Gated, error) {
	f := strings.Split(body, " ")
	if len(f) != 4 {
		return Gated{}, fmt.Errorf("/gated body %q: want 4 fields", body)
	}
	token, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return Gated{}, fmt.Errorf("/gated body %q: token: %v", body, err)
	}
	return Gated{Self: f[0], Token: token, Method: f[2], Variant: f[3]}, nil
}

// Whoami is an instance's view of the election, from /whoami.
type Whoami struct {
	Self     string
	Leader   string // empty when no leader is known
	Token    int64  // 0 when no leader is known
	IsLeader bool   // this instance may act as leader right now
}

// Whoami asks the instance who leads.
func (in *Instance) Whoami() (Whoami, error) {
	resp, err := in.Get("/whoami")
	if err != nil {
		return Whoami{}, err
	}
	return parseWhoami(resp)
}

func parseWhoami(resp Response) (Whoami, error) {
	if resp.Status != http.StatusOK {
		return Whoami{}, fmt.Errorf("/whoami: status %d, body %q", resp.Status, resp.Body)
	}
	f := strings.Split(resp.Body, " ")
	if len(f) != 4 {
		return Whoami{}, fmt.Errorf("/whoami body %q: want 4 fields", resp.Body)
	}
	w := Whoami{Self: f[0], Leader: f[1], IsLeader: f[3] == "true"}
	if f[2] != "" {
		var err error
		if w.Token, err = strconv.ParseInt(f[2], 10, 64); err != nil {
			return Whoami{}, fmt.Errorf("/whoami body %q: token: %v", resp.Body, err)
		}
	}
	return w, nil
}

// WaitStableLeader polls /whoami on every instance until all of them name the same leader
// and token and the leader says it leads, or within passes. It returns the leader and token.
func WaitStableLeader(t *testing.T, fleet []*Instance, within time.Duration) (*Instance, int64) {
	t.Helper()
	deadline := time.Now().Add(within)
	var last []string
	for {
		leader, token, views := agreedLeader(fleet)
		if leader != nil {
			return leader, token
		}
		last = views
		if time.Now().After(deadline) {
			t.Fatalf("no leader agreed on by all of %v within %v; last views: %s", fleet, within, strings.Join(last, "; "))
		}
		time.Sleep(pollInterval)
	}
}

func agreedLeader(fleet []*Instance) (*Instance, int64, []string) {
	var views []string
	var first Whoami
	agree := true
	var leader *Instance
	for i, in := range fleet {
		w, err := in.Whoami()
		if err != nil {
			views = append(views, fmt.Sprintf("%s: %v", in.ID, err))
			agree = false
			continue
		}
		views = append(views, fmt.Sprintf("%+v", w))
		if i == 0 {
			first = w
		}
		if w.Leader == "" || w.Leader != first.Leader || w.Token != first.Token {
			agree = false
		}
		if w.IsLeader {
			if w.Self != w.Leader {
				agree = false
			}
			leader = in
		}
	}
	if !agree || leader == nil {
		return nil, 0, views
	}
	return leader, first.Token, views
}

// Served is one 200 answer of /gated seen by a Poller.
type Served struct {
	From   *Instance
	Gated  Gated
	SentAt time.Time
	At     time.Time // when the answer arrived
}

// Poller sends GET /gated to every instance of a fleet in a tight loop, one goroutine per
// instance, and records every 200.
type Poller struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	served   []Served
	answered map[*Instance]int // answers of any status
	failed   map[*Instance]int // requests without an answer
	notify   chan struct{}     // closed and replaced on every 200
}

// StartPoller starts polling fleet; Stop ends it.
func StartPoller(fleet []*Instance) *Poller {
	ctx, cancel := context.WithCancel(context.Background())
	p := &Poller{
		cancel:   cancel,
		answered: make(map[*Instance]int),
		failed:   make(map[*Instance]int),
		notify:   make(chan struct{}),
	}
	for _, in := range fleet {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			for ctx.Err() == nil {
				sent := time.Now()
				resp, err := in.Do(ctx, http.MethodGet, "/gated", nil)
				p.record(in, sent, resp, err)
				if err != nil || resp.Status != http.StatusOK {
					// A dead or frozen instance fails fast or times out; do not spin.
					select {
					case <-ctx.Done():
					case <-time.After(5 * time.Millisecond):
					}
				}
			}
		}()
	}
	return p
}

func (p *Poller) record(in *Instance, sent time.Time, resp Response, err error) {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			p.failed[in]++
		}
		return
	}
	p.answered[in]++
	if resp.Status != http.StatusOK {
		return
	}
	g, perr := parseGated(resp.Body)
	if perr != nil {
		g = Gated{Self: "unparsable: " + resp.Body, Token: -1}
	}
	p.served = append(p.served, Served{From: in, Gated: g, SentAt: sent, At: now})
	close(p.notify)
	p.notify = make(chan struct{})
}

// WaitServed waits until some 200 satisfies ok, and returns the first that did.
func (p *Poller) WaitServed(t *testing.T, within time.Duration, what string, ok func(Served) bool) Served {
	t.Helper()
	timeout := time.After(within)
	for {
		p.mu.Lock()
		for _, s := range p.served {
			if ok(s) {
				p.mu.Unlock()
				return s
			}
		}
		notify := p.notify
		p.mu.Unlock()
		select {
		case <-notify:
		case <-timeout:
			t.Fatalf("no 200 on /gated from an instance %s within %v", what, within)
		}
	}
}

// Stop ends polling and returns every 200 seen.
func (p *Poller) Stop() []Served {
	p.cancel()
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Served(nil), p.served...)
}

// Failed is how many requests to in got no answer.
func (p *Poller) Failed(in *Instance) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failed[in]
}

// others returns fleet without in.
func others(fleet []*Instance, in *Instance) []*Instance {
	var rest []*Instance
	for _, f := range fleet {
		if f != in {
			rest = append(rest, f)
		}
	}
	return rest
}
