package kubetest

import (
	"bufio"
	"crypto/tls"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// LeaseRequests reads the API server's own count of the requests it has served on Lease
// objects, by verb (GET, LIST, WATCH, CREATE, UPDATE, DELETE...), from its /metrics
// (apiserver_request_total). WATCH counts the watches opened, not their events.
func (s *Server) LeaseRequests(tb testing.TB) map[string]float64 {
	tb.Helper()
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	req, _ := http.NewRequest("GET", s.URL+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+s.Token("admin"))
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
