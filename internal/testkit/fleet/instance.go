package fleet

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/freeport"
)

// Bounds on waits. They say when to give up, not how fast things should be.
const (
	// StartTimeout bounds a Caddy process becoming ready (admin API and HTTP port answer).
	StartTimeout = 20 * time.Second
	// ExitTimeout bounds a signalled process exiting; SIGTERM may drain for the default
	// drain_timeout (10s).
	ExitTimeout = 30 * time.Second
	// PollInterval spaces the polls of a condition.
	PollInterval = 20 * time.Millisecond
)

// Instance is one Caddy process with its own loopback ports and directories, running a
// Config rendered for it. Its methods fail the T it was started with.
type Instance struct {
	ID        string
	HTTPPort  int
	AdminPort int
	// Dir holds its config, log, storage and home directory.
	Dir string

	t    T
	proc *Process
}

// StartInstance starts `caddy run` (the binary bin) with cfg and returns once its admin
// API and HTTP port answer. The process is killed (SIGKILL) when the test ends; if its
// log shows a crash, a panic or a race, the test fails; if the test failed, its log is
// printed.
func StartInstance(t T, bin, id string, cfg Config) *Instance {
	t.Helper()
	const attempts = 3 // a port found free can be taken before Caddy binds it
	var lastLog string
	for attempt := 1; attempt <= attempts; attempt++ {
		in, err := startInstance(t, bin, id, cfg)
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

func startInstance(t T, bin, id string, cfg Config) (*Instance, error) {
	ports, err := freeport.Pick(2)
	if err != nil {
		t.Fatalf("free ports: %v", err)
	}
	in := NewInstance(t, id, ports[0], ports[1])
	configPath := filepath.Join(in.Dir, "caddy.json")
	if err := os.WriteFile(configPath, cfg.JSON(in), 0o600); err != nil {
		t.Fatalf("instance %s: %v", id, err)
	}
	return in, in.Launch(bin, nil, "run", "--config", configPath)
}

// NewInstance prepares, and does not start, instance id on the given ports, with fresh
// directories; Launch starts it.
func NewInstance(t T, id string, httpPort, adminPort int) *Instance {
	return &Instance{ID: id, HTTPPort: httpPort, AdminPort: adminPort, Dir: t.TempDir(), t: t}
}

// Launch runs the Caddy binary bin with args, in the instance's directory and with its own
// home, plus the environment variables env (which override the test's own), and returns
// once its admin API and HTTP port answer. The process is killed (SIGKILL) when the test
// ends; if its log shows a crash, a panic or a race, the test fails; if the test failed,
// its log is printed.
func (in *Instance) Launch(bin string, env []string, args ...string) error {
	t, id := in.t, in.ID
	home := filepath.Join(in.Dir, "home")
	procEnv := []string{
		"HOME=" + home,
		"XDG_DATA_HOME=" + filepath.Join(home, "data"),
		"XDG_CONFIG_HOME=" + filepath.Join(home, "config"),
		"XDG_CACHE_HOME=" + filepath.Join(home, "cache"),
	}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "HOME=") && !strings.HasPrefix(kv, "XDG_") {
			procEnv = append(procEnv, kv)
		}
	}
	var err error
	in.proc, err = StartProcess(ProcessSpec{
		Path:    bin,
		Args:    args,
		Env:     append(procEnv, env...), // the last value of a variable wins
		Dir:     in.Dir,
		LogPath: filepath.Join(in.Dir, "caddy.log"),
	})
	if err != nil {
		t.Fatalf("instance %s: %v", id, err)
	}
	t.Cleanup(func() {
		_ = in.proc.Signal(syscall.SIGKILL)
		if !in.proc.WaitExit(ExitTimeout) {
			t.Errorf("instance %s: still running %v after SIGKILL", id, ExitTimeout)
		}
		if trouble := in.proc.Trouble(); trouble != "" {
			t.Errorf("instance %s: its log shows %q", id, trouble)
			t.Logf("--- log of instance %s from that line ---\n%s", id, in.proc.From(trouble))
		}
		if t.Failed() {
			t.Logf("--- log of instance %s (%s) ---\n%s", id, in.URL(), in.tail())
		}
	})

	err = in.proc.WaitReady(StartTimeout, func() error {
		_, adminErr := in.Admin(http.MethodGet, "/config/", nil)
		_, httpErr := in.Get("/whoami")
		if adminErr != nil || httpErr != nil {
			return fmt.Errorf("admin: %v; http: %v", adminErr, httpErr)
		}
		return nil
	})
	if err != nil {
		_ = in.proc.Signal(syscall.SIGKILL)
		return fmt.Errorf("caddy %w", err)
	}
	return nil
}

