package deployq

import (
	"slices"
	"testing"
)

func TestMetrics(t *testing.T) {
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
		{"recorded_names", `election:caddy_leader_leaderless:bool{job=~"$job"}`, []string{"election:caddy_leader_leaderless:bool"}},
		{"name_matcher", `{__name__=~"caddy_leader_is_leader|caddy_leader_requests_total", job=~"$job"}`,
			[]string{"caddy_leader_is_leader", "caddy_leader_requests_total"}},
		{"name_matcher_beside_a_metric", `a{b="c"} and {__name__="d"}`, []string{"d", "a"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := Metrics(c.expr); !slices.Equal(got, c.want) {
				t.Errorf("Metrics(%q) = %q, want %q", c.expr, got, c.want)
			}
		})
	}
}

func TestLabels(t *testing.T) {
	for _, c := range []struct {
		name, expr string
		want, made []string
	}{
		{"matchers", `x{job=~"$job", election!="a,b", to="leader"}`, []string{"job", "election", "to"}, nil},
		{"grouping_clauses", `sum by (election, le) (rate(x[1m])) / on (job) group_left (instance) y`, []string{"election", "le", "job", "instance"}, nil},
		{"strings_hide_nothing_that_looks_like_a_matcher", `x{reason="a=b"}`, []string{"reason"}, nil},
		{"label_replace_makes_a_label", `count by (role) (label_replace(x == 1, "role", "leader", "", ""))`, []string{"role"}, []string{"role"}},
		{"the_name_matcher_names_metrics_not_a_label", `{__name__=~"a|b", job="c"}`, []string{"job"}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := Labels(c.expr); !slices.Equal(got, c.want) {
				t.Errorf("Labels(%q) = %q, want %q", c.expr, got, c.want)
			}
			if got := Made(c.expr); !slices.Equal(got, c.made) {
				t.Errorf("Made(%q) = %q, want %q", c.expr, got, c.made)
			}
		})
	}
}
