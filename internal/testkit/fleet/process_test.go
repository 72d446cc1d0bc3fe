package fleet

import (
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestProcess(t *testing.T) {
	t.Run("exit_is_seen_and_logged", func(t *testing.T) {
		log := filepath.Join(t.TempDir(), "log")
		p, err := StartProcess(ProcessSpec{Path: "/bin/sh", Args: []string{"-c", "echo panic: boom; exit 3"}, LogPath: log})
		if err != nil {
			t.Fatal(err)
		}
		if !p.WaitExit(10 * time.Second) {
			t.Fatal("sh did not exit")
		}
		if p.Running() || p.ExitErr() == nil {
			t.Errorf("after exit 3: Running %v, ExitErr %v", p.Running(), p.ExitErr())
		}
		if got := p.Trouble(); got != "panic: boom" {
			t.Errorf("Trouble() = %q, want the panic line", got)
		}
		if got := p.Tail(1 << 10); !strings.Contains(got, "panic: boom") {
			t.Errorf("Tail() = %q", got)
		}
	})

	t.Run("stop_ends_a_process_that_ignores_sigterm", func(t *testing.T) {
		p, err := StartProcess(ProcessSpec{
			Path: "/bin/sh", Args: []string{"-c", "trap '' TERM; echo ready; while :; do sleep 0.05; done"},
			LogPath: filepath.Join(t.TempDir(), "log"),
		})
		if err != nil {
			t.Fatal(err)
		}
		ready := func() error {
			if strings.Contains(p.Tail(100), "ready") {
				return nil
			}
			return net.ErrClosed
		}
		if err := p.WaitReady(10*time.Second, ready); err != nil {
			t.Fatal(err)
		}
		p.Stop(200 * time.Millisecond)
		if p.Running() {
			t.Fatal("still running after Stop")
		}
		if err := p.Signal(syscall.SIGTERM); err == nil {
			t.Error("Signal to an exited process succeeded")
		}
	})

	t.Run("wait_ready_reports_an_early_exit", func(t *testing.T) {
		p, err := StartProcess(ProcessSpec{Path: "/bin/sh", Args: []string{"-c", "exit 1"}, LogPath: filepath.Join(t.TempDir(), "log")})
		if err != nil {
			t.Fatal(err)
		}
		err = p.WaitReady(10*time.Second, func() error { return net.ErrClosed })
		if err == nil || !strings.Contains(err.Error(), "exited during start") {
			t.Errorf("WaitReady = %v, want an exit during start", err)
		}
	})
}

func TestListening(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if !Listening(addr) || ListeningOn(addr)() != nil {
		t.Errorf("%s: not seen listening", addr)
	}
	ln.Close()
	if Listening(addr) || ListeningOn(addr)() == nil {
		t.Errorf("%s: seen listening after Close", addr)
	}
}

func TestTimeTakeover(t *testing.T) {
	from := time.Now()
	asked := map[string]int{}
	leads := func(c string) bool {
		asked[c]++
		return c == "b" && asked[c] == 3
	}
	got, took, ok := TimeTakeover(from, time.Minute, 0, []string{"a", "b"}, leads)
	if !ok || got != "b" || took <= 0 || asked["a"] != 3 {
		t.Errorf("TimeTakeover = %q, %v, %v after asking %v; want b on the third round", got, took, ok, asked)
	}
	got, _, ok = TimeTakeover(time.Now(), 0, time.Millisecond, []string{"a"}, func(string) bool { return false })
	if ok || got != "" {
		t.Errorf("TimeTakeover with nobody leading = %q, %v; want none", got, ok)
	}
}
