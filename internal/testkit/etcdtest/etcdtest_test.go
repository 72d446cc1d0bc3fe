package etcdtest

import (
	"context"
	"errors"
	"net"
	"net/url"
	"os"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// opTimeout guards each etcd call so a broken cluster fails the test
// instead of hanging it; it is not a latency expectation.
const opTimeout = 15 * time.Second

func TestCluster(t *testing.T) {
	tests := []struct {
		name    string
		members int
		run     func(t *testing.T, c *Cluster)
	}{
		{
			name:    "single_member_accepts_put_and_get",
			members: 1,
			run: func(t *testing.T, c *Cluster) {
				cli := c.Client(t)
				put(t, cli, "k", "v")
				wantGet(t, cli, "k", "v")
			},
		},
		{
			name:    "three_members_accept_put_and_get_on_every_member",
			members: 3,
			run: func(t *testing.T, c *Cluster) {
				put(t, c.Client(t), "k", "v")
				for i := range 3 {
					wantGet(t, memberClient(t, c, i), "k", "v")
				}
			},
		},
		{
			name:    "endpoints_are_loopback_urls_in_member_order",
			members: 3,
			run: func(t *testing.T, c *Cluster) {
				eps := c.Endpoints()
				if len(eps) != 3 {
					t.Fatalf("Endpoints() = %v, want 3 URLs", eps)
				}
				for i, ep := range eps {
					if ep != c.Endpoint(i) {
						t.Errorf("Endpoints()[%d] = %q, Endpoint(%d) = %q", i, ep, i, c.Endpoint(i))
					}
					if len(ep) < len("http://127.0.0.1:1") || ep[:len("http://127.0.0.1:")] != "http://127.0.0.1:" {
						t.Errorf("Endpoint(%d) = %q, want http://127.0.0.1:PORT", i, ep)
					}
				}
			},
		},
		{
			name:    "stopping_a_follower_keeps_the_cluster_writable",
			members: 3,
			run: func(t *testing.T, c *Cluster) {
				follower := (c.LeaderIndex(t) + 1) % 3
				c.Stop(t, follower)
				if c.Running(follower) {
					t.Fatalf("Running(%d) = true after Stop", follower)
				}
				wantCut(t, c.Endpoint(follower))
				cli := c.Client(t)
				put(t, cli, "k", "after-stop")
				wantGet(t, cli, "k", "after-stop")
			},
		},
		{
			name:    "stopping_the_leader_yields_a_new_leader_and_keeps_the_cluster_writable",
			members: 3,
			run: func(t *testing.T, c *Cluster) {
				old := c.LeaderIndex(t)
				c.Stop(t, old)
				if now := c.LeaderIndex(t); now == old {
					t.Fatalf("LeaderIndex() = %d after stopping that member", now)
				}
				cli := c.Client(t)
				put(t, cli, "k", "after-leader-stop")
				wantGet(t, cli, "k", "after-leader-stop")
			},
		},
		{
			name:    "stop_is_idempotent",
			members: 1,
			run: func(t *testing.T, c *Cluster) {
				c.Stop(t, 0)
				c.Stop(t, 0)
				if c.Running(0) {
					t.Fatal("Running(0) = true after Stop")
				}
			},
		},
		{
			name:    "restarted_single_member_keeps_its_data",
			members: 1,
			run: func(t *testing.T, c *Cluster) {
				put(t, c.Client(t), "k", "v")
				c.Stop(t, 0)
				c.Restart(t, 0)
				if !c.Running(0) {
					t.Fatal("Running(0) = false after Restart")
				}
				wantGet(t, c.Client(t), "k", "v")
			},
		},
		{
			name:    "restarted_follower_serves_the_newest_value",
			members: 3,
			run: func(t *testing.T, c *Cluster) {
				i := (c.LeaderIndex(t) + 1) % 3
				put(t, c.Client(t), "k", "old")
				c.Stop(t, i)
				put(t, c.Client(t), "k", "new")
				c.Restart(t, i)
				wantGet(t, memberClient(t, c, i), "k", "new")
			},
		},
		{
			name:    "restarted_leader_rejoins_and_serves_the_newest_value",
			members: 3,
			run: func(t *testing.T, c *Cluster) {
				i := c.LeaderIndex(t)
				c.Stop(t, i)
				put(t, c.Client(t), "k", "new")
				c.Restart(t, i)
				wantGet(t, memberClient(t, c, i), "k", "new")
				c.LeaderIndex(t)
			},
		},
		{
			name:    "restart_after_quorum_loss_waits_for_the_restart_that_restores_quorum",
			members: 3,
			run: func(t *testing.T, c *Cluster) {
				put(t, c.Client(t), "k", "v")
				c.Stop(t, 0)
				c.Stop(t, 1)
				c.Restart(t, 0) // two of three running: quorum again
				c.Stop(t, 2)
				c.Restart(t, 1)
				c.Restart(t, 2)
				for i := range 3 {
					wantGet(t, memberClient(t, c, i), "k", "v")
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.run(t, Start(t, tt.members))
		})
	}
}

// memberClient returns a client that talks to member i only, so a read
// proves what that member serves.
func memberClient(t *testing.T, c *Cluster, i int) *clientv3.Client {
	t.Helper()
	cli, err := newClient([]string{c.Endpoint(i)})
	if err != nil {
		t.Fatalf("client for member %d: %v", i, err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// wantCut checks that a stopped member's port serves nothing: the front keeps the port (so
// that a restart finds it free) but closes every connection at once, as a crashed member's
// refuses it.
func wantCut(t *testing.T, endpoint string) {
	t.Helper()
	u, err := url.Parse(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		return // refused: nothing serves it either
	}
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("a connection to %s after Stop was not cut (read: %v)", u.Host, err)
	}
}

func put(t *testing.T, cli *clientv3.Client, key, val string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if _, err := cli.Put(ctx, key, val); err != nil {
		t.Fatalf("Put(%q, %q): %v", key, val, err)
	}
}

// wantGet does a linearizable Get (clientv3's default) and checks the value.
func wantGet(t *testing.T, cli *clientv3.Client, key, want string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	resp, err := cli.Get(ctx, key)
	if err != nil {
		t.Fatalf("Get(%q): %v", key, err)
	}
	if len(resp.Kvs) != 1 {
		t.Fatalf("Get(%q) returned %d keys, want 1", key, len(resp.Kvs))
	}
	if got := string(resp.Kvs[0].Value); got != want {
		t.Errorf("Get(%q) = %q, want %q", key, got, want)
	}
}
