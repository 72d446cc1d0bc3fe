//go:build unix

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/caddyleader/caddy-leader/internal/testkit/fleet"
	"github.com/caddyleader/caddy-leader/internal/testkit/freeport"
)

// etcdProcs is an etcd cluster of real processes (cmd/etcd-local, one member each) on
// 127.0.0.1, so that members can be killed with SIGKILL and restarted from their data
// dirs, as a crash would leave them. internal/testkit/etcdtest embeds its members in the test
// process, whose Stop is etcd's graceful shutdown.
type etcdProcs struct {
	t              *testing.T
	members        []*etcdProc
	initialCluster string
}

// etcdProc is one member. Its name, data dir and ports never change.
type etcdProc struct {
	name, dir, client, peer string // client and peer are host:port
	logPath                 string

	mu     sync.Mutex
	cmd    *exec.Cmd     // the current run; nil once it has exited and been waited for
	exited chan struct{} // closed when the current run has exited
}

// etcdReadyTimeout bounds members becoming ready (a quorum formed, this member serving).
const etcdReadyTimeout = 30 * time.Second

var (
	etcdLocalOnce sync.Once
	etcdLocalBin  string
	etcdLocalErr  error
)

// buildEtcdLocal builds cmd/etcd-local next to the Caddy binary, once per test process.
func buildEtcdLocal(t *testing.T) string {
	t.Helper()
	etcdLocalOnce.Do(func() {
		etcdLocalBin = filepath.Join(filepath.Dir(caddyBin), "etcd-local")
		etcdLocalErr = fleet.BuildEtcdLocal(etcdLocalBin)
	})
	if etcdLocalErr != nil {
		t.Fatal(etcdLocalErr)
	}
	return etcdLocalBin
}

// startEtcdProcs starts an n-member cluster and returns once every member serves. The
// members are killed when the test ends; if it failed, their logs are printed.
func startEtcdProcs(t *testing.T, n int) *etcdProcs {
	t.Helper()
	bin := buildEtcdLocal(t)
	const attempts = 3 // a port found free can be taken before etcd binds it
	var err error
	for attempt := 1; attempt <= attempts; attempt++ {
		var c *etcdProcs
		if c, err = tryStartEtcdProcs(t, bin, n); err == nil {
			return c
		}
		t.Logf("etcd cluster of %d processes, attempt %d: %v", n, attempt, err)
	}
	t.Fatalf("etcd cluster of %d processes: %v", n, err)
	return nil
}

func tryStartEtcdProcs(t *testing.T, bin string, n int) (*etcdProcs, error) {
	// Stopped members bind their ports again: see freeport.
	ports, err := freeport.Pick(2 * n)
	if err != nil {
		return nil, err
	}
	base := t.TempDir()
	c := &etcdProcs{t: t}
	var peers []string
	for i := range n {
		m := &etcdProc{
			name:   fmt.Sprintf("m%d", i),
			dir:    filepath.Join(base, fmt.Sprintf("m%d", i)),
			client: fmt.Sprintf("127.0.0.1:%d", ports[2*i]),
			peer:   fmt.Sprintf("127.0.0.1:%d", ports[2*i+1]),
		}
		m.logPath = filepath.Join(base, m.name+".log")
		c.members = append(c.members, m)
		peers = append(peers, fmt.Sprintf("%s=http://%s", m.name, m.peer))
	}
	c.initialCluster = strings.Join(peers, ",")
	t.Cleanup(func() {
		for i := range c.members {
			c.kill(i)
		}
		if t.Failed() {
			for _, m := range c.members {
				b, _ := os.ReadFile(m.logPath)
				t.Logf("--- log of etcd member %s (%s) ---\n%s", m.name, m.client, b)
			}
		}
	})
	for i := range c.members {
		if err := c.start(bin, i, "new"); err != nil {
			return nil, err
		}
	}
	if err := c.waitServing(c.indexes()); err != nil {
		for i := range c.members {
			c.kill(i)
		}
		return nil, err
	}
	return c, nil
}