// StartInstances starts n instances, c0 to c<n-1>, with the same cfg.
func StartInstances(t T, bin string, n int, cfg Config) []*Instance {
	t.Helper()
	fleet := make([]*Instance, n)
	for i := range fleet {
		fleet[i] = StartInstance(t, bin, fmt.Sprintf("c%d", i), cfg)
	}
	return fleet
}

// URL is the instance's HTTP base URL, which it also advertises.
func (in *Instance) URL() string { return fmt.Sprintf("http://127.0.0.1:%d", in.HTTPPort) }

func (in *Instance) String() string { return in.ID }

// Process is the running Caddy process.
func (in *Instance) Process() *Process { return in.proc }

// LogPath is the file that holds Caddy's log.
func (in *Instance) LogPath() string { return in.proc.LogPath() }

// tail returns the end of the instance's log.
func (in *Instance) tail() string { return in.proc.Tail(64 << 10) }

// Tail is the end of the instance's log.
func (in *Instance) Tail() string { return in.tail() }

// Signal sends sig to the process; it does not wait.
func (in *Instance) Signal(sig syscall.Signal) {
	in.t.Helper()
	if err := in.proc.Signal(sig); err != nil {
		in.t.Fatalf("instance %s: %v: %v", in.ID, sig, err)
	}
}

// WaitExit waits for the process to exit after a signal.
func (in *Instance) WaitExit() {
	in.t.Helper()
	if !in.proc.WaitExit(ExitTimeout) {
		in.t.Fatalf("instance %s: still running %v after a signal to exit", in.ID, ExitTimeout)
	}
}

// Kill sends SIGKILL and waits for the process to exit.
func (in *Instance) Kill() {
	in.t.Helper()
	in.Signal(syscall.SIGKILL)
	in.WaitExit()
}

// Term sends SIGTERM and waits for Caddy to shut down.
func (in *Instance) Term() {
	in.t.Helper()
	in.Signal(syscall.SIGTERM)
	in.WaitExit()
}

// Stop freezes the process (SIGSTOP).
func (in *Instance) Stop() {
	in.t.Helper()
	in.Signal(syscall.SIGSTOP)
}

// Cont resumes a frozen process (SIGCONT).
func (in *Instance) Cont() {
	in.t.Helper()
	in.Signal(syscall.SIGCONT)
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
	resp, err := in.Admin(http.MethodPost, "/load", cfg.JSON(in))
	if err != nil {
		return 0, "", err
	}
	return resp.Status, resp.Body, nil
}

// Get requests path from the instance's HTTP server.
func (in *Instance) Get(path string) (Response, error) {
	return in.Do(context.Background(), http.MethodGet, path, nil)
}

// Do sends one request to the instance's HTTP server, bounded by RequestTimeout.
func (in *Instance) Do(ctx context.Context, method, path string, body []byte) (Response, error) {
	return Do(ctx, method, in.URL()+path, body)
}

// Admin sends one request to the instance's admin API, bounded by RequestTimeout.
func (in *Instance) Admin(method, path string, body []byte) (Response, error) {
	return Do(context.Background(), method, fmt.Sprintf("http://127.0.0.1:%d%s", in.AdminPort, path), body)
}

// Whoami asks the instance who leads.
func (in *Instance) Whoami() (Whoami, error) {
	resp, err := in.Get("/whoami")
	if err != nil {
		return Whoami{}, err
	}
	return ParseWhoami(resp)
}
