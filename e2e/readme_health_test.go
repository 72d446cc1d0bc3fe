//go:build unix

package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
	"github.com/caddyleader/caddy-leader/internal/testkit/freeport"
	"github.com/caddyleader/caddy-leader/internal/testkit/goldentest"
)

// readmeFleetGolden holds the README's first Caddyfile (TestReadmeExample keeps them equal).
const readmeFleetGolden = "../testdata/caddyfile_adapt/recipe_fleet.caddyfiletest"

// TestReadmeHealthWithTopLevelGate runs the README's Caddyfile on two Caddy processes with its
// gate made site-wide (leader_gate without a matcher, for an active/passive site): its
// `leader_health /health` still answers on each instance itself, 200 on the leader and 429
// on the follower, instead of the gate's answer (a 503, or the leader's 200 forwarded).
func TestReadmeHealthWithTopLevelGate(t *testing.T) {
	needCaddy(t)
	etcd := etcdtest.Start(t, 1)
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "app")
	}))
	t.Cleanup(app.Close)

	cf, _ := goldentest.Read(t, readmeFleetGolden)
	for _, r := range []struct{ old, new string }{
		{"leader_gate @writes {", "leader_gate {"},
		{"endpoints 10.0.0.11:2379 10.0.0.12:2379 10.0.0.13:2379", "endpoints {$ETCD_ENDPOINTS}"},
		{"advertise http://{$HOSTNAME}:8080", "advertise {$ADVERTISE_URL}"},
		{"\n:8080 {", "\nhttp://127.0.0.1:{$PORT} {"},
		{"app:9000", strings.TrimPrefix(app.URL, "http://")},
	} {
		if !strings.Contains(cf, r.old) {
			t.Fatalf("%s no longer has %q: update the test", readmeFleetGolden, r.old)
		}
		cf = strings.ReplaceAll(cf, r.old, r.new)
	}
	path := filepath.Join(t.TempDir(), "Caddyfile")
	if err := os.WriteFile(path, []byte(cf), 0o600); err != nil {
		t.Fatal(err)
	}

	ports := freeport.MustPick(t, 4)
	var fleet []*Instance
	for i := range 2 {
		id := fmt.Sprintf("node-%d", i)
		in := newInstance(t, id, ports[2*i], ports[2*i+1])
		env := []string{
			fmt.Sprintf("CADDY_ADMIN=127.0.0.1:%d", in.AdminPort),
			"ETCD_ENDPOINTS=" + strings.Join(etcd.Endpoints(), " "),
			"HOSTNAME=" + id,
			"ADVERTISE_URL=" + in.URL(),
			fmt.Sprintf("PORT=%d", in.HTTPPort),
		}
		if err := in.Launch(caddyBin, env, "run", "--adapter", "caddyfile", "--config", path); err != nil {
			t.Fatalf("%v\n--- log ---\n%s", err, in.Tail())
		}
		fleet = append(fleet, in)
	}

	type health struct {
		status int
		Role   string  `json:"role"`
		Self   string  `json:"self"`
		Leader *string `json:"leader"`
	}
	ask := func(in *Instance) health {
		resp, err := in.Get("/health")
		if err != nil {
			t.Fatalf("GET /health on %s: %v", in.ID, err)
		}
		h := health{status: resp.Status}
		if err := json.Unmarshal([]byte(resp.Body), &h); err != nil {
			t.Fatalf("GET /health on %s: %d %q is not leader_health's answer: %v", in.ID, resp.Status, resp.Body, err)
		}
		return h
	}
	// Waiting for the election to settle is no timed assertion: the statuses are checked once
	// it has.
	var leader, follower *Instance
	for deadline := time.Now().Add(startTimeout); leader == nil; time.Sleep(pollInterval) {
		for i, in := range fleet {
			if h := ask(in); h.status == http.StatusOK && h.Self == in.ID {
				leader, follower = in, fleet[1-i]
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no instance's /health answered 200 within %s", startTimeout)
		}
	}
	waitUntil := func(what string, cond func() bool) {
		for deadline := time.Now().Add(startTimeout); !cond(); time.Sleep(pollInterval) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %s", what, startTimeout)
			}
		}
	}
	waitUntil("the follower knows the leader", func() bool {
		h := ask(follower)
		return h.Leader != nil && *h.Leader == leader.ID
	})

	t.Run("follower_answers_429_itself", func(t *testing.T) {
		if h := ask(follower); h.status != http.StatusTooManyRequests || h.Role != "standby" || h.Self != follower.ID {
			t.Errorf("the follower's /health: %d, role %q, self %q; want 429 standby from %s", h.status, h.Role, h.Self, follower.ID)
		}
	})
	t.Run("leader_answers_200", func(t *testing.T) {
		if h := ask(leader); h.status != http.StatusOK || h.Role != "leader" {
			t.Errorf("the leader's /health: %d, role %q; want 200 leader", h.status, h.Role)
		}
	})
	t.Run("the_gate_still_forwards_the_rest", func(t *testing.T) {
		resp, err := follower.Get("/")
		if err != nil {
			t.Fatal(err)
		}
		if resp.Status != http.StatusOK || resp.Body != "app\n" {
			t.Errorf("GET / on the follower: %d %q, want the app's 200 through the leader", resp.Status, resp.Body)
		}
	})
}
