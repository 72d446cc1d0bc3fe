package kubernetes

import (
	"os"
	"testing"

	"github.com/caddyleader/caddy-leader/internal/testkit/fleet"
)

// caddyPackage is this module's Caddy command: Caddy with this store.
const caddyPackage = "github.com/caddyleader/caddy-leader/kubernetes/cmd/caddy"

// caddyBin is the Caddy binary that TestMain built from caddyPackage.
var caddyBin string

func TestMain(m *testing.M) { os.Exit(fleet.MainWithCaddy(m, caddyPackage, &caddyBin)) }

// needCaddy skips the test under -short: it starts real processes.
func needCaddy(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts kube-apiserver and Caddy processes; skipped with -short")
	}
}
