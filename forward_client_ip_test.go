package caddyleader

import (
	"context"
	"fmt"
	"github.com/caddyleader/caddy-leader/internal/testkit/freeport"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
)

// TestForwardedClientIP forwards requests for real, from a Caddy whose gate runs in
// follower forward mode to leaders that are Caddy servers too, and shows what the leader
// sees of the client: with Caddy's trusted_proxies naming the followers, {client_ip} is the
// client's address (taken from X-Forwarded-For); without, it is the follower's. The
// connection's peer, {http.request.remote.host}, is the follower's either way. The client
// connects from 127.0.0.2, the follower from 127.0.0.1, so the two can be told apart.
func TestForwardedClientIP(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and Caddy")
	}
	cluster := etcdtest.Start(t, 1)
	const prefix = "/client-ip-test/"
	ports := freeport.MustPick(t, 3)
	follower, trusting, notTrusting := ports[0], ports[1], ports[2]
	leaderURL := func(port int) string { return fmt.Sprintf("http://127.0.0.1:%d", port) }
	for election, port := range map[string]int{"trusted": trusting, "untrusted": notTrusting} {
		l := startInstanceUnder(t, cluster.Endpoints(), prefix, "leader-"+election, leaderURL(port), election, 3*time.Second, false)
		waitUntil(t, election+" has its leader", func() bool { _, ok := l.election.Check(); return ok })
	}

	loadCaddyfile(t, fmt.Sprintf(`{
	admin off
	persist_config off
	leader {
		endpoints %s
		prefix %s
		instance_id follower-node
		advertise http://127.0.0.1:%d
	}
	servers :%d {
		trusted_proxies static 127.0.0.1/32
	}
}

http://:%d {
	handle /trusted {
		leader_gate trusted {
			follower forward
		}
	}
	handle /untrusted {
		leader_gate untrusted {
			follower forward
		}
	}
}

http://:%d, http://:%d {
	respond "{http.request.remote.host} {client_ip}"
}
`, cluster.Endpoint(0), prefix, follower, trusting, follower, trusting, notTrusting))

	client := &http.Client{Transport: &http.Transport{DialContext: (&net.Dialer{
		LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)},
	}).DialContext}}
	cases := []struct {
		path string
		// What the leader sees: the connection's peer and {client_ip}.
		want string
	}{
		{"/trusted", "127.0.0.1 127.0.0.2"},
		{"/untrusted", "127.0.0.1 127.0.0.1"},
	}
	for _, tc := range cases {
		t.Run(tc.path[1:], func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("http://127.0.0.1:%d%s", follower, tc.path), nil)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || string(body) != tc.want {
				t.Fatalf("the leader answered %d %q, want 200 %q (remote.host client_ip)", resp.StatusCode, body, tc.want)
			}
		})
	}
}
