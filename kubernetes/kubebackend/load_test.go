package kubebackend

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/elector/electortest"
	"github.com/caddyleader/caddy-leader/kubernetes/internal/kubetest"
)

// BenchmarkIdleLoad measures the requests a settled election of candidates makes on the
// API server, per candidate and second (the API server's own count; WATCH counts the
// watches opened):
//
//	cd kubernetes && go test -run '^$' -bench IdleLoad -benchtime 1x ./kubebackend/
func BenchmarkIdleLoad(b *testing.B) {
	const (
		size   = 5
		ttl    = 3 * time.Second
		window = 15 * time.Second
	)
	srv := kubetest.Start(b, kubetest.Options{})
	kubeconfig := srv.Kubeconfig(b, "admin", "default", "")
	for range b.N {
		fleet := electortest.StartFleet(b, electortest.FleetOptions{
			Size: size, TTL: ttl, Election: "idle",
			Backend: func(tb testing.TB, i int) elector.Backend {
				be, err := New(Config{Kubeconfig: kubeconfig, Prefix: "idle-"})
				if err != nil {
					tb.Fatal(err)
				}
				return be
			},
		})
		fleet.Leader(ttl + 10*time.Second)
		time.Sleep(ttl) // settle: announcements, the first renewals
		before := srv.LeaseRequests(b)
		time.Sleep(window)
		after := srv.LeaseRequests(b)
		var total float64
		var parts []string
		for verb, n := range after {
			d := (n - before[verb]) / size / window.Seconds()
			total += d
			parts = append(parts, fmt.Sprintf("%s %.2f", verb, d))
		}
		b.ReportMetric(total, "req/s/candidate")
		b.Logf("ttl %s, %d candidates, requests per candidate per second: %.2f (%s)", ttl, size, total, strings.Join(parts, ", "))
	}
}
