// Package deploy holds the deployment files (Prometheus rules, a Grafana dashboard, a systemd
// unit, Kubernetes manifests, a docker-compose file); its tests check what can be checked
// without a Docker engine or a cluster.
package deploy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
	"github.com/spf13/cobra"
	"gopkg.in/yaml.v3"

	caddyleader "github.com/caddyleader/caddy-leader"
)

// adapt adapts a Caddyfile with the environment the deployment files give it, and fails on
// errors and warnings alike.
func adapt(t *testing.T, name string, body []byte) map[string]any {
	t.Helper()
	t.Setenv("ETCD_ENDPOINTS", "etcd-1:2379 etcd-2:2379 etcd-3:2379")
	t.Setenv("HOSTNAME", "caddy-1")
	t.Setenv("ADVERTISE_URL", "http://caddy-1:8080")
	out, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt(body, map[string]any{"filename": name})
	if err != nil {
		t.Fatalf("%s does not adapt: %v", name, err)
	}
	for _, w := range warnings {
		t.Errorf("%s: adapt warning: %s", name, w)
	}
	var config map[string]any
	if err := json.Unmarshal(out, &config); err != nil {
		t.Fatal(err)
	}
	if _, ok := config["apps"].(map[string]any)["leader"]; !ok {
		t.Errorf("%s configures no leader app", name)
	}
	return config
}

// servesPath reports whether a server of config that listens on port has a route matching
// exactly path.
func servesPath(config map[string]any, port, path string) bool {
	servers, _ := config["apps"].(map[string]any)["http"].(map[string]any)["servers"].(map[string]any)
	for _, s := range servers {
		server := s.(map[string]any)
		listen, _ := server["listen"].([]any)
		if !slices.ContainsFunc(listen, func(l any) bool { return strings.HasSuffix(l.(string), ":"+port) }) {
			continue
		}
		if matchesPath(server["routes"], path) {
			return true
		}
	}
	return false
}

func matchesPath(v any, path string) bool {
	switch v := v.(type) {
	case map[string]any:
		if paths, ok := v["path"].([]any); ok && slices.Contains(paths, any(path)) {
			return true
		}
		for _, child := range v {
			if matchesPath(child, path) {
				return true
			}
		}
	case []any:
		for _, child := range v {
			if matchesPath(child, path) {
				return true
			}
		}
	}
	return false
}

// checkCaddyCommand fails unless args (starting with "caddy") name a command of this Caddy
// build, and subcommand, that accepts the flags given.
func checkCaddyCommand(t *testing.T, args []string) {
	t.Helper()
	if len(args) < 2 || filepath.Base(args[0]) != "caddy" {
		t.Fatalf("%q is not a caddy command", args)
	}
	registered, ok := caddycmd.Commands()[args[1]]
	if !ok {
		t.Fatalf("%q: caddy has no %s command", args, args[1])
	}
	cmd := &cobra.Command{Use: args[1]}
	registered.CobraFunc(cmd)
	rest := args[2:]
	if cmd.HasSubCommands() {
		sub, remaining, err := cmd.Find(rest)
		if err != nil || sub == cmd {
			t.Fatalf("%q: no such subcommand (%v)", args, err)
		}
		cmd, rest = sub, remaining
	}
	if err := cmd.ParseFlags(rest); err != nil {
		t.Errorf("%q: %v", args, err)
	}
	if cmd.Args != nil {
		if err := cmd.Args(cmd, cmd.Flags().Args()); err != nil {
			t.Errorf("%q: %v", args, err)
		}
	}
}

// shellCommands splits a one-line shell script into its simple commands.
func shellCommands(script string) [][]string {
	var cmds [][]string
	for _, part := range regexp.MustCompile(`\|\||&&|[|;]`).Split(script, -1) {
		var args []string
		for _, f := range strings.Fields(part) {
			args = append(args, strings.Trim(f, `'"`))
		}
		if len(args) > 0 {
			cmds = append(cmds, args)
		}
	}
	return cmds
}

// yamlDocuments decodes every document of a YAML file.
func yamlDocuments(t *testing.T, path string) []map[string]any {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	var docs []map[string]any
	for {
		var doc map[string]any
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		docs = append(docs, doc)
	}
}

