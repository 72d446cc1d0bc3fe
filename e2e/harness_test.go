//go:build unix

package e2e

import (
	"context"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/fleet"
)

// The harness is internal/testkit/fleet, which the demo and the benchmarks share; the names below
// keep the tests short and let them reach the unexported corners they need.

// ttl is every instance's lease TTL unless its Config says otherwise.
const ttl = fleet.DefaultTTL

// Bounds on waits. They say when to give up, not how fast things should be.
const (
	// startTimeout bounds a Caddy process becoming ready (admin API and HTTP port answer).
	startTimeout = fleet.StartTimeout
	// electTimeout bounds a fresh fleet agreeing on its first leader.
	electTimeout = 15 * time.Second
	// exitTimeout bounds a signalled process exiting; SIGTERM may drain for the default
	// drain_timeout (10s).
	exitTimeout = fleet.ExitTimeout
	// requestTimeout bounds one HTTP request to an instance.
	requestTimeout = fleet.RequestTimeout
	// pollInterval spaces the polls of a condition.
	pollInterval = fleet.PollInterval
)

// caddyBin is the Caddy binary that TestMain built from ./cmd/caddy.
var caddyBin string

func TestMain(m *testing.M) { os.Exit(runMain(m)) }

func runMain(m *testing.M) int { return fleet.MainWithCaddy(m, fleet.CaddyPackage, &caddyBin) }

// needCaddy skips the test under -short: end-to-end tests start real processes.
func needCaddy(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end test: starts etcd and Caddy processes; skipped with -short")
	}
}

// childProcAttr ties a child's life to the test process where the system can (Linux).
func childProcAttr() *syscall.SysProcAttr { return fleet.ChildProcAttr() }

// Config is what differs between the configurations the tests give an instance; see
// fleet.Config for the routes every instance serves.
type Config = fleet.Config

// Instance is one Caddy process of a test, started with caddyBin.
type Instance = fleet.Instance

// StartInstance starts `caddy run` with cfg and returns once its admin API and HTTP port
// answer. The process is killed (SIGKILL) when the test ends; if the test failed, its log
// is printed.
func StartInstance(t *testing.T, id string, cfg Config) *Instance {
	t.Helper()
	return fleet.StartInstance(t, caddyBin, id, cfg)
}

// StartFleet starts n instances, c0 to c<n-1>, with the same cfg.
func StartFleet(t *testing.T, n int, cfg Config) []*Instance {
	t.Helper()
	return fleet.StartInstances(t, caddyBin, n, cfg)
}

// newInstance prepares (and does not start) an instance on the given ports, with fresh
// directories; its Launch(caddyBin, ...) starts it.
func newInstance(t *testing.T, id string, httpPort, adminPort int) *Instance {
	return fleet.NewInstance(t, id, httpPort, adminPort)
}

// Response is the part of an HTTP response the tests look at.
type Response = fleet.Response

// client talks to instances: never through a proxy, never following redirects.
var client = fleet.Client

func do(ctx context.Context, method, url string, body []byte) (Response, error) {
	return fleet.Do(ctx, method, url, body)
}

// Gated is a parsed 200 answer of /gated.
type Gated = fleet.Gated

func parseGated(body string) (Gated, error) { return fleet.ParseGated(body) }

// Whoami is an instance's view of the election, from /whoami.
type Whoami = fleet.Whoami

func parseWhoami(resp Response) (Whoami, error) { return fleet.ParseWhoami(resp) }

// WaitStableLeader polls /whoami on every instance until all of them name the same leader
// and token and the leader says it leads, or within passes. It returns the leader and token.
func WaitStableLeader(t *testing.T, ins []*Instance, within time.Duration) (*Instance, int64) {
	t.Helper()
	return fleet.WaitStableLeader(t, ins, within)
}

func agreedLeader(ins []*Instance) (*Instance, int64, []string) {
	return fleet.AgreedLeader(ins)
}

// Served is one 200 answer of /gated seen by a Poller.
type Served = fleet.Served[*Instance]

// Poller sends GET /gated to every instance of a fleet in a tight loop and records every
// 200.
type Poller = fleet.Poller[*Instance]

// StartPoller starts polling ins; Stop ends it.
func StartPoller(ins []*Instance) *Poller { return fleet.StartPoller(ins) }

// others returns ins without in.
func others(ins []*Instance, in *Instance) []*Instance { return fleet.Others(ins, in) }
