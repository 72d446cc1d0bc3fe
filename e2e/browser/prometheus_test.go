//go:build unix

package browser

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/fleet"
	"github.com/caddyleader/caddy-leader/internal/testkit/freeport"
)

// prometheusServer is a Prometheus server started by the test, scraping a fleet's admin
// endpoints every second and evaluating deploy/prometheus's rules every second.
type prometheusServer struct {
	url string
}

// prometheusBinary is Debian's prometheus (./test.sh --install installs it).
func prometheusBinary(t *testing.T) string {
	t.Helper()
	needCaddy(t)
	path, err := exec.LookPath("prometheus")
	if err != nil {
		t.Skip("prometheus is not installed (Debian package prometheus; ./test.sh --install installs it)")
	}
	return path
}

// startPrometheus starts Prometheus on a free loopback port, scraping the admin endpoint
// (/metrics) of every instance as job "caddy", with the repository's rule files.
func startPrometheus(t *testing.T, bin string, instances []*fleet.Instance) *prometheusServer {
	t.Helper()
	dir := t.TempDir()
	var targets []string
	for _, in := range instances {
		targets = append(targets, fmt.Sprintf("%q", fmt.Sprintf("127.0.0.1:%d", in.AdminPort)))
	}
	rules, err := filepath.Abs(filepath.Join("..", "..", "deploy", "prometheus"))
	if err != nil {
		t.Fatal(err)
	}
	config := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - %q
  - %q
scrape_configs:
  - job_name: caddy
    static_configs:
      - targets: [%s]
`, filepath.Join(rules, "alerts.yml"), filepath.Join(rules, "recording.yml"), strings.Join(targets, ", "))
	configPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(configPath, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	port := freeport.MustPick(t, 1)[0]
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	proc, err := fleet.StartProcess(fleet.ProcessSpec{
		Path: bin,
		Args: []string{"--config.file=" + configPath, "--storage.tsdb.path=" + filepath.Join(dir, "data"),
			"--web.listen-address=" + addr, "--log.level=warn"},
		LogPath: filepath.Join(dir, "prometheus.log"),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		proc.Stop(10 * time.Second)
		if t.Failed() {
			t.Logf("--- Prometheus log ---\n%s", proc.Tail(16<<10))
		}
	})
	p := &prometheusServer{url: "http://" + addr}
	if err := proc.WaitReady(30*time.Second, func() error {
		resp, err := http.Get(p.url + "/-/ready")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/-/ready: %s", resp.Status)
		}
		return nil
	}); err != nil {
		t.Fatalf("prometheus: %v\n%s", err, proc.Tail(8<<10))
	}
	return p
}

// series is one result of the HTTP API: its labels, and its samples (time, value).
type series struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
	Values [][2]any          `json:"values"`
}

// api calls an endpoint of Prometheus's HTTP API and decodes its data into v; a query
// Prometheus refuses (a parse error, say) is an error.
func (p *prometheusServer) api(ctx context.Context, path string, params url.Values, v any) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url+path+"?"+params.Encode(), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var answer struct {
		Status    string          `json:"status"`
		Error     string          `json:"error"`
		ErrorType string          `json:"errorType"`
		Data      json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&answer); err != nil {
		return fmt.Errorf("%s: %v", path, err)
	}
	if answer.Status != "success" {
		return fmt.Errorf("%s: %s: %s", path, answer.ErrorType, answer.Error)
	}
	return json.Unmarshal(answer.Data, v)
}

// query runs an instant query now; only vector results are taken.
func (p *prometheusServer) query(ctx context.Context, expr string) ([]series, error) {
	var data struct {
		ResultType string   `json:"resultType"`
		Result     []series `json:"result"`
	}
	if err := p.api(ctx, "/api/v1/query", url.Values{"query": {expr}}, &data); err != nil {
		return nil, err
	}
	if data.ResultType != "vector" {
		return nil, fmt.Errorf("%s: a %s, not a vector", expr, data.ResultType)
	}
	return data.Result, nil
}

// queryRange runs a range query over the last span, a sample per step.
func (p *prometheusServer) queryRange(ctx context.Context, expr string, span, step time.Duration) ([]series, error) {
	now := time.Now()
	var data struct {
		Result []series `json:"result"`
	}
	err := p.api(ctx, "/api/v1/query_range", url.Values{"query": {expr}, "start": {unix(now.Add(-span))}, "end": {unix(now)},
		"step": {fmt.Sprint(step.Seconds())}}, &data)
	return data.Result, err
}

// labelSets returns the label sets of every series named name in the last span.
func (p *prometheusServer) labelSets(ctx context.Context, name string, span time.Duration) ([]map[string]string, error) {
	now := time.Now()
	var sets []map[string]string
	err := p.api(ctx, "/api/v1/series", url.Values{"match[]": {name}, "start": {unix(now.Add(-span))}, "end": {unix(now)}}, &sets)
	return sets, err
}

func unix(t time.Time) string { return fmt.Sprintf("%.3f", float64(t.UnixMilli())/1000) }
