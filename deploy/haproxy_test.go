package deploy

import (
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The HAProxy recipe. e2e's TestHAProxy runs these files with real processes; the checks
// here are the ones that need none: the Caddyfile adapts, serves the paths that the checks
// ask for, keeps serving long enough for HAProxy to notice a stop, and the page that
// explains the recipe shows the files as they are.
const (
	haproxyCaddyfile = "haproxy/Caddyfile"
	haproxyDoc       = "../docs/haproxy.md"
)

var haproxyConfigs = []string{"haproxy/active-passive.cfg", "haproxy/forward.cfg"}

var (
	checkURI      = regexp.MustCompile(`(?m)^\s*http-check send meth GET uri (\S+)$`)
	defaultServer = regexp.MustCompile(`(?m)^\s*default-server inter (\S+) fall (\d+) rise (\d+)`)
)

func TestHAProxyRecipe(t *testing.T) {
	body, err := os.ReadFile(haproxyCaddyfile)
	if err != nil {
		t.Fatal(err)
	}
	config := adapt(t, haproxyCaddyfile, body)
	http, _ := config["apps"].(map[string]any)["http"].(map[string]any)
	shutdownDelay := time.Duration(0)
	if d, ok := http["shutdown_delay"].(float64); ok {
		shutdownDelay = time.Duration(d)
	}
	doc, err := os.ReadFile(haproxyDoc)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("doc_shows_Caddyfile", func(t *testing.T) {
		if !strings.Contains(string(doc), "```caddyfile\n"+string(body)+"```\n") {
			t.Errorf("%s does not show %s as it is: copy it into a ```caddyfile block", haproxyDoc, haproxyCaddyfile)
		}
	})

	for _, name := range haproxyConfigs {
		t.Run(name, func(t *testing.T) {
			cfg, err := os.ReadFile(name)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(doc), "```haproxy\n"+string(cfg)+"```\n") {
				t.Errorf("%s does not show %s as it is: copy it into a ```haproxy block", haproxyDoc, name)
			}
			uris := checkURI.FindAllStringSubmatch(string(cfg), -1)
			if len(uris) == 0 {
				t.Error("no `http-check send meth GET uri` line")
			}
			for _, m := range uris {
				if !servesPath(config, "8080", m[1]) {
					t.Errorf("HAProxy checks %s, which %s does not serve on port 8080", m[1], haproxyCaddyfile)
				}
			}
			m := defaultServer.FindStringSubmatch(string(cfg))
			if m == nil {
				t.Fatal("no `default-server inter ... fall ... rise ...` line")
			}
			inter, err := haproxyTime(m[1])
			if err != nil {
				t.Fatal(err)
			}
			fall, _ := strconv.Atoi(m[2])
			// From the handover, HAProxy marks an instance down after at most fall checks,
			// the first up to one inter away, each taking up to `timeout check` (inter when
			// unset): the port must stay open that long.
			if need := time.Duration(fall+1) * inter; shutdownDelay < need {
				t.Errorf("%s: shutdown_delay %v is shorter than (fall+1) x inter = %v: the port can close before HAProxy marks the instance down", haproxyCaddyfile, shutdownDelay, need)
			}
			if strings.Contains(string(cfg), "shutdown-sessions") {
				t.Error("on-marked-down shutdown-sessions cuts off the requests that a lame duck is still answering")
			}
		})
	}

	t.Run("haproxy_-c", func(t *testing.T) {
		bin, err := exec.LookPath("haproxy")
		if err != nil {
			if _, serr := os.Stat("/usr/sbin/haproxy"); serr != nil {
				t.Skip("haproxy is not installed")
			}
			bin = "/usr/sbin/haproxy"
		}
		for _, name := range haproxyConfigs {
			cmd := exec.Command(bin, "-c", "-f", name)
			cmd.Env = append(os.Environ(), "HAPROXY_BIND=127.0.0.1:80",
				"CADDY_1=10.0.0.5:8080", "CADDY_2=10.0.0.6:8080", "CADDY_3=10.0.0.7:8080")
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("haproxy -c -f %s: %v\n%s", name, err, out)
			}
		}
	})
}

// haproxyTime parses an HAProxy time: a number with a unit (us, ms, s, m, h), or
// milliseconds when there is none.
func haproxyTime(s string) (time.Duration, error) {
	if strings.TrimLeft(s, "0123456789") == "" {
		s += "ms"
	}
	return time.ParseDuration(s)
}
