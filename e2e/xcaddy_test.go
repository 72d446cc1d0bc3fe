//go:build unix

package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/freeport"
)

// xcaddyRun is one `./xcaddy.sh run` (after its exec, the Caddy process itself).
type xcaddyRun struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
	err  error
}

// syncBuffer collects a process's output while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// xcaddyScript runs ./xcaddy.sh from the repository root with the test's environment.
type xcaddyScript struct {
	env []string
}

func (s xcaddyScript) command(extraEnv []string, args ...string) *exec.Cmd {
	cmd := exec.Command("bash", append([]string{"./xcaddy.sh"}, args...)...)
	cmd.Dir = ".."
	cmd.Env = append(append([]string{}, s.env...), extraEnv...)
	return cmd
}

// run runs a command to its end and returns its output and exit status.
func (s xcaddyScript) run(t *testing.T, args ...string) (string, int) {
	t.Helper()
	out, err := s.command(nil, args...).CombinedOutput()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		return string(out), exit.ExitCode()
	case err != nil:
		t.Fatalf("./xcaddy.sh %s: %v", strings.Join(args, " "), err)
	}
	return string(out), 0
}

// start starts `./xcaddy.sh run` with the quick start's variables.
func (s xcaddyScript) start(t *testing.T, vars ...string) *xcaddyRun {
	t.Helper()
	r := &xcaddyRun{cmd: s.command(vars, "run"), out: new(syncBuffer), done: make(chan struct{})}
	r.cmd.Stdout, r.cmd.Stderr = r.out, r.out
	// Its own process group, as a terminal gives a command, so that stop can do what Ctrl-C
	// does: signal the whole group.
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		r.err = r.cmd.Wait()
		close(r.done)
	}()
	t.Cleanup(r.stop)
	return r
}

func (r *xcaddyRun) exited() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// stop ends the instance as Ctrl-C in its terminal would (SIGINT to its process group),
// and waits for it.
func (r *xcaddyRun) stop() {
	if !r.exited() {
		syscall.Kill(-r.cmd.Process.Pid, syscall.SIGINT)
	}
	select {
	case <-r.done:
	case <-time.After(exitTimeout):
		syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
		<-r.done
	}
}

// waitListening waits until addr accepts connections, failing if r exits first.
func (r *xcaddyRun) waitListening(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(startTimeout)
	for !tcpListening(addr) {
		if r.exited() {
			t.Fatalf("./xcaddy.sh run exited (%v) before %s listened:\n%s", r.err, addr, r.out)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not listening after %s:\n%s", addr, startTimeout, r.out)
		}
		time.Sleep(pollInterval)
	}
}

func tcpListening(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, requestTimeout)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// getUntil polls url until the answer has status and contains want.
func getUntil(t *testing.T, url string, status int, want string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	var last string
	for {
		resp, err := (&http.Client{Timeout: requestTimeout, CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		}}).Get(url)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			last = fmt.Sprintf("%d %q", resp.StatusCode, body)
			if resp.StatusCode == status && strings.Contains(string(body), want) {
				return
			}
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s: want %d with %q within %s; last answer: %s", url, status, want, within, last)
		}
		time.Sleep(pollInterval)
	}
}

