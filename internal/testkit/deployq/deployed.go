package deployq

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"

	"gopkg.in/yaml.v3"
)

// The files under the repository's deploy/ that hold PromQL.
const (
	AlertsFile    = "deploy/prometheus/alerts.yml"
	RecordingFile = "deploy/prometheus/recording.yml"
	DashboardFile = "deploy/grafana/caddy-leader.json"
)

// Query is one PromQL expression of deploy/.
type Query struct {
	// Where names it: the file, and the rule or the panel and target.
	Where string
	// Panel is the dashboard panel's title; empty for a rule or a variable.
	Panel string
	// Expr is the expression as written, Grafana variables and all.
	Expr string
}

// Rules are the rule groups of a Prometheus rule file.
type Rules struct {
	Groups []struct {
		Name  string
		Rules []struct{ Alert, Record, Expr string }
	}
}

// Recorded lists the names the recording rules of root's deploy/ record.
func Recorded(root string) ([]string, error) {
	rules, err := readRules(filepath.Join(root, RecordingFile))
	if err != nil {
		return nil, err
	}
	var names []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				names = append(names, r.Record)
			}
		}
	}
	return names, nil
}

func readRules(path string) (Rules, error) {
	var rules Rules
	raw, err := os.ReadFile(path)
	if err != nil {
		return rules, err
	}
	if err := yaml.Unmarshal(raw, &rules); err != nil {
		return rules, fmt.Errorf("%s: %v", path, err)
	}
	return rules, nil
}

var labelValues = regexp.MustCompile(`^label_values\((.*),\s*\w+\)$`)

// Deployed reads every PromQL expression of the rule files and the dashboard under root's
// deploy/, in file order: the rules, then each panel's targets, then the dashboard's
// query variables (their label_values selector).
func Deployed(root string) ([]Query, error) {
	var queries []Query
	for _, file := range []string{AlertsFile, RecordingFile} {
		rules, err := readRules(filepath.Join(root, file))
		if err != nil {
			return nil, err
		}
		for _, g := range rules.Groups {
			for _, r := range g.Rules {
				queries = append(queries, Query{Where: filepath.Base(file) + " " + g.Name + "/" + r.Alert + r.Record, Expr: r.Expr})
			}
		}
	}

	raw, err := os.ReadFile(filepath.Join(root, DashboardFile))
	if err != nil {
		return nil, err
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
		return nil, fmt.Errorf("%s: %v", DashboardFile, err)
	}
	for _, p := range dashboard.Panels {
		for _, target := range p.Targets {
			queries = append(queries, Query{Where: "caddy-leader.json panel " + p.Title + "/" + target.RefID, Panel: p.Title, Expr: target.Expr})
		}
	}
	for _, v := range dashboard.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct{ Query string }
		if err := json.Unmarshal(v.Query, &q); err != nil {
			return nil, fmt.Errorf("%s variable %s: %v", DashboardFile, v.Name, err)
		}
		m := labelValues.FindStringSubmatch(q.Query)
		if m == nil {
			return nil, fmt.Errorf("%s variable %s: %q is not label_values(selector, label)", DashboardFile, v.Name, q.Query)
		}
		queries = append(queries, Query{Where: "caddy-leader.json variable " + v.Name, Expr: m[1]})
	}
	return queries, nil
}
