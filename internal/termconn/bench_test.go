package termconn

import (
	"net"
	"testing"

	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
)

// BenchmarkAdmit is what tracking costs a connection on the leader: Admit and Done (the
// election's Enter and Exit, the guard's bookkeeping and metrics), against Enter and Exit
// alone, the HTTP gate's cost.
//
//	go test -run '^$' -bench Admit -count 6 ./internal/termconn/
func BenchmarkAdmit(b *testing.B) {
	cluster := etcdtest.Start(b, 1)
	leader, _ := pair(b, cluster.Endpoints(), "bench")
	server, client := net.Pipe()
	defer server.Close()
	defer client.Close()
	b.Run("enter_exit", func(b *testing.B) {
		for b.Loop() {
			if _, ok := leader.e.Enter(); !ok {
				b.Fatal("not admitted")
			}
			leader.e.Exit()
		}
	})
	b.Run("admit_done", func(b *testing.B) {
		g := For(leader.e)
		for b.Loop() {
			c, _ := g.Admit(server, Options{Kind: "bench"})
			if c == nil {
				b.Fatal("not admitted")
			}
			c.Done()
		}
	})
}