// TestXcaddyRun follows a newcomer's first steps with `./xcaddy.sh run` and the quick start:
// the local etcd it starts outlives the instance, a second instance finds it without
// rebuilding it, an instance on an admin address in use is refused, the etcd binary is
// rebuilt only when stale, and `./xcaddy.sh etcd stop` ends it.
func TestXcaddyRun(t *testing.T) {
	needCaddy(t)
	ports, err := freeport.Pick(5)
	if err != nil {
		t.Fatal(err)
	}
	etcdAddr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	adminAddr := fmt.Sprintf("127.0.0.1:%d", ports[2])
	state := t.TempDir()
	etcdBin := filepath.Join(state, "etcd-local")
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ETCD_ENDPOINTS=") && !strings.HasPrefix(kv, "CADDY_ADMIN=") {
			env = append(env, kv)
		}
	}
	s := xcaddyScript{env: append(env,
		"XCADDY_ETCD_LISTEN="+etcdAddr,
		fmt.Sprintf("XCADDY_ETCD_PEER=127.0.0.1:%d", ports[1]),
		"XCADDY_ETCD_STATE="+state,
		"XCADDY_ETCD_BIN="+etcdBin,
		"CADDY_BIN="+caddyBin,
		fmt.Sprintf("ADMIN_PORT=%d", ports[2]),
	)}
	t.Cleanup(func() { s.run(t, "etcd", "stop") })
	instance := func(name string, port int) []string {
		return []string{fmt.Sprintf("PORT=%d", port), "INSTANCE=" + name}
	}

	t.Run("first_instance_starts_the_local_etcd_which_outlives_it", func(t *testing.T) {
		first := s.start(t, instance("node-1", ports[3])...)
		first.waitListening(t, adminAddr)
		base := fmt.Sprintf("http://127.0.0.1:%d", ports[3])
		getUntil(t, base+"/leader", http.StatusOK, "leader node-1", startTimeout)
		// The catch-all names the instance, never a raw {http.leader.*} placeholder.
		getUntil(t, base+"/", http.StatusOK, "served by node-1: GET /", requestTimeout)
		first.stop()
		if out := first.out.String(); !strings.Contains(out, "started the local etcd on "+etcdAddr) || !strings.Contains(out, "go build") {
			t.Errorf("the first run did not build and start the local etcd:\n%s", out)
		}
		if out, code := s.run(t, "etcd", "status"); code != 0 || !tcpListening(etcdAddr) {
			t.Fatalf("the local etcd stopped with the instance that started it (status %d):\n%s", code, out)
		}
	})

	t.Run("second_instance_uses_it_without_rebuilding", func(t *testing.T) {
		second := s.start(t, instance("node-2", ports[4])...)
		second.waitListening(t, adminAddr)
		getUntil(t, fmt.Sprintf("http://127.0.0.1:%d/leader", ports[4]), http.StatusOK, "leader node-2", startTimeout)
		out := second.out.String()
		if !strings.Contains(out, "the local etcd already runs on "+etcdAddr) || strings.Contains(out, "go build") {
			t.Errorf("the second run did not reuse the running etcd, or rebuilt it:\n%s", out)
		}

		t.Run("an_instance_on_the_same_admin_address_is_refused", func(t *testing.T) {
			third := s.start(t, instance("node-3", ports[3])...)
			select {
			case <-third.done:
			case <-time.After(startTimeout):
				t.Fatalf("a second instance on admin address %s was not refused:\n%s", adminAddr, third.out)
			}
			want := "the admin address " + adminAddr + " is already in use"
			if third.err == nil || !strings.Contains(third.out.String(), want) {
				t.Errorf("exit %v, output:\n%s\nwant a failure saying %q", third.err, third.out, want)
			}
		})
		second.stop()
	})

	t.Run("binary_is_built_only_when_stale", func(t *testing.T) {
		restart := func() string {
			t.Helper()
			if out, code := s.run(t, "etcd", "stop"); code != 0 {
				t.Fatalf("etcd stop: exit %d:\n%s", code, out)
			}
			out, code := s.run(t, "etcd", "start")
			if code != 0 || !strings.Contains(out, "started the local etcd on "+etcdAddr) {
				t.Fatalf("etcd start: exit %d:\n%s", code, out)
			}
			return out
		}
		if out := restart(); strings.Contains(out, "go build") {
			t.Errorf("etcd start rebuilt an up-to-date binary:\n%s", out)
		}
		old := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
		if err := os.Chtimes(etcdBin, old, old); err != nil {
			t.Fatal(err)
		}
		if out := restart(); !strings.Contains(out, "go build") {
			t.Errorf("etcd start did not rebuild a binary older than its sources:\n%s", out)
		}
	})

	t.Run("stop_ends_it", func(t *testing.T) {
		if out, code := s.run(t, "etcd", "stop"); code != 0 || !strings.Contains(out, "stopped the local etcd") {
			t.Fatalf("etcd stop: exit %d:\n%s", code, out)
		}
		if out, code := s.run(t, "etcd", "status"); code != 3 {
			t.Errorf("etcd status after stop: exit %d, want 3:\n%s", code, out)
		}
		if tcpListening(etcdAddr) {
			t.Errorf("%s still listens after etcd stop", etcdAddr)
		}
	})
}