// start runs member i; its log is appended to, so that it shows every run.
func (c *etcdProcs) start(bin string, i int, state string) error {
	m := c.members[i]
	logFile, err := os.OpenFile(m.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logFile.Close() // the child has its own descriptor
	fmt.Fprintf(logFile, "=== %s: start (%s)\n", time.Now().Format(time.RFC3339Nano), state)
	cmd := exec.Command(bin,
		"-name", m.name, "-listen", m.client, "-peer", m.peer, "-data-dir", m.dir,
		"-initial-cluster", c.initialCluster, "-initial-cluster-state", state,
		"-initial-cluster-token", "caddy-leader-e2e", "-log-level", "error")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = childProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start etcd member %s: %v", m.name, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	m.mu.Lock()
	m.cmd, m.exited = cmd, exited
	m.mu.Unlock()
	return nil
}

// runs returns member i's process and its exit channel; nil if it was never started.
func (m *etcdProc) runs() (*exec.Cmd, chan struct{}) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cmd, m.exited
}

// running reports whether member i's process is alive.
func (c *etcdProcs) running(i int) bool {
	cmd, exited := c.members[i].runs()
	if cmd == nil {
		return false
	}
	select {
	case <-exited:
		return false
	default:
		return true
	}
}

func (c *etcdProcs) indexes() []int {
	idx := make([]int, len(c.members))
	for i := range idx {
		idx[i] = i
	}
	return idx
}

// waitServing waits until each listed member has logged that it serves (which etcd-local
// does once the member is ready: a quorum runs and the member has published itself).
func (c *etcdProcs) waitServing(idx []int) error {
	deadline := time.Now().Add(etcdReadyTimeout)
	for _, i := range idx {
		m := c.members[i]
		for {
			b, _ := os.ReadFile(m.logPath)
			// Only this run's lines: the log is appended to by every run.
			if k := bytes.LastIndex(b, []byte("=== ")); k >= 0 {
				b = b[k:]
			}
			if bytes.Contains(b, []byte("etcd-local: serving")) {
				break
			}
			if !c.running(i) {
				return fmt.Errorf("etcd member %s exited during start:\n%s", m.name, b)
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("etcd member %s not serving within %v:\n%s", m.name, etcdReadyTimeout, b)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}

// Addr is member i's client address, host:port.
func (c *etcdProcs) Addr(i int) string { return c.members[i].client }

// Kill sends member i SIGKILL and waits for it to exit: a crash, with no leadership
// transfer and no goodbye to clients.
func (c *etcdProcs) Kill(i int) {
	c.t.Helper()
	if !c.kill(i) {
		c.t.Fatalf("etcd member %d: still running %v after SIGKILL", i, exitTimeout)
	}
}

func (c *etcdProcs) kill(i int) bool {
	cmd, exited := c.members[i].runs()
	if cmd == nil {
		return true
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-exited:
		return true
	case <-time.After(exitTimeout):
		return false
	}
}

// Restart starts the killed members idx again from their data dirs, and waits until they
// serve (which needs a quorum of the cluster running).
func (c *etcdProcs) Restart(idx ...int) {
	c.t.Helper()
	for _, i := range idx {
		if c.running(i) {
			c.t.Fatalf("etcd member %d: restart: it is running", i)
		}
		if err := c.start(etcdLocalBin, i, "existing"); err != nil {
			c.t.Fatal(err)
		}
	}
	if err := c.waitServing(idx); err != nil {
		c.t.Fatal(err)
	}
}

// Client is an etcd client of the running members, closed when the test ends.
func (c *etcdProcs) Client() *clientv3.Client {
	c.t.Helper()
	var eps []string
	for i, m := range c.members {
		if c.running(i) {
			eps = append(eps, "http://"+m.client)
		}
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		c.t.Fatalf("etcd client: %v", err)
	}
	c.t.Cleanup(func() { cli.Close() })
	return cli
}

// LeaderIndex returns the member that is raft leader, once every running member names it;
// it waits up to electTimeout.
func (c *etcdProcs) LeaderIndex() int {
	c.t.Helper()
	cli := c.Client()
	deadline := time.Now().Add(electTimeout)
	for {
		if i, ok := c.agreedLeader(cli); ok {
			return i
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("etcd: no raft leader agreed on by the running members within %v", electTimeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *etcdProcs) agreedLeader(cli *clientv3.Client) (int, bool) {
	var lead uint64
	leader := -1
	for i, m := range c.members {
		if !c.running(i) {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		st, err := cli.Status(ctx, "http://"+m.client)
		cancel()
		if err != nil || st.Leader == 0 || (lead != 0 && st.Leader != lead) {
			return -1, false
		}
		lead = st.Leader
		if st.Header.MemberId == st.Leader {
			leader = i
		}
	}
	return leader, leader >= 0
}
