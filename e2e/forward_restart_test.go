//go:build unix

package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
	"github.com/caddyleader/caddy-leader/internal/testkit/safety"
)

// TestForwardAfterRestartOfTheLeader: the leader is killed and started again at once with
// the same instance_id and ports, as a supervisor does. Until the old process's lease runs
// out, the election key names this instance but is held under a lease the new process
// does not own. Requests sent then, to the new process and to a follower that forwards to
// its address, must each be handled at most one hop from the client: the new process
// never forwards to its own address, and nothing forwards a request that came forwarded.
// They end 200 or 503 with Retry-After, and once the old lease has run out the fleet
// serves again.
func TestForwardAfterRestartOfTheLeader(t *testing.T) {
	const previousProcessSeen = "the election key is held by this instance's previous process"
	needCaddy(t)
	etcd := etcdtest.Start(t, 1)
	backend := safety.StartBackend(t)
	// A long ttl, so that the new process is up well before the old lease runs out.
	cfg := Config{Endpoints: etcd.Endpoints(), Follower: "forward", Backend: backend.Server.URL, AccessLog: true, TTL: "8s"}
	fleet := StartFleet(t, 3, cfg)
	leader, token := WaitStableLeader(t, fleet, electTimeout)
	peer := others(fleet, leader)[0]

	leader.Kill()
	again := newInstance(t, leader.ID, leader.HTTPPort, leader.AdminPort)
	configPath := filepath.Join(again.Dir, "caddy.json")
	if err := os.WriteFile(configPath, cfg.JSON(again), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := again.Launch(caddyBin, nil, "run", "--config", configPath); err != nil {
		t.Fatal(err)
	}
	// The restarted process answers for itself only once it has looked at the key: until
	// then it cannot tell its previous process's term from one about to be its own, and a
	// peer that forwards to it is told to ask again.
	for deadline := time.Now().Add(electTimeout); !strings.Contains(again.Tail(), previousProcessSeen); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not log %q within %s", again, previousProcessSeen, electTimeout)
		}
	}
	if w, err := peer.Whoami(); err != nil || w.Token != token {
		t.Fatalf("%s sees %+v (%v) once %s restarted; want the old term %d still held: the test did not run inside the old lease",
			peer, w, err, again, token)
	}

	// Sent at once, to the restarted process and to a follower that forwards to it.
	client := &http.Client{Timeout: 20 * time.Second}
	var mu sync.Mutex
	var results []outcome
	var wg sync.WaitGroup
	for i := range 10 {
		for _, in := range []*Instance{again, peer} {
			wg.Add(1)
			go func(id string) {
				defer wg.Done()
				o := sendGated(client, in, id)
				mu.Lock()
				results = append(results, o)
				mu.Unlock()
			}(fmt.Sprintf("%s-%02d", in.ID, i))
		}
	}
	wg.Wait()
	if w, err := peer.Whoami(); err != nil || w.Token != token {
		t.Logf("note: the old term ended while the requests ran (%s sees %+v, %v)", peer, w, err)
	}

	// Once the old lease has run out, the fleet leads and serves again.
	live := []*Instance{again, peer, others(fleet, leader)[1]}
	WaitStableLeader(t, live, 3*electTimeout)
	for _, in := range []*Instance{again, peer} {
		if o := sendGated(client, in, "after-"+in.ID); o.Status != http.StatusOK {
			t.Errorf("after the old lease ran out, a request to %s got %d (%v), want 200", in, o.Status, o.Err)
		}
	}

	hops := accessLogHops(t, append(live, leader))
	worstHandled, worstChain, total := 0, 0, 0
	for _, o := range results {
		switch {
		case o.Status == http.StatusOK:
		case o.Status == http.StatusServiceUnavailable && o.RetryAfter != "":
		default:
			t.Errorf("request %s to %s: status %d (Retry-After %q), error %v; want 200, or 503 with Retry-After",
				o.ReqID, o.Target, o.Status, o.RetryAfter, o.Err)
		}
		h := hops[o.ReqID]
		total += len(h)
		worstHandled = max(worstHandled, len(h))
		instances := map[string]bool{}
		atEntry := 0
		for _, hop := range h {
			instances[hop.instance] = true
			worstChain = max(worstChain, hop.chain)
			if hop.instance == o.Target {
				atEntry++
			}
		}
		if atEntry != 1 {
			t.Errorf("request %s: %s, which the client sent it to, handled it %d times; want once (it must never come back)", o.ReqID, o.Target, atEntry)
		}
		if len(instances) > 2 {
			t.Errorf("request %s was handled by %d instances, want at most 2", o.ReqID, len(instances))
		}
	}
	// A process that does not hold the term it was asked under (the restarted one, while
	// its previous process's lease runs out) is asked once: the follower then waits for
	// the election to change rather than ask again.
	if worstHandled > 2 {
		t.Errorf("a client request was handled %d times, want at most 2 (its entry, and one forward)", worstHandled)
	}
	if worstChain > 2 {
		t.Errorf("a request travelled through %d instances in a row, want at most 2 (one hop)", worstChain)
	}
	t.Logf("MEASURED restart of the leader in forward mode: %d client requests, outcomes by status %v; handled %d times in all (at most %d times for one client request), longest chain %d instances",
		len(results), safety.Summarize(results), total, worstHandled, worstChain)
	checkServedOnce(t, results, backend.Log())
}

// sendGated sends one gated POST to in with request id id.
func sendGated(client *http.Client, in *Instance, id string) outcome {
	req, _ := http.NewRequest(http.MethodPost, in.URL()+"/gated/restart", strings.NewReader(`{"write":"`+id+`"}`))
	req.Header.Set("X-Req-Id", id)
	resp, err := client.Do(req)
	if err != nil {
		return outcome{ReqID: id, Target: in.ID, Err: err}
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return outcome{ReqID: id, Target: in.ID, Status: resp.StatusCode, RetryAfter: resp.Header.Get("Retry-After")}
}

// hop is one handling of a request by an instance, from its access log.
type hop struct {
	instance string
	// chain is how many instances the request had gone through when it reached this one,
	// this one included: one more than the Via entries that reverse_proxy appends per hop.
	chain int
}

// accessLogHops reads the access logs of ins (Config.AccessLog) and returns, by X-Req-Id,
// every handling of a gated request.
func accessLogHops(t *testing.T, ins []*Instance) map[string][]hop {
	t.Helper()
	out := map[string][]hop{}
	seen := map[string]bool{} // a restarted instance may share nothing, or its log, with its first run
	for _, in := range ins {
		if seen[in.LogPath()] {
			continue
		}
		seen[in.LogPath()] = true
		f, err := os.Open(in.LogPath())
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 64<<20) // a looping request's headers grow with every hop
		for sc.Scan() {
			line := sc.Bytes()
			if !strings.Contains(string(line), `"logger":"http.log.access`) {
				continue
			}
			var entry struct {
				Request struct {
					URI     string              `json:"uri"`
					Headers map[string][]string `json:"headers"`
				} `json:"request"`
			}
			if err := json.Unmarshal(line, &entry); err != nil || !strings.HasPrefix(entry.Request.URI, "/gated") {
				continue
			}
			id := ""
			if v := entry.Request.Headers["X-Req-Id"]; len(v) > 0 {
				id = v[0]
			}
			out[id] = append(out[id], hop{instance: in.ID, chain: 1 + len(entry.Request.Headers["Via"])})
		}
		if err := sc.Err(); err != nil {
			t.Fatalf("reading the access log of %s: %v", in, err)
		}
		f.Close()
	}
	return out
}
