package leaderl4

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddyleader/caddy-leader/internal/testkit/goldentest"
)

// An l4 gate in a config without the leader app adapts (Caddy's Caddyfile adapter shows
// the layer4 option nothing of the leader option), so validating is the first moment it can
// be refused: the error must say what to add.
func TestGateWithoutTheLeaderApp(t *testing.T) {
	js, _, err := goldentest.Adapt(t, `{
	layer4 {
		:1883 {
			route {
				leader_gate broker
				proxy 127.0.0.1:11883
			}
		}
	}
}
`)
	if err != nil {
		t.Fatal(err)
	}
	var cfg caddy.Config
	if err := json.Unmarshal(js, &cfg); err != nil {
		t.Fatal(err)
	}
	err = caddy.Validate(&cfg)
	if err == nil {
		t.Fatal("a layer4 leader_gate without the leader app validated")
	}
	for _, want := range []string{"layer4 leader_gate: needs the leader app", "add the global `leader { endpoints ... }` option"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q:\n%v", want, err)
		}
	}
}
