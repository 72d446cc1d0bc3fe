package caddyleader

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"gopkg.in/yaml.v3"
)

// exportedMetricNames are the names of the series metrics.go exports.
func exportedMetricNames(t *testing.T) map[string]bool {
	t.Helper()
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	names := make(map[string]bool)
	for _, c := range metricCollectors() {
		ch := make(chan *prometheus.Desc, 16)
		c.Describe(ch)
		close(ch)
		for d := range ch {
			m := fqName.FindStringSubmatch(d.String())
			if m == nil {
				t.Fatalf("no metric name in %s", d)
			}
			names[m[1]] = true
			if _, histogram := c.(*prometheus.HistogramVec); histogram {
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					names[m[1]+suffix] = true
				}
			}
		}
	}
	return names
}

var (
	promqlStrings  = regexp.MustCompile("\"(?:[^\"\\\\]|\\\\.)*\"|'(?:[^'\\\\]|\\\\.)*'|`[^`]*`")
	promqlMatchers = regexp.MustCompile(`\{[^}]*\}|\[[^\]]*\]`)
	promqlGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promqlIdent    = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*`)
	promqlKeywords = []string{"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
		"group_left", "group_right", "inf", "nan", "Inf", "NaN"}
)

// promqlMetricNames lists the metric names a PromQL expression selects: the identifiers left
// once strings, label matchers, ranges and grouping clauses are gone, that are neither
// keywords nor called as functions, nor parts of numbers, durations or Grafana variables.
func promqlMetricNames(expr string) []string {
	expr = promqlStrings.ReplaceAllString(expr, `""`)
	expr = promqlMatchers.ReplaceAllString(expr, " ")
	expr = promqlGrouping.ReplaceAllString(expr, " ")
	var names []string
	for _, loc := range promqlIdent.FindAllStringIndex(expr, -1) {
		name := expr[loc[0]:loc[1]]
		if loc[0] > 0 && strings.ContainsAny(expr[loc[0]-1:loc[0]], "0123456789.$") {
			continue
		}
		if strings.HasPrefix(strings.TrimLeft(expr[loc[1]:], " \t\n"), "(") || slices.Contains(promqlKeywords, name) {
			continue
		}
		names = append(names, name)
	}
	return names
}

func TestPromqlMetricNames(t *testing.T) {
	for _, c := range []struct {
		name, expr string
		want       []string
	}{
		{"bare_selector", `caddy_leader_is_leader`, []string{"caddy_leader_is_leader"}},
		{"matchers_and_strings_are_not_names", `up{job=~"caddy|other", instance!="x{y}"} == 0`, []string{"up"}},
		{"functions_ranges_and_grouping", `sum by (election, to) (increase(caddy_leader_transitions_total{to="leader"}[$__rate_interval])) > 3`,
			[]string{"caddy_leader_transitions_total"}},
		{"binary_operators_and_numbers", `a < 0.5 * max_over_time(b[10m]) and on (job) c == 1e3 offset 5m`, []string{"a", "b", "c"}},
		{"grafana_variables", `rate(x{election=~"$election"}[$__range]) / $scale`, []string{"x"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := promqlMetricNames(c.expr); !slices.Equal(got, c.want) {
				t.Errorf("promqlMetricNames(%q) = %q, want %q", c.expr, got, c.want)
			}
		})
	}
}

// deployedQueries are the PromQL expressions of the alerting rules and the Grafana dashboard
// under deploy/, each named by where it is.
func deployedQueries(t *testing.T) map[string]string {
	t.Helper()
	queries := make(map[string]string)

	raw, err := os.ReadFile("deploy/prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Name  string
			Rules []struct{ Alert, Record, Expr string }
		}
	}
	if err := yaml.Unmarshal(raw, &rules); err != nil {
		t.Fatalf("alerts.yml: %v", err)
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			queries["alerts.yml "+g.Name+"/"+r.Alert+r.Record] = r.Expr
		}
	}

	raw, err = os.ReadFile("deploy/grafana/caddy-leader.json")
	if err != nil {
		t.Fatal(err)
	}
	var dashboard struct {
		Panels []struct {
			Title   string
			Targets []struct{ RefID, Expr string }
		}
		Templating struct {
			List []struct {
				Name  string
				Type  string
				Query json.RawMessage
			}
		}
	}
	if err := json.Unmarshal(raw, &dashboard); err != nil {
		t.Fatalf("caddy-leader.json: %v", err)
	}
	for _, p := range dashboard.Panels {
		for _, target := range p.Targets {
			queries["caddy-leader.json panel "+p.Title+"/"+target.RefID] = target.Expr
		}
	}
	labelValues := regexp.MustCompile(`^label_values\((.*),\s*\w+\)$`)
	for _, v := range dashboard.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct{ Query string }
		if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Fatalf("caddy-leader.json variable %s: %v", v.Name, err)
		}
		m := labelValues.FindStringSubmatch(q.Query)
		if m == nil {
			t.Fatalf("caddy-leader.json variable %s: %q is not label_values(selector, label)", v.Name, q.Query)
		}
		queries["caddy-leader.json variable "+v.Name] = m[1]
	}
	return queries
}

// TestDeployedQueriesNameExportedMetrics keeps the alerting rules and the dashboard in step
// with metrics.go: a renamed or misspelt metric would leave an alert that never fires.
func TestDeployedQueriesNameExportedMetrics(t *testing.T) {
	exported := exportedMetricNames(t)
	queries := deployedQueries(t)
	if len(queries) == 0 {
		t.Fatal("no queries found under deploy/")
	}
	for where, expr := range queries {
		t.Run(where, func(t *testing.T) {
			names := promqlMetricNames(expr)
			if len(names) == 0 {
				t.Errorf("%q selects no metric", expr)
			}
			for _, n := range names {
				if !exported[n] {
					t.Errorf("%q selects %s, which metrics.go does not export", expr, n)
				}
			}
		})
	}
}
