package e2e

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// connectionsCut sums caddy_leader_connections_cut_total of one kind over its other labels,
// as the node's admin API serves it.
func connectionsCut(t testing.TB, nd *node, kind string) float64 {
	t.Helper()
	resp, err := nd.Admin(http.MethodGet, "/metrics", nil)
	if err != nil || resp.Status != http.StatusOK {
		t.Fatalf("%s: GET /metrics: %v %d", nd.ID, err, resp.Status)
	}
	var sum float64
	for _, line := range strings.Split(resp.Body, "\n") {
		if !strings.HasPrefix(line, "caddy_leader_connections_cut_total{") || !strings.Contains(line, `kind="`+kind+`"`) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("%s: metric line %q: %v", nd.ID, line, err)
		}
		sum += v
	}
	return sum
}
