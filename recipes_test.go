package caddyleader

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/caddyleader/caddy-leader/internal/testkit/freeport"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
	"github.com/caddyleader/caddy-leader/internal/testkit/faultproxy"
)

// recipesDoc shows every recipe; its Caddyfiles are the golden files recipe_*.caddyfiletest.
const recipesDoc = "docs/recipes.md"

// recipesWithJSON are the recipes whose adapted JSON docs/recipes.md shows as well.
var recipesWithJSON = []string{"writes_to_leader"}

// recipeGoldens returns the recipe golden files by recipe name (recipe_NAME.caddyfiletest).
func recipeGoldens(t *testing.T) map[string]string {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(goldenAdaptDir, "recipe_*.caddyfiletest"))
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) == 0 {
		t.Fatalf("no recipe_*.caddyfiletest in %s", goldenAdaptDir)
	}
	recipes := make(map[string]string, len(paths))
	for _, p := range paths {
		name := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(p), "recipe_"), ".caddyfiletest")
		recipes[name] = p
	}
	return recipes
}

var caddyfileBlock = regexp.MustCompile("(?ms)^```caddyfile\n(.*?)^```\n")

// TestRecipesInDocs keeps docs/recipes.md honest: every recipe's Caddyfile appears in it
// verbatim, every Caddyfile it shows is a recipe (and so adapted by TestCaddyfileAdapt), and
// the JSON it shows is the adapter's output.
func TestRecipesInDocs(t *testing.T) {
	data, err := os.ReadFile(recipesDoc)
	if err != nil {
		t.Fatal(err)
	}
	doc := strings.ReplaceAll(string(data), "\r\n", "\n")
	recipes := recipeGoldens(t)

	goldenText := make(map[string]string, len(recipes))
	for name, path := range recipes {
		cf, js := readGolden(t, path)
		goldenText[cf] = name
		if !strings.Contains(doc, "```caddyfile\n"+cf+"```\n") {
			t.Errorf("%s does not show the Caddyfile of %s: copy it into a ```caddyfile block", recipesDoc, path)
		}
		for _, withJSON := range recipesWithJSON {
			if name == withJSON && !strings.Contains(doc, "```json\n"+js+"\n```\n") {
				t.Errorf("%s does not show the JSON of %s: copy it into a ```json block", recipesDoc, path)
			}
		}
	}
	for _, m := range caddyfileBlock.FindAllStringSubmatch(doc, -1) {
		if _, ok := goldenText[m[1]]; !ok {
			first, _, _ := strings.Cut(m[1], "\n")
			t.Errorf("%s shows a Caddyfile that is no recipe_*.caddyfiletest (it starts %q): add it as one", recipesDoc, first)
		}
	}
	for _, withJSON := range recipesWithJSON {
		if _, ok := recipes[withJSON]; !ok {
			t.Errorf("recipesWithJSON names %q, which has no recipe_%s.caddyfiletest", withJSON, withJSON)
		}
	}
}

// TestShardRecipesInDocs keeps docs/shards.md honest: it shows every shards_*.caddyfiletest
// verbatim, and every Caddyfile it shows is one of them.
func TestShardRecipesInDocs(t *testing.T) {
	const doc = "docs/shards.md"
	data, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(data), "\r\n", "\n")
	paths, err := filepath.Glob(filepath.Join(goldenAdaptDir, "shards_*.caddyfiletest"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no shards_*.caddyfiletest in %s (%v)", goldenAdaptDir, err)
	}
	shown := map[string]bool{}
	for _, p := range paths {
		cf, _ := readGolden(t, p)
		shown[cf] = true
		if !strings.Contains(text, "```caddyfile\n"+cf+"```\n") {
			t.Errorf("%s does not show the Caddyfile of %s: copy it into a ```caddyfile block", doc, p)
		}
	}
	for _, m := range caddyfileBlock.FindAllStringSubmatch(text, -1) {
		if !shown[m[1]] {
			first, _, _ := strings.Cut(m[1], "\n")
			t.Errorf("%s shows a Caddyfile that is no shards_*.caddyfiletest (it starts %q): add it as one", doc, first)
		}
	}
}

// TestReadmeExample keeps the README's first Caddyfile a tested one: recipe_fleet.
func TestReadmeExample(t *testing.T) {
	data, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := strings.ReplaceAll(string(data), "\r\n", "\n")
	path := filepath.Join(goldenAdaptDir, "recipe_fleet.caddyfiletest")
	cf, _ := readGolden(t, path)
	if !strings.Contains(readme, "```caddyfile\n"+cf+"```\n") {
		t.Errorf("README.md does not show the Caddyfile of %s verbatim: copy it over", path)
	}
}

