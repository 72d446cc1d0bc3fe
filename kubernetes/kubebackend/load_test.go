package kubebackend

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/elector/electortest"
	"github.com/caddyleader/caddy-leader/kubernetes/internal/kubetest"
)

// leaseRequests reads the API server's count of requests on leases, by verb, from its
// /metrics.
func leaseRequests(tb testing.TB, srv *kubetest.Server) map[string]float64 {
	tb.Helper()
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	req, _ := http.NewRequest("GET", srv.URL+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+srv.Token("admin"))
	resp, err := client.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	counts := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "apiserver_request_total{") || !strings.Contains(line, `resource="leases"`) {
			continue
		}
		i := strings.Index(line, `verb="`)
		j := strings.LastIndexByte(line, ' ')
		if i < 0 || j < 0 {
			continue
		}
		verb := line[i+6:]
		verb = verb[:strings.IndexByte(verb, '"')]
		v, _ := strconv.ParseFloat(line[j+1:], 64)
		counts[verb] += v
	}
	return counts
}

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
		before := leaseRequests(b, srv)
		time.Sleep(window)
		after := leaseRequests(b, srv)
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
