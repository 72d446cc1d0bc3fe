package e2e

import (
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/fleet"
)

// BenchmarkConnection measures what the layer-4 gate adds to a short connection: connect
// through one Caddy instance that leads, send a Redis PING, read the PONG, close; through
// caddy-l4's proxy alone (plain) and through leader_gate then the same proxy (gated). Each
// iteration makes one connection of each kind, in alternating order, so that both see the
// same machine load; it reports the mean time of each and their ratio.
//
//	cd l4 && go test -run '^$' -bench Connection -benchtime 2000x -count 3 ./e2e/
func BenchmarkConnection(b *testing.B) {
	nodes := startNodes(b, 1, fleet.Config{})
	fleet.WaitStableLeader(b, instances(nodes), electTimeout)
	nd := nodes[0]
	ping := func(addr string) time.Duration {
		start := time.Now()
		c, err := dialRESP(addr, time.Second)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if reply, err := c.do("PING"); err != nil || reply != "PONG" {
			b.Fatalf("PING through %s: %v %v", addr, reply, err)
		}
		return time.Since(start)
	}
	var plain, gated time.Duration
	i := 0
	for b.Loop() {
		if i%2 == 0 {
			plain += ping(nd.plainAddr)
			gated += ping(nd.closeAddr)
		} else {
			gated += ping(nd.closeAddr)
			plain += ping(nd.plainAddr)
		}
		i++
	}
	b.ReportMetric(float64(plain.Nanoseconds())/float64(i), "plain-ns/conn")
	b.ReportMetric(float64(gated.Nanoseconds())/float64(i), "gated-ns/conn")
	b.ReportMetric(float64(gated)/float64(plain), "gated/plain")
}