// TestRecipesLoad proves that each recipe, and the demo's Caddyfile, is a config Caddy
// accepts: adapted, provisioned and validated as `caddy validate` does, without starting
// it. The etcd endpoint is a closed loopback port: provisioning never dials etcd.
func TestRecipesLoad(t *testing.T) {
	t.Setenv("ETCD_ENDPOINTS", "127.0.0.1:1")
	t.Setenv("HOSTNAME", "node-a")
	t.Setenv("ADVERTISE_URL", "http://127.0.0.1:8080")
	t.Setenv("XDG_DATA_HOME", t.TempDir())
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())

	files := map[string]string{"demo": "demo/Caddyfile"}
	for name, path := range recipeGoldens(t) {
		files["recipe_"+name] = path
	}
	shardRecipes, err := filepath.Glob(filepath.Join(goldenAdaptDir, "shards_*.caddyfiletest"))
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range shardRecipes {
		files[strings.TrimSuffix(filepath.Base(path), ".caddyfiletest")] = path
	}
	for name, path := range files {
		t.Run(name, func(t *testing.T) {
			text := ""
			if strings.HasSuffix(path, ".caddyfiletest") {
				text, _ = readGolden(t, path)
			} else {
				data, err := os.ReadFile(path)
				if err != nil {
					t.Fatal(err)
				}
				text = string(data)
			}
			if w, different := caddyfile.FormattingDifference(path, []byte(text)); different {
				t.Errorf("%s:%d: not formatted as `caddy fmt` would", path, w.Line)
			}
			js, warnings, err := adaptCaddyfile(t, text)
			if err != nil {
				t.Fatalf("%s does not adapt: %v", path, err)
			}
			for _, w := range warnings {
				t.Errorf("%s:%d: adapt warning: %s", path, w.Line, w.Message)
			}
			var cfg caddy.Config
			if err := json.Unmarshal(js, &cfg); err != nil {
				t.Fatalf("%s: adapted JSON does not unmarshal: %v", path, err)
			}
			if err := caddy.Validate(&cfg); err != nil {
				t.Errorf("%s does not load: %v", path, err)
			}
		})
	}
}

// TestHealthStatusRecipe runs recipe_health_status against a real etcd and checks the
// statuses a load balancer sees, with GET and HEAD, as this instance leads, stands by
// (another candidate leads) and loses etcd. The test listens on a free port instead of
// 8081 and shortens the ttl so that losing etcd shows within a second or two.
func TestHealthStatusRecipe(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and Caddy")
	}
	cluster := etcdtest.Start(t, 1)
	link, err := faultproxy.New(strings.TrimPrefix(cluster.Endpoint(0), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = link.Close() })
	t.Setenv("ETCD_ENDPOINTS", link.URL())
	t.Setenv("HOSTNAME", "health-node")

	cf, _ := readGolden(t, filepath.Join(goldenAdaptDir, "recipe_health_status.caddyfiletest"))
	addr := fmt.Sprintf("127.0.0.1:%d", freeport.MustPick(t, 1)[0])
	cf = mustReplace(t, cf, "http://:8081 {", "http://"+addr+" {")
	cf = mustReplace(t, cf, "instance_id {$HOSTNAME}\n", "instance_id {$HOSTNAME}\n\t\tttl 2s\n")
	cf = mustReplace(t, cf, "{\n\tleader {", "{\n\tadmin off\n\tpersist_config off\n\tleader {")
	loadCaddyfile(t, cf)

	status := func(method, path string) int {
		req, err := http.NewRequest(method, "http://"+addr+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	// role reads the role and the leader that GET /health reports in its body.
	role := func() (string, string) {
		resp, err := http.Get("http://" + addr + "/health")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var rep HealthReport
		if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil {
			t.Fatalf("GET /health: the body is not a health report: %v", err)
		}
		leader := "<null>"
		if rep.Leader != nil {
			leader = *rep.Leader
		}
		return rep.Role, leader
	}
	// want checks both paths with both methods once the instance reaches the state that
	// /health reports with wantHealth (waiting for a state is not a timing assertion), and
	// the role and leader of the body.
	want := func(t *testing.T, wantHealth, wantReplica int, wantRole, wantLeader string) {
		t.Helper()
		waitUntil(t, fmt.Sprintf("/health answers %d naming leader %q", wantHealth, wantLeader), func() bool {
			_, l := role()
			return status(http.MethodGet, "/health") == wantHealth && (wantLeader == "" || l == wantLeader)
		})
		if r, _ := role(); r != wantRole {
			t.Errorf("GET /health body: role %s, want %s", r, wantRole)
		}
		for _, method := range []string{http.MethodGet, http.MethodHead} {
			if got := status(method, "/health"); got != wantHealth {
				t.Errorf("%s /health = %d, want %d", method, got, wantHealth)
			}
			if got := status(method, "/replica"); got != wantReplica {
				t.Errorf("%s /replica = %d, want %d", method, got, wantReplica)
			}
		}
	}

	t.Run("leader_200_replica_503", func(t *testing.T) {
		want(t, http.StatusOK, http.StatusServiceUnavailable, HealthRoleLeader, "health-node")
	})

	outer := t // the other candidate stays in the election until the test ends
	t.Run("healthy_follower_429_replica_200", func(t *testing.T) {
		other := startInstanceUnder(outer, cluster.Endpoints(), DefaultPrefix, "other-node", "http://127.0.0.1:1", DefaultElection, 2*time.Second, false)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := runningApp(t).elections[DefaultElection].Resign(ctx, time.Minute); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, "the other candidate leads", func() bool { _, ok := other.election.Check(); return ok })
		want(t, http.StatusTooManyRequests, http.StatusOK, HealthRoleStandby, "other-node")
	})

	t.Run("etcd_unreachable_503_replica_503", func(t *testing.T) {
		link.Blackhole()
		want(t, http.StatusServiceUnavailable, http.StatusServiceUnavailable, HealthRoleUnhealthy, "")
	})
}

// mustReplace replaces old in s, which must contain it.
func mustReplace(t *testing.T, s, old, new string) string {
	t.Helper()
	if !strings.Contains(s, old) {
		t.Fatalf("%q not found in:\n%s", old, s)
	}
	return strings.Replace(s, old, new, 1)
}
