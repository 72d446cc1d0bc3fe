package caddyleader

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestMetricsDocListsStoreErrorOps keeps the `op` values listed in docs/metrics.md in step with
// the code: an operator writing an alert on one op must find every op the elector reports.
func TestMetricsDocListsStoreErrorOps(t *testing.T) {
	doc, err := os.ReadFile("docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	var row string
	for _, line := range strings.Split(string(doc), "\n") {
		if strings.HasPrefix(line, "| `caddy_leader_store_errors_total{op}`") {
			row = line
		}
	}
	if row == "" {
		t.Fatal("docs/metrics.md has no row for caddy_leader_store_errors_total")
	}
	files, err := filepath.Glob("elector/*.go")
	if err != nil {
		t.Fatal(err)
	}
	call := regexp.MustCompile(`storeFailed\("([^"]+)"`)
	ops := map[string]bool{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range call.FindAllStringSubmatch(string(src), -1) {
			ops[m[1]] = true
		}
	}
	if len(ops) == 0 {
		t.Fatal("found no storeFailed calls in elector/: the test no longer sees the code")
	}
	for op := range ops {
		t.Run(op, func(t *testing.T) {
			if !strings.Contains(row, "`"+op+"`") {
				t.Errorf("docs/metrics.md does not list op %q for caddy_leader_store_errors_total", op)
			}
		})
	}
}
