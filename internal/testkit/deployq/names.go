// Package deployq reads the PromQL of deploy/'s dashboard and rules and lists the metrics and labels it names, for the tests.
package deployq

import (
	"regexp"
	"slices"
	"strings"
)

var (
	strs      = regexp.MustCompile("\"(?:[^\"\\\\]|\\\\.)*\"|'(?:[^'\\\\]|\\\\.)*'|`[^`]*`")
	matchers  = regexp.MustCompile(`\{[^}]*\}|\[[^\]]*\]`)
	grouping  = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
	ident     = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*`)
	matcher   = regexp.MustCompile(`([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)`)
	replaced  = regexp.MustCompile(`label_replace\s*\(`)
	quoted    = regexp.MustCompile(`"((?:[^"\\]|\\.)*)"`)
	keywords  = []string{"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right", "inf", "nan", "Inf", "NaN"}
	labelOnly = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	// byName is a matcher on the metric name, `{__name__=~"a|b"}`, which selects several
	// metrics at once (a Grafana variable that draws on more than one).
	byName = regexp.MustCompile(`\b__name__\s*=~?\s*"([^"]*)"`)
)

// Metrics lists the metric names expr selects: the identifiers left once strings, label
// matchers, ranges and grouping clauses are gone, that are neither keywords nor called as
// functions, nor parts of numbers, durations or Grafana variables; and the names a
// __name__ matcher lists (one name, or names joined by |).
func Metrics(expr string) []string {
	var names []string
	for _, m := range byName.FindAllStringSubmatch(expr, -1) {
		names = append(names, strings.Split(m[1], "|")...)
	}
	expr = strs.ReplaceAllString(expr, `""`)
	expr = matchers.ReplaceAllString(expr, " ")
	expr = grouping.ReplaceAllString(expr, " ")
	for _, loc := range ident.FindAllStringIndex(expr, -1) {
		name := expr[loc[0]:loc[1]]
		if loc[0] > 0 && strings.ContainsAny(expr[loc[0]-1:loc[0]], "0123456789.$") {
			continue
		}
		if strings.HasPrefix(strings.TrimLeft(expr[loc[1]:], " \t\n"), "(") || slices.Contains(keywords, name) {
			continue
		}
		names = append(names, name)
	}
	return names
}

// Labels lists the label names expr reads: those its matchers test and those its grouping
// clauses (by, without, on, ignoring, group_left, group_right) name, each once, in order.
// __name__ is left out: it names metrics, which Metrics lists.
func Labels(expr string) []string {
	var names []string
	add := func(n string) {
		if n != "" && n != "__name__" && labelOnly.MatchString(n) && !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	plain := strs.ReplaceAllString(expr, `""`)
	for _, m := range matchers.FindAllString(plain, -1) {
		if strings.HasPrefix(m, "{") {
			for _, l := range matcher.FindAllStringSubmatch(m, -1) {
				add(l[1])
			}
		}
	}
	for _, g := range grouping.FindAllStringSubmatch(plain, -1) {
		for _, l := range strings.Split(g[1], ",") {
			add(strings.TrimSpace(l))
		}
	}
	return names
}

// Made lists the labels expr makes with label_replace (its destination label), which a
// later grouping may name although no metric has them.
func Made(expr string) []string {
	var names []string
	for _, loc := range replaced.FindAllStringIndex(expr, -1) {
		// label_replace(v, "dst", "replacement", "src", "regex"): the first string after
		// the call's opening is the destination.
		if q := quoted.FindStringSubmatch(expr[loc[1]:]); q != nil {
			names = append(names, q[1])
		}
	}
	return names
}
