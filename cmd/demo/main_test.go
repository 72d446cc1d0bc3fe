package main

import "testing"

// TestLogsFate: where the demo prints the log paths, it says whether they outlive it.
func TestLogsFate(t *testing.T) {
	for _, tc := range []struct {
		keep bool
		want string
	}{
		{false, "deleted when the demo exits unless a step fails; --keep-logs keeps them"},
		{true, "kept when the demo exits"},
	} {
		if got := (&demo{keepLogs: tc.keep}).logsFate(); got != tc.want {
			t.Errorf("keepLogs %v: %q, want %q", tc.keep, got, tc.want)
		}
	}
}

func TestParseArgs(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want options // compared when ok
		ok   bool
	}{
		{"no_options_walk_through_on_etcd", nil, options{mode: walk, store: "etcd"}, true},
		{"ci_on_postgres", []string{"--ci", "--store", "postgres"}, options{mode: walk, ci: true, store: "postgres"}, true},
		{"store_with_equals_sign", []string{"--store=postgres", "--keep"}, options{mode: keep, store: "postgres"}, true},
		{"keep_logs", []string{"--keep-logs", "--ci"}, options{mode: walk, ci: true, store: "etcd", keepLogs: true}, true},
		{"store_etcd_explicitly", []string{"--manual", "--store", "etcd"}, options{mode: manual, store: "etcd"}, true},
		{"help_stops_reading", []string{"--help", "--bogus"}, options{mode: walk, store: "etcd", help: true}, true},
		{"store_without_a_value", []string{"--store"}, options{}, false},
		{"unknown_store", []string{"--store", "mysql"}, options{}, false},
		{"unknown_option", []string{"--fast"}, options{}, false},
		{"ci_with_keep", []string{"--ci", "--keep"}, options{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseArgs(tc.args)
			if !tc.ok {
				if err == nil {
					t.Fatalf("parseArgs(%q) = %+v, want an error", tc.args, got)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("parseArgs(%q) = %+v, %v; want %+v", tc.args, got, err, tc.want)
			}
		})
	}
}