// k8s is the part of the Kubernetes objects the test reads.
type k8s struct {
	Kind     string
	Metadata struct{ Name string }
	Data     map[string]string
	Spec     struct {
		Selector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		}
		Template struct {
			Metadata struct{ Labels map[string]string }
			Spec     struct {
				TerminationGracePeriodSeconds int `yaml:"terminationGracePeriodSeconds"`
				Containers                    []struct {
					Name           string
					Command        []string
					LivenessProbe  *probe `yaml:"livenessProbe"`
					ReadinessProbe *probe `yaml:"readinessProbe"`
					Lifecycle      struct {
						PreStop struct{ Exec struct{ Command []string } } `yaml:"preStop"`
					}
					VolumeMounts []struct {
						Name      string
						MountPath string `yaml:"mountPath"`
					} `yaml:"volumeMounts"`
				}
				Volumes []struct {
					Name      string
					ConfigMap struct{ Name string } `yaml:"configMap"`
				}
			}
		}
	}
}

type probe struct {
	HTTPGet *struct {
		Path string
		Port any
	} `yaml:"httpGet"`
}

func TestKubernetes(t *testing.T) {
	files, err := filepath.Glob("kubernetes/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	var objects []k8s
	for _, f := range files {
		for _, doc := range yamlDocuments(t, f) {
			raw, _ := yaml.Marshal(doc)
			var o k8s
			if err := yaml.Unmarshal(raw, &o); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if o.Kind == "" || o.Metadata.Name == "" {
				t.Errorf("%s: an object without kind or name", f)
			}
			objects = append(objects, o)
		}
	}
	kinds := map[string]k8s{}
	configMaps := map[string]k8s{}
	for _, o := range objects {
		kinds[o.Kind] = o
		if o.Kind == "ConfigMap" {
			configMaps[o.Metadata.Name] = o
		}
	}
	for _, kind := range []string{"StatefulSet", "ConfigMap", "PodDisruptionBudget", "Service"} {
		if _, ok := kinds[kind]; !ok {
			t.Errorf("no %s", kind)
		}
	}
	set := kinds["StatefulSet"]
	if pdb := kinds["PodDisruptionBudget"]; !mapsEqual(pdb.Spec.Selector.MatchLabels, set.Spec.Template.Metadata.Labels) {
		t.Errorf("the PodDisruptionBudget selects %v, the pods carry %v", pdb.Spec.Selector.MatchLabels, set.Spec.Template.Metadata.Labels)
	}

	pod := set.Spec.Template.Spec
	for _, c := range pod.Containers {
		t.Run(c.Name, func(t *testing.T) {
			checkCaddyCommand(t, c.Command)
			configPath := c.Command[slices.Index(c.Command, "--config")+1]
			// The config file is a key of a ConfigMap mounted at its directory.
			var caddyfile string
			for _, m := range c.VolumeMounts {
				for _, v := range pod.Volumes {
					if v.Name == m.Name && filepath.Dir(configPath) == m.MountPath {
						caddyfile = configMaps[v.ConfigMap.Name].Data[filepath.Base(configPath)]
					}
				}
			}
			if caddyfile == "" {
				t.Fatalf("no ConfigMap mounted provides %s", configPath)
			}
			config := adapt(t, "ConfigMap Caddyfile", []byte(withoutKubernetesStore(t, caddyfile)))

			for name, p := range map[string]*probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
				if p == nil || p.HTTPGet == nil {
					t.Errorf("no HTTP %s probe", name)
					continue
				}
				if port := fmt.Sprint(p.HTTPGet.Port); !servesPath(config, port, p.HTTPGet.Path) {
					t.Errorf("%s probe: the Caddyfile serves no route for %s on port %s", name, p.HTTPGet.Path, port)
				}
			}
			if c.ReadinessProbe != nil && c.ReadinessProbe.HTTPGet != nil && !strings.Contains(caddyfile, "leader_health {\n\t\t\tstandby_ok\n") {
				t.Error("readiness should pass on every healthy candidate, leader or standby (leader_health with standby_ok)")
			}

			script := c.Lifecycle.PreStop.Exec.Command
			if len(script) != 3 || script[1] != "-c" {
				t.Fatalf("preStop is %q, want a shell script", script)
			}
			var caddyCalls int
			for _, args := range shellCommands(script[2]) {
				if args[0] == "caddy" {
					checkCaddyCommand(t, args)
					caddyCalls++
				}
			}
			if caddyCalls == 0 {
				t.Errorf("preStop %q runs no caddy command", script[2])
			}
			// The script greps status --json for this instance being the leader.
			status, _ := json.MarshalIndent(caddyleader.ElectionStatus{Role: "leader"}, "", "  ")
			if want := `"role": "leader"`; !strings.Contains(script[2], want) || !bytes.Contains(status, []byte(want)) {
				t.Errorf("preStop looks for %s in `caddy leader status --json`, which prints %s", want, status)
			}
			if pod.TerminationGracePeriodSeconds <= 15 {
				t.Errorf("terminationGracePeriodSeconds %d leaves no time for drain_timeout 15s", pod.TerminationGracePeriodSeconds)
			}
		})
	}
}

