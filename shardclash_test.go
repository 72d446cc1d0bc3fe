package caddyleader

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// TestElectionNamedLikeAShardSetIsRefused: a plain election named as a shard set made
// /metrics fail for the whole instance (two collectors of one label), and one named as a
// shard (`rooms.7`) silently was that shard. Either is refused when the config loads,
// naming the field, wherever the election is named.
func TestElectionNamedLikeAShardSetIsRefused(t *testing.T) {
	tests := []struct {
		name     string
		app      string // extra fields of the leader app
		handler  string // a handler of the one route, if any
		wantErrs []string
	}{
		{name: "elections_as_the_set", app: `"elections": ["rooms"]`,
			wantErrs: []string{`elections: election name "rooms" clashes with shard set "rooms", whose shards are the elections rooms.0 to rooms.15`}},
		{name: "elections_as_a_shard", app: `"elections": ["rooms.7"]`,
			wantErrs: []string{`elections: election name "rooms.7" clashes with shard set "rooms"`}},
		{name: "gate_as_the_set", handler: `{"handler": "leader_gate", "election": "rooms"}`,
			wantErrs: []string{`leader_gate: election: election name "rooms" clashes with shard set "rooms"`}},
		{name: "health_as_a_shard", handler: `{"handler": "leader_health", "election": "rooms.7"}`,
			wantErrs: []string{`leader_health: election: election name "rooms.7" clashes with shard set "rooms"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := validateLeaderConfig(t, tt.app, tt.handler)
			for _, want := range tt.wantErrs {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("got error %v, want one containing %q", err, want)
				}
			}
		})
	}
	t.Run("control_other_names", func(t *testing.T) {
		if err := validateLeaderConfig(t, `"elections": ["roomsx", "main"]`, `{"handler": "leader_gate", "election": "lobby"}`); err != nil {
			t.Fatalf("a config without a clash was refused: %v", err)
		}
	})
}

// validateLeaderConfig provisions and validates, as `caddy validate` does, a config with a
// leader app holding the shard set rooms of 16 shards and the fields app, and an HTTP
// server whose one route runs handler (none if empty). No store is dialled.
func validateLeaderConfig(t *testing.T, app, handler string) error {
	t.Helper()
	if app != "" {
		app = ", " + app
	}
	routes := "[]"
	if handler != "" {
		routes = `[{"handle": [` + handler + `]}]`
	}
	raw := fmt.Sprintf(`{"admin": {"disabled": true}, "apps": {
		"leader": {"endpoints": ["127.0.0.1:1"], "instance_id": "clash", "shard_sets": {"rooms": {"shards": 16}}%s},
		"http": {"servers": {"s": {"listen": ["127.0.0.1:0"], "routes": %s}}}}}`, app, routes)
	var cfg caddy.Config
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		t.Fatal(err)
	}
	return caddy.Validate(&cfg)
}
