package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/caddyleader/caddy-leader/internal/testkit/freeport"
)

// safeBuffer is the output of one run, written by its goroutine and read by the test.
type safeBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *safeBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *safeBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// serve runs the command with dir as -data-dir until the test stops it, and returns a client,
// the output, and the function that stops it and waits.
func serve(t *testing.T, dir string) (*clientv3.Client, *safeBuffer, func()) {
	t.Helper()
	ports := freeport.MustPick(t, 2)
	o := options{client: fmt.Sprintf("127.0.0.1:%d", ports[0]), peer: fmt.Sprintf("127.0.0.1:%d", ports[1]),
		dir: dir, name: "local", clusterState: "new", clusterToken: "etcd-local", logLevel: "fatal"}
	stop := make(chan os.Signal, 1)
	out := new(safeBuffer)
	done := make(chan error, 1)
	go func() { done <- run(o, stop, out) }()
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(out.String(), "serving"); time.Sleep(10 * time.Millisecond) {
		select {
		case err := <-done:
			t.Fatalf("etcd-local exited: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("etcd-local never served")
		}
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{o.client}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return cli, out, func() {
		_ = cli.Close()
		stop <- syscall.SIGTERM
		if err := <-done; err != nil {
			t.Errorf("etcd-local: %v", err)
		}
	}
}

func TestDataDir(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	get := func(t *testing.T, cli *clientv3.Client) int64 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := cli.Get(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		return resp.Count
	}
	put := func(t *testing.T, cli *clientv3.Client) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := cli.Put(ctx, "k", "v"); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("kept_with_data_dir", func(t *testing.T) {
		dir := t.TempDir()
		cli, out, stop := serve(t, dir)
		put(t, cli)
		stop()
		if !strings.Contains(out.String(), "data in "+dir+", kept across restarts") {
			t.Errorf("output %q does not say that the data is kept", out)
		}
		cli, _, stop = serve(t, dir)
		defer stop()
		if get(t, cli) != 1 {
			t.Error("the key written before the restart is gone")
		}
	})

	t.Run("deleted_without_and_says_so", func(t *testing.T) {
		_, out, stop := serve(t, "")
		stop()
		if !strings.Contains(out.String(), "DELETED when it stops") || !strings.Contains(out.String(), "-data-dir") {
			t.Errorf("output %q does not warn that the data is deleted and how to keep it", out)
		}
		var tmp string
		for _, line := range strings.Split(out.String(), "\n") {
			if rest, ok := strings.CutPrefix(line, "etcd-local: data in "); ok {
				tmp, _, _ = strings.Cut(rest, ",")
			}
		}
		if _, err := os.Stat(tmp); tmp == "" || !os.IsNotExist(err) {
			t.Errorf("the temporary data directory %q was not deleted: %v", tmp, err)
		}
	})
}
