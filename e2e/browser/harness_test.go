//go:build unix

package browser

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
	"github.com/caddyleader/caddy-leader/internal/testkit/faultproxy"
	"github.com/caddyleader/caddy-leader/internal/testkit/fleet"

	// The Caddy command the fleet runs (the root module's cmd/caddy) imports Caddy's
	// standard modules: importing them here keeps their sums in this module's go.sum, so
	// that it builds from here.
	_ "github.com/caddyserver/caddy/v2/modules/standard"
)

// caddyBin is the Caddy binary TestMain built from the root module's cmd/caddy.
var caddyBin string

// updateScreenshots writes the screenshots into the repository's docs/images, for the
// README and docs/; without it they go to a temporary directory and are only checked.
var updateScreenshots = flag.Bool("update-screenshots", false, "write the screenshots into docs/images")

func TestMain(m *testing.M) { os.Exit(fleet.MainWithCaddy(m, fleet.CaddyPackage, &caddyBin)) }

// Bounds on waits. They say when to give up, not how fast things should be.
const (
	electTimeout = 15 * time.Second
	// showTimeout bounds a change reaching the page: the page's own refresh is a second;
	// the rest is the fleet's (a failover after a SIGKILL takes a ttl and more).
	showTimeout = 20 * time.Second
)

// needCaddy skips the test under -short: it starts real processes.
func needCaddy(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end test: starts etcd, Caddy and a browser or Prometheus; skipped with -short")
	}
}

// chromium is the headless browser's binary: Debian's chromium package (./test.sh
// --install installs it).
func chromium(t *testing.T) string {
	t.Helper()
	needCaddy(t)
	for _, name := range []string{"chromium", "chromium-browser"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	t.Skip("chromium is not installed (Debian package chromium; ./test.sh --install installs it)")
	return ""
}

// newBrowser starts headless Chromium with a fresh profile and returns a context of its
// first tab; the browser ends with the test.
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium(t)),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.WindowSize(1200, 900),
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(alloc, chromedp.WithLogf(t.Logf))
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil { // starts the browser, with no timeout
		t.Fatalf("starting chromium: %v", err)
	}
	return ctx
}

// newTab opens another tab of the browser of ctx.
func newTab(t *testing.T, ctx context.Context) context.Context {
	t.Helper()
	tab, cancel := chromedp.NewContext(ctx)
	t.Cleanup(cancel)
	if err := chromedp.Do(tab); err != nil {
		t.Fatalf("opening a tab: %v", err)
	}
	return tab
}

// browserTimeout bounds one step in the browser.
const browserTimeout = time.Minute

// do runs browser steps in the tab of ctx, failing the test on error.
func do(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, browserTimeout)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// get runs one browser action in the tab of ctx and returns its value, failing the test
// on error.
func get[T any](t *testing.T, ctx context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, browserTimeout)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

// pageFleet is a fleet of Caddy processes on a real etcd, each reaching etcd through a
// fault proxy of its own, each serving the status page at /status with a link to its
// admin API's page.
type pageFleet struct {
	etcd      *etcdtest.Cluster
	instances []*fleet.Instance
	links     map[string]*faultproxy.Proxy // each instance's link to etcd, by id
}

// secondElection is an election every instance takes part in besides "default", gating
// /jobs: the page shows every election.
const secondElection = "jobs"

// statusRoute mounts leader_status at /status, linking to the instance's admin page, and
// gates /jobs by the second election.
func statusRoute(in *fleet.Instance) []map[string]any {
	return []map[string]any{{
		"match":    []map[string]any{{"path": []string{"/status"}}},
		"handle":   []map[string]any{{"handler": "leader_status", "title": "Fleet status", "admin_link": adminURL(in, "/leader/status")}},
		"terminal": true,
	}, {
		"match": []map[string]any{{"path": []string{"/jobs"}}},
		"handle": []map[string]any{{"handler": "leader_gate", "election": secondElection},
			{"handler": "static_response", "body": "jobs"}},
		"terminal": true,
	}}
}

func adminURL(in *fleet.Instance, path string) string {
	return fmt.Sprintf("http://127.0.0.1:%d%s", in.AdminPort, path)
}

// startPageFleet starts etcd and n instances with cfg, plus the status page (after which
// come cfg's own Routes), proxied etcd links and admin origins that admit the instance's
// own page.
func startPageFleet(t *testing.T, n int, cfg fleet.Config) *pageFleet {
	t.Helper()
	f := &pageFleet{etcd: etcdtest.Start(t, 1), links: make(map[string]*faultproxy.Proxy)}
	cfg.InstanceEndpoints = make(map[string][]string)
	for i := range n {
		id := fmt.Sprintf("c%d", i)
		p, err := faultproxy.New(strings.TrimPrefix(f.etcd.Endpoint(0), "http://"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		f.links[id] = p
		cfg.InstanceEndpoints[id] = []string{p.URL()}
	}
	more := cfg.Routes
	cfg.Routes = func(in *fleet.Instance) []map[string]any {
		routes := statusRoute(in)
		if more != nil {
			routes = append(routes, more(in)...)
		}
		return routes
	}
	cfg.AdminOrigins = func(in *fleet.Instance) []string { return []string{in.URL()} }
	f.instances = fleet.StartInstances(t, caddyBin, n, cfg)
	return f
}

// screenshotPath is where a screenshot named name goes.
func screenshotPath(t *testing.T, name string) string {
	if *updateScreenshots {
		return filepath.Join("..", "..", "docs", "images", name)
	}
	return filepath.Join(t.TempDir(), name)
}

// writeScreenshot writes a PNG, checking that it is one.
func writeScreenshot(t *testing.T, name string, png []byte) {
	t.Helper()
	if len(png) < 1000 || string(png[1:4]) != "PNG" {
		t.Fatalf("screenshot %s: %d bytes, not a PNG", name, len(png))
	}
	path := screenshotPath(t, name)
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", path, len(png))
}
