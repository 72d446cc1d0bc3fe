package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// layer4Doc is the layer-4 guide, whose recipes must load in the build it tells users to make.
const layer4Doc = "../../docs/layer4.md"

// caddyL4With is the --with line for caddy-l4 that the documented build carries.
const caddyL4With = "--with github.com/mholt/caddy-l4@v0.1.2"

// recipeBlock is a whole config in the doc (it starts with the global options block), not a
// syntax summary.
var recipeBlock = regexp.MustCompile("(?ms)^```caddyfile\n(\\{\n.*?)^```\n")

// layer4Recipe is one recipe of the doc: the ### heading above it, and its Caddyfile.
type layer4Recipe struct{ heading, caddyfile string }

func layer4Recipes(doc string) []layer4Recipe {
	var recipes []layer4Recipe
	for _, m := range recipeBlock.FindAllStringSubmatchIndex(doc, -1) {
		heading := "recipe"
		if i := strings.LastIndex(doc[:m[0]], "\n### "); i >= 0 {
			heading, _, _ = strings.Cut(doc[i+len("\n### "):], "\n")
		}
		recipes = append(recipes, layer4Recipe{heading, doc[m[2]:m[3]]})
	}
	return recipes
}

// TestRecipesLoadInTheDocumentedBuild builds Caddy as the docs say, with xcaddy through
// `./xcaddy.sh build --l4`, and loads every recipe of docs/layer4.md, copied verbatim, with
// `caddy adapt --validate` (provisioned and validated as `caddy run` would, without
// starting). A build that lacks a module a recipe uses fails here with "module not
// registered". It takes about a minute with Go's caches warm, 10 or more without.
func TestRecipesLoadInTheDocumentedBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds Caddy with xcaddy; skipped with -short")
	}
	doc, err := os.ReadFile(layer4Doc)
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for name, text := range map[string][]byte{layer4Doc: doc, "README.md": readme} {
		if !strings.Contains(string(text), caddyL4With) {
			t.Errorf("%s: its layer-4 xcaddy build does not say %q, which ./xcaddy.sh build --l4 passes", name, caddyL4With)
		}
	}
	recipes := layer4Recipes(string(doc))
	if len(recipes) < 2 {
		t.Fatalf("%s: found %d recipes (### heading, then a ```caddyfile block starting with {), want at least 2", layer4Doc, len(recipes))
	}

	bin := filepath.Join(t.TempDir(), "caddy")
	build := exec.Command("bash", "../../xcaddy.sh", "build", "--l4")
	build.Env = append(os.Environ(), "XCADDY_OUTPUT="+bin)
	out, err := build.CombinedOutput()
	if err != nil {
		t.Fatalf("./xcaddy.sh build --l4: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "layer4.handlers.proxy") || !strings.Contains(string(out), "leader.stores.postgres") {
		t.Errorf("./xcaddy.sh build --l4 did not check the modules the recipes use; it printed:\n%s", out)
	}
	// A first build is long: the script says so before it starts, and go names what it does.
	if !strings.Contains(string(out), "a first build downloads Caddy's dependencies") || !strings.Contains(string(out), "-v ") {
		t.Errorf("./xcaddy.sh build --l4 did not say how long a first build takes, or did not build with -v; it printed:\n%s", out)
	}

	dir := t.TempDir()
	for _, r := range recipes {
		heading, caddyfile := r.heading, r.caddyfile
		t.Run(strings.ReplaceAll(strings.ToLower(heading), " ", "_"), func(t *testing.T) {
			path := filepath.Join(dir, "Caddyfile")
			if err := os.WriteFile(path, []byte(caddyfile), 0o600); err != nil {
				t.Fatal(err)
			}
			validate := exec.Command(bin, "adapt", "--validate", "--adapter", "caddyfile", "--config", path)
			validate.Dir = dir
			validate.Env = append(os.Environ(),
				"ETCD_ENDPOINTS=127.0.0.1:1", // provisioning never dials
				"HOSTNAME=node-a", "HOST_IP=127.0.0.1",
				"HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
			if out, err := validate.CombinedOutput(); err != nil {
				t.Errorf("caddy adapt --validate of the recipe %q: %v\n%s", heading, err, out)
			}
		})
	}
}