// withoutKubernetesStore replaces the `store kubernetes { … }` block of caddyfile with an
// etcd endpoint: the store module lives in the nested module kubernetes/, which this module
// does not build, and whose TestDeployManifests adapts the whole file with it. The rest of
// the file (sites, probes, gates) is checked here.
func withoutKubernetesStore(t *testing.T, caddyfile string) string {
	t.Helper()
	block := regexp.MustCompile(`(?m)^(\s*)store kubernetes \{\n(?:.*\n)*?\s*\}\n`)
	if !block.MatchString(caddyfile) {
		t.Fatal("the ConfigMap's Caddyfile has no `store kubernetes` block")
	}
	return block.ReplaceAllString(caddyfile, "${1}endpoints 127.0.0.1:2379\n")
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) == 0 || len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestDockerCompose(t *testing.T) {
	docs := yamlDocuments(t, "docker-compose.yml")
	if len(docs) != 1 {
		t.Fatalf("%d documents", len(docs))
	}
	raw, _ := yaml.Marshal(docs[0]) // resolves the anchors and merge keys
	var compose struct {
		Services map[string]struct {
			Image       string
			Volumes     []string
			Environment map[string]string
			Healthcheck struct{ Test []string }
		}
	}
	if err := yaml.Unmarshal(raw, &compose); err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for name, s := range compose.Services {
		switch {
		case strings.HasPrefix(name, "etcd-"):
			counts["etcd"]++
		case strings.HasPrefix(name, "caddy-"):
			counts["caddy"]++
			t.Run(name, func(t *testing.T) {
				if s.Environment["ETCD_ENDPOINTS"] == "" || s.Environment["ADVERTISE_URL"] == "" {
					t.Errorf("environment %v lacks ETCD_ENDPOINTS or ADVERTISE_URL", s.Environment)
				}
				var config map[string]any
				for _, v := range s.Volumes {
					source, target, _ := strings.Cut(v, ":")
					if strings.HasPrefix(target, "/etc/caddy/Caddyfile") {
						body, err := os.ReadFile(source)
						if err != nil {
							t.Fatal(err)
						}
						config = adapt(t, source, body)
					}
				}
				if config == nil {
					t.Fatal("mounts no /etc/caddy/Caddyfile")
				}
				test := s.Healthcheck.Test
				if len(test) < 2 || test[0] != "CMD" {
					t.Fatalf("healthcheck %q", test)
				}
				u, err := url.Parse(test[len(test)-1])
				if err != nil || !servesPath(config, u.Port(), u.Path) {
					t.Errorf("healthcheck %s: the Caddyfile serves no route for it (%v)", test[len(test)-1], err)
				}
			})
		default:
			counts[name]++
		}
	}
	if counts["etcd"] != 3 || counts["caddy"] != 3 || counts["app"] != 1 {
		t.Errorf("services %v, want 3 etcd, 3 caddy and an app", counts)
	}
}

func TestSystemdUnit(t *testing.T) {
	const unit = "systemd/caddy-leader.service"
	raw, err := os.ReadFile(unit)
	if err != nil {
		t.Fatal(err)
	}
	execs := map[string][]string{}
	for _, line := range strings.Split(string(raw), "\n") {
		key, value, ok := strings.Cut(line, "=")
		if ok && strings.HasPrefix(key, "Exec") {
			execs[key] = strings.Fields(value)
		}
	}
	for _, key := range []string{"ExecStart", "ExecReload"} {
		t.Run(key, func(t *testing.T) {
			if execs[key] == nil {
				t.Fatalf("no %s", key)
			}
			checkCaddyCommand(t, execs[key])
		})
	}
	t.Run("systemd-analyze_verify", func(t *testing.T) {
		analyze, err := exec.LookPath("systemd-analyze")
		if err != nil {
			t.Skip("systemd-analyze is not installed")
		}
		// The caddy binary is not installed here: point the unit at an executable that is
		// (the checks above cover its arguments) and verify everything else.
		self, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		copyPath := filepath.Join(t.TempDir(), filepath.Base(unit))
		if err := os.WriteFile(copyPath, bytes.ReplaceAll(raw, []byte("/usr/bin/caddy"), []byte(self)), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(analyze, "verify", copyPath).CombinedOutput()
		if err != nil || len(bytes.TrimSpace(out)) > 0 {
			t.Errorf("systemd-analyze verify: %v\n%s", err, out)
		}
	})
	t.Run("Caddyfile.example_adapts", func(t *testing.T) {
		// The unit's header suggests the repository's Caddyfile.example.
		body, err := os.ReadFile("../Caddyfile.example")
		if err != nil {
			t.Fatal(err)
		}
		adapt(t, "Caddyfile.example", body)
	})
}
