//go:build unix

package browser

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"html"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/caddyleader/caddy-leader/internal/testkit/deployq"
	"github.com/caddyleader/caddy-leader/internal/testkit/fleet"
	"github.com/caddyleader/caddy-leader/internal/testkit/freeport"
	"github.com/caddyleader/caddy-leader/internal/testkit/jobrec"
)

// grafanaVariables fills in the dashboard's variables as Grafana would for this test's
// Prometheus: every election of job "caddy", intervals that reach back over the scenario.
// $__range_s goes before $__range, which is its prefix.
var grafanaVariables = strings.NewReplacer(`$__rate_interval`, "1m", `$__range_s`, "300", `$__range`, "5m",
	`$job`, "caddy", `$election`, ".+")

// lookBack is how far back the checks look for series: the whole scenario.
const lookBack = 10 * time.Minute

// checkQuery runs a dashboard query (its variables filled in) against p and checks every
// metric it names against the series Prometheus scraped from the fleet, every label it
// names against the labels of those series, and that it returns data. It returns the
// series the query returned.
func checkQuery(ctx context.Context, p *prometheusServer, expr string) ([]series, error) {
	expr = grafanaVariables.Replace(expr)
	metrics := deployq.Metrics(expr)
	if len(metrics) == 0 {
		return nil, fmt.Errorf("%q names no metric", expr)
	}
	have := []string{"__name__"}
	for _, name := range metrics {
		sets, err := p.labelSets(ctx, name, lookBack)
		if err != nil {
			return nil, err
		}
		if len(sets) == 0 {
			return nil, fmt.Errorf("%q names %s, of which Prometheus scraped or recorded no series", expr, name)
		}
		for _, set := range sets {
			for l := range set {
				if !slices.Contains(have, l) {
					have = append(have, l)
				}
			}
		}
	}
	made := deployq.Made(expr)
	for _, l := range deployq.Labels(expr) {
		if !slices.Contains(have, l) && !slices.Contains(made, l) {
			return nil, fmt.Errorf("%q names the label %s, which no series of %s has (they have %s)", expr, l, strings.Join(metrics, ", "), strings.Join(have, ", "))
		}
	}
	result, err := p.query(ctx, expr)
	if err != nil {
		return nil, err
	}
	if len(result) == 0 {
		return nil, fmt.Errorf("%q returned no data", expr)
	}
	return result, nil
}

// roomSet is the fleet's shard set, gating /rooms/<key>, so that the dashboard's shard
// panels have a set to show.
const roomSet, roomShards = "rooms", 8

// roomsRoute gates /rooms/<key> by the shard of its key in roomSet.
func roomsRoute(*fleet.Instance) []map[string]any {
	return []map[string]any{{
		"match": []map[string]any{{"path": []string{"/rooms/*"}}},
		"handle": []map[string]any{{"handler": "leader_gate", "shard_set": roomSet, "shard_key": fleet.ShardKeyPath},
			{"handler": "static_response", "body": "room"}},
		"terminal": true,
	}}
}

// setLabel is the label by which a query's series must name roomSet: set for the shard
// panels, election for the election variable (a set has no is_leader of its own); empty
// for the other queries.
func setLabel(q deployq.Query) string {
	switch {
	case strings.HasSuffix(q.Where, "variable election"):
		return "election"
	case strings.Contains(q.Expr, "caddy_leader_shard"):
		return "set"
	}
	return ""
}

// roomsOwned sums, over the fleet, the shards of roomSet each instance owns.
func roomsOwned(instances []*fleet.Instance) float64 {
	var sum float64
	for _, in := range instances {
		sum += metricValue(in, `caddy_leader_shards_owned{set="`+roomSet+`"}`)
	}
	return sum
}

// startUpgradeBackend starts the upstream of the fleet's /gated route: it answers plain
// requests with 200 and switches protocols for a request that asks to upgrade, keeping the
// connection open until the other side closes it (a websocket's shape, without the framing).
func startUpgradeBackend(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") == "" {
			io.WriteString(w, "backend")
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + r.Header.Get("Upgrade") + "\r\n\r\n")
		brw.Flush()
		io.Copy(io.Discard, brw) // until the tunnel is cut
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

