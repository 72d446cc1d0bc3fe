package fleet

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// ProcessSpec says how to run one process of a fleet.
type ProcessSpec struct {
	// Path and Args are the program and its arguments (without the program's name).
	Path string
	Args []string
	// Env is the whole environment; nil means this process's.
	Env []string
	// Dir is the working directory; empty means this process's.
	Dir string
	// LogPath receives the process's stdout and stderr; it is appended to, so that a
	// restarted process keeps the log of its earlier runs.
	LogPath string
}

// Process is one running child: its log, and whether it has exited. It is waited for in
// the background, so that Exited tells at once when it ends.
type Process struct {
	cmd     *exec.Cmd
	logPath string
	exited  chan struct{} // closed once the process has been waited for
	waitErr error         // set before exited is closed
}

// StartProcess starts spec's program and returns without waiting for it to be ready. On
// Linux the child is killed if this process dies first (see ChildProcAttr).
func StartProcess(spec ProcessSpec) (*Process, error) {
	logFile, err := os.OpenFile(spec.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the child has its own descriptor
	p := &Process{logPath: spec.LogPath, exited: make(chan struct{})}
	p.cmd = exec.Command(spec.Path, spec.Args...)
	p.cmd.Dir = spec.Dir
	p.cmd.Env = spec.Env
	p.cmd.Stdout, p.cmd.Stderr = logFile, logFile
	p.cmd.SysProcAttr = ChildProcAttr()
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %v", spec.Path, err)
	}
	go func() {
		p.waitErr = p.cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// Pid is the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Cmd is the command the process runs.
func (p *Process) Cmd() *exec.Cmd { return p.cmd }

// LogPath is the file that holds its output.
func (p *Process) LogPath() string { return p.logPath }

// Exited is closed once the process has exited.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// ExitErr is how the process ended (nil for exit status 0); only valid after Exited.
func (p *Process) ExitErr() error { return p.waitErr }

// Running reports whether the process has not exited yet.
func (p *Process) Running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// Signal sends sig to the process.
func (p *Process) Signal(sig syscall.Signal) error {
	return p.cmd.Process.Signal(sig)
}

// WaitExit waits up to within for the process to exit, and says whether it did.
func (p *Process) WaitExit(within time.Duration) bool {
	select {
	case <-p.exited:
		return true
	case <-time.After(within):
		return false
	}
}

// Stop ends the process: SIGTERM, up to grace to exit, then SIGKILL. It returns once the
// process has exited, or grace after the SIGKILL.
func (p *Process) Stop(grace time.Duration) {
	if !p.Running() {
		return
	}
	_ = p.Signal(syscall.SIGTERM)
	if !p.WaitExit(grace) {
		_ = p.Signal(syscall.SIGKILL)
		p.WaitExit(grace)
	}
}

// WaitReady polls ready every pollInterval until it returns nil, the process exits, or
// within passes; the error says which.
func (p *Process) WaitReady(within time.Duration, ready func() error) error {
	deadline := time.Now().Add(within)
	for {
		err := ready()
		if err == nil {
			return nil
		}
		if !p.Running() {
			return fmt.Errorf("exited during start: %v", p.waitErr)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready within %v: %w", within, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Tail returns the end of the process's log, up to limit bytes.
func (p *Process) Tail(limit int) string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	if len(b) > limit {
		b = append([]byte("...\n"), b[len(b)-limit:]...)
	}
	return string(b)
}

// From returns the log from the first occurrence of line on (up to 32 KiB): a race report
// or a panic's stack, which the tail of a busy log may no longer hold.
func (p *Process) From(line string) string {
	b, _ := os.ReadFile(p.logPath)
	s := string(b)
	i := strings.Index(s, line)
	if i < 0 {
		return ""
	}
	return s[i:min(len(s), i+32<<10)]
}

// Trouble returns the first line of the log that shows a crash, a panic in a handler or
// (in a binary built with -race) a data race; empty if there is none.
func (p *Process) Trouble() string {
	b, err := os.ReadFile(p.logPath)
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

// Listening reports whether something accepts TCP connections on addr (host:port).
func Listening(addr string) bool {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	conn.Close()
	return true
}

// ListeningOn is a readiness check for WaitReady: nil once addr accepts connections.
func ListeningOn(addr string) func() error {
	return func() error {
		if Listening(addr) {
			return nil
		}
		return errors.New("nothing listens on " + addr)
	}
}
