package caddyleader

import (
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/caddyleader/caddy-leader/internal/testkit/deployq"
)

// exportedMetrics are the names of the series metrics.go exports, each with its labels.
func exportedMetrics(t *testing.T) map[string][]string {
	t.Helper()
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	variable := regexp.MustCompile(`variableLabels: \{([^}]*)\}`)
	names := make(map[string][]string)
	for _, c := range metricCollectors() {
		ch := make(chan *prometheus.Desc, 16)
		c.Describe(ch)
		close(ch)
		for d := range ch {
			m := fqName.FindStringSubmatch(d.String())
			if m == nil {
				t.Fatalf("no metric name in %s", d)
			}
			var labels []string
			if v := variable.FindStringSubmatch(d.String()); v != nil && v[1] != "" {
				labels = regexp.MustCompile(`[A-Za-z_][A-Za-z0-9_]*`).FindAllString(v[1], -1)
			}
			names[m[1]] = labels
			if _, histogram := c.(*prometheus.HistogramVec); histogram {
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					names[m[1]+suffix] = labels
				}
				names[m[1]+"_bucket"] = append(slices.Clone(labels), "le")
			}
		}
	}
	return names
}

// TestDeployedQueriesNameExportedMetrics keeps the alerting and recording rules and the
// dashboard in step with metrics.go: a renamed or misspelt metric or label would leave an
// alert that never fires and a panel that stays empty. A dashboard may also name what the
// recording rules record. e2e/browser runs the same queries against a real Prometheus.
func TestDeployedQueriesNameExportedMetrics(t *testing.T) {
	exported := exportedMetrics(t)
	recorded, err := deployq.Recorded(".")
	if err != nil {
		t.Fatal(err)
	}
	queries, err := deployq.Deployed(".")
	if err != nil {
		t.Fatal(err)
	}
	if len(queries) == 0 {
		t.Fatal("no queries found under deploy/")
	}
	// Labels every scraped series has, and the bucket bound of histograms.
	labels := []string{"job", "instance", "le"}
	for _, l := range exported {
		labels = append(labels, l...)
	}
	// And the labels the recording rules make, which the dashboard reads back.
	for _, q := range queries {
		if strings.HasPrefix(q.Where, filepath.Base(deployq.RecordingFile)) {
			labels = append(labels, deployq.Made(q.Expr)...)
		}
	}
	for _, q := range queries {
		t.Run(q.Where, func(t *testing.T) {
			names := deployq.Metrics(q.Expr)
			if len(names) == 0 {
				t.Errorf("%q selects no metric", q.Expr)
			}
			for _, n := range names {
				if _, ok := exported[n]; !ok && !slices.Contains(recorded, n) {
					t.Errorf("%q selects %s, which metrics.go does not export and no recording rule records", q.Expr, n)
				}
			}
			made := deployq.Made(q.Expr)
			for _, l := range deployq.Labels(q.Expr) {
				if !slices.Contains(labels, l) && !slices.Contains(made, l) {
					t.Errorf("%q names the label %s, which no exported metric has", q.Expr, l)
				}
			}
		})
	}
}

// TestExportedLabelsKeepClearOfTargetLabels: Prometheus gives every scraped series its
// target's job and instance labels, and renames a metric's own label of that name to
// exported_<name>, which every query would then have to know.
func TestExportedLabelsKeepClearOfTargetLabels(t *testing.T) {
	for name, labels := range exportedMetrics(t) {
		for _, l := range labels {
			if l == "job" || l == "instance" {
				t.Errorf("%s has the label %q, which Prometheus sets on every scraped series", name, l)
			}
		}
	}
}
