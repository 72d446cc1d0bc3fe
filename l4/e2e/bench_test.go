package e2e

import (
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/fleet"
)

// BenchmarkConnection measures what the layer-4 gate adds to a short connection: connect
// through one Caddy instance that leads, send a Redis PING, read the PONG, close; through
// caddy-l4's proxy alone (plain) and through leader_gate then the same proxy (gated). Run
// it with -count so that the two alternate:
//
//	cd l4 && go test -run '^$' -bench Connection -count 6 ./e2e/
func BenchmarkConnection(b *testing.B) {
	nodes := startNodes(b, 1, fleet.Config{})
	fleet.WaitStableLeader(b, instances(nodes), electTimeout)
	nd := nodes[0]
	for _, route := range []struct{ name, addr string }{{"plain", nd.plainAddr}, {"gated", nd.closeAddr}} {
		b.Run(route.name, func(b *testing.B) {
			for b.Loop() {
				c, err := dialRESP(route.addr, time.Second)
				if err != nil {
					b.Fatal(err)
				}
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				if reply, err := c.do("PING"); err != nil || reply != "PONG" {
					b.Fatalf("PING through %s: %v %v", route.name, reply, err)
				}
				c.Close()
			}
		})
	}
}