// openTunnel upgrades a connection to in's /gated, through its leader_gate and
// reverse_proxy to the backend, and returns it once the switch is answered.
func openTunnel(t *testing.T, in *fleet.Instance) net.Conn {
	t.Helper()
	conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", in.HTTPPort), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	fmt.Fprintf(conn, "GET /gated HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: test-tunnel\r\n\r\n")
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	status, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil || !strings.Contains(status, " 101 ") {
		t.Fatalf("upgrading a connection to %s: %q, %v", in.ID, status, err)
	}
	conn.SetReadDeadline(time.Time{})
	return conn
}

// metricValue reads one sample from in's admin /metrics; -1 when it is absent.
func metricValue(in *fleet.Instance, series string) float64 {
	resp, err := http.Get(adminURL(in, "/metrics"))
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindSubmatch(body)
	if m == nil {
		return -1
	}
	v, _ := strconv.ParseFloat(string(m[1]), 64)
	return v
}

// waitFor polls cond every 50ms until it holds, failing the test after within.
func waitFor(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestDashboardQueries runs every query of the Grafana dashboard through a real Prometheus
// that scrapes a real three-instance fleet on etcd, after the fleet went through what the
// panels show: a transfer under load (requests held, a tunnel cut) and a leader cut off
// from the store riding a failsafe, its shards of a shard set moving to the others and
// back, and a job that runs and misses slots. Every query must return data, the shard panels and the election variable must
// show the set, and every metric and
// label it names must be among what Prometheus scraped; queries that name a metric or a
// label the plugin does not export must fail the same check. The panels, drawn from the
// same queries, are the dashboard's screenshot for docs/.
func TestDashboardQueries(t *testing.T) {
	promBin := prometheusBinary(t)
	failsafe := make(map[string]int)
	for i, port := range freeport.MustPick(t, 3) {
		failsafe[fmt.Sprintf("c%d", i)] = port
	}
	// A ttl of 5s leaves a leader cut off from etcd time to start its failsafe before its
	// heartbeat deadline passes, even under the race detector on a busy machine (at the
	// default 2s a failed heartbeat can be noticed too late for the failsafe to hold).
	// A job every second whose runs take longer than a slot (overlap skip, the default):
	// it runs every other slot and misses the others, for the Jobs row.
	jobs := jobrec.Start(t, 1200*time.Millisecond)
	f := startPageFleet(t, 3, fleet.Config{TTL: "5s", Backend: startUpgradeBackend(t), Hold: "5s", FailsafePorts: failsafe,
		MoreShardSets: map[string]int{roomSet: roomShards}, Routes: roomsRoute,
		Jobs: map[string]any{"tick": map[string]any{"every": "1s", "request": map[string]any{"method": "POST", "url": jobs.URL}}}})
	prom := startPrometheus(t, promBin, f.instances)
	scraped := time.Now()
	leader, _ := fleet.WaitStableLeader(t, f.instances, electTimeout)
	target := fleet.Others(f.instances, leader)[0]

	// A transfer under load, with a tunnel open through the leader.
	tunnel := openTunnel(t, leader)
	poller := fleet.StartPoller(f.instances)
	time.Sleep(time.Second)
	resp, err := leader.Admin(http.MethodPost, "/leader/default/transfer?to="+target.ID, nil)
	if err != nil || resp.Status != http.StatusOK {
		t.Fatalf("transfer to %s: %v %d %s", target.ID, err, resp.Status, resp.Body)
	}
	time.Sleep(time.Second)
	poller.Stop()
	for _, in := range f.instances {
		for _, key := range []string{"a", "b", "c", "d"} {
			resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/rooms/%s", in.HTTPPort, key))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}
	}
	tunnel.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := tunnel.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the tunnel through the old leader was not cut by the transfer: %v", err)
	}

	// The new leader's link to etcd goes silent: it rides a failsafe, its peers confirming.
	f.links[target.ID].Blackhole()
	waitFor(t, target.ID+" on failsafe", 30*time.Second, func() bool {
		return metricValue(target, `caddy_leader_failsafe_active{election="default"}`) == 1
	})
	time.Sleep(3 * time.Second)
	f.links[target.ID].Heal()
	fleet.WaitStableLeader(t, f.instances, electTimeout)
	waitFor(t, "every shard of "+roomSet+" owned", 30*time.Second, func() bool { return roomsOwned(f.instances) == roomShards })
	time.Sleep(3 * time.Second) // a few scrapes and rule evaluations after the last change

	ctx := context.Background()
	queries, err := deployq.Deployed("../..")
	if err != nil {
		t.Fatal(err)
	}
	var panels []deployq.Query
	for _, q := range queries {
		if q.Panel != "" || strings.Contains(q.Where, "variable") {
			panels = append(panels, q)
		}
	}
	for _, q := range panels {
		t.Run(q.Where, func(t *testing.T) {
			result, err := checkQuery(ctx, prom, q.Expr)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%d series", len(result))
			if l := setLabel(q); l != "" && !slices.ContainsFunc(result, func(s series) bool { return s.Metric[l] == roomSet }) {
				t.Errorf("%q: no series with %s=%q among %v", q.Expr, l, roomSet, result)
			}
		})
	}

	// Each instance's status page shows the job, run by the leader, and its last run.
	leader, _ = fleet.WaitStableLeader(t, f.instances, electTimeout)
	for _, in := range f.instances {
		resp, err := http.Get(in.URL() + "/status")
		if err != nil {
			t.Fatal(err)
		}
		page, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		runs := leader.ID + ", its leader"
		if in == leader {
			runs = "this instance (it leads)"
		}
		for _, want := range []string{`<tr data-job="tick">`, `<td data-job-runs>` + runs, ": ok in "} {
			if !strings.Contains(string(page), want) {
				t.Errorf("%s's status page lacks %q", in.ID, want)
			}
		}
	}

	// The check fails a query that names what the plugin does not export.
	for _, c := range []struct{ name, expr string }{
		{"misspelt_metric", `caddy_leader_is_leading{job=~"$job"} == 1`},
		{"misspelt_metric_in_a_name_matcher", `{__name__=~"caddy_leader_is_leader|caddy_leader_shards_owning", job=~"$job"}`},
		{"metric_the_plugin_never_had", `sum by (election) (rate(caddy_leader_elections_total[$__rate_interval]))`},
		{"label_in_a_matcher", `caddy_leader_transitions_total{job=~"$job", direction="leader"}`},
		{"label_in_a_grouping", `max by (electoin) (caddy_leader_term_token{job=~"$job"})`},
	} {
		t.Run("rejects_"+c.name, func(t *testing.T) {
			if _, err := checkQuery(ctx, prom, c.expr); err == nil {
				t.Errorf("%q passed the check", c.expr)
			} else {
				t.Logf("rejected: %v", err)
			}
		})
	}

	if t.Failed() {
		return
	}
	if _, err := exec.LookPath("chromium"); err != nil {
		t.Logf("no dashboard screenshot: chromium is not installed")
		return
	}
	page := dashboardPage(t, ctx, prom, panels, time.Since(scraped).Round(time.Second))
	browser := newBrowser(t)
	do(t, browser, "loading the dashboard page", chromedp.Navigate(page), chromedp.WaitVisible("div.panel"))
	writeScreenshot(t, "dashboard.png", get(t, browser, "screenshot of the dashboard", chromedp.FullScreenshot(100)))
}

// dashboardPage serves a page that draws each panel from its queries' results over the
// last span (Grafana itself is not part of the test: the page only shows what the queries
// return) and returns its URL.
func dashboardPage(t *testing.T, ctx context.Context, p *prometheusServer, queries []deployq.Query, span time.Duration) string {
	t.Helper()
	var b strings.Builder
	b.WriteString(`<!DOCTYPE html><html><head><meta charset="utf-8"><title>caddy-leader dashboard queries</title><style>
body{font:13px system-ui,sans-serif;margin:12px;background:#111217;color:#ccccdc}h1{font-size:16px;margin:4px 0 10px}
.grid{display:grid;grid-template-columns:repeat(3,1fr);gap:8px}.panel{background:#181b1f;border:1px solid #2c3235;border-radius:3px;padding:6px 8px}
.panel h2{font-size:13px;margin:0 0 4px;color:#d8d9da}.legend{font-size:11px;color:#9fa7b3}.legend span{margin-right:8px;white-space:nowrap}
svg{width:100%;height:110px;display:block}code{font-size:10px;color:#6e7681;word-break:break-all}</style></head><body>
<h1>caddy-leader dashboard: every panel's query, as the test's Prometheus answered it over the `)
	b.WriteString(span.String() + ` of a transfer under load and a leader on failsafe</h1><div class="grid">`)
	colors := []string{"#73bf69", "#f2cc0c", "#8ab8ff", "#ff780a", "#f2495c", "#5794f2", "#b877d9", "#fade2a"}
	byPanel := make(map[string][]deployq.Query)
	var order []string
	for _, q := range queries {
		if q.Panel == "" {
			continue
		}
		if _, ok := byPanel[q.Panel]; !ok {
			order = append(order, q.Panel)
		}
		byPanel[q.Panel] = append(byPanel[q.Panel], q)
	}
	step := max(span/200, time.Second)
	for _, title := range order {
		var lines []string
		var legend []string
		minV, maxV := 0.0, 0.0
		type line struct {
			name   string
			points [][2]float64
		}
		var all []line
		for _, q := range byPanel[title] {
			result, err := p.queryRange(ctx, grafanaVariables.Replace(q.Expr), span, step)
			if err != nil {
				t.Fatalf("%s: %v", q.Where, err)
			}
			for _, s := range result {
				var keys []string
				for k, v := range s.Metric {
					if k != "__name__" && k != "job" {
						keys = append(keys, k+"="+v)
					}
				}
				sort.Strings(keys)
				l := line{name: strings.Join(keys, " ")}
				for _, v := range s.Values {
					ts, _ := v[0].(float64)
					val, err := strconv.ParseFloat(fmt.Sprint(v[1]), 64)
					if err != nil || val != val { // NaN: histogram_quantile over no requests
						continue
					}
					l.points = append(l.points, [2]float64{ts, val})
					minV, maxV = min(minV, val), max(maxV, val)
				}
				all = append(all, l)
			}
		}
		end := float64(time.Now().Unix())
		start := end - span.Seconds()
		if maxV == minV {
			maxV = minV + 1
		}
		for i, l := range all {
			color := colors[i%len(colors)]
			var pts []string
			for _, pt := range l.points {
				x := 600 * (pt[0] - start) / (end - start)
				y := 105 - 100*(pt[1]-minV)/(maxV-minV)
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", x, y))
			}
			lines = append(lines, fmt.Sprintf(`<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`, color, strings.Join(pts, " ")))
			legend = append(legend, fmt.Sprintf(`<span style="color:%s">■</span><span>%s</span>`, color, html.EscapeString(l.name)))
		}
		b.WriteString(`<div class="panel"><h2>` + html.EscapeString(title) + `</h2>`)
		fmt.Fprintf(&b, `<svg viewBox="0 0 600 110" preserveAspectRatio="none">%s<text x="2" y="10" fill="#6e7681" font-size="9">max %.3g</text></svg>`, strings.Join(lines, ""), maxV)
		b.WriteString(`<div class="legend">` + strings.Join(legend, " ") + `</div>`)
		for _, q := range byPanel[title] {
			b.WriteString(`<code>` + html.EscapeString(q.Expr) + `</code><br>`)
		}
		b.WriteString(`</div>`)
	}
	b.WriteString(`</div></body></html>`)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	body := b.String()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		io.WriteString(w, body)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String() + "/"
}
