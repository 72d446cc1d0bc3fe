//go:build unix

package e2e

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/websocket"

	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
	"github.com/caddyleader/caddy-leader/internal/testkit/safety"
)

// startForwardingFleet starts a 1-member etcd, a recording backend, and three instances
// whose gate proxies admitted requests to it, with the given follower mode and hold (""
// for the default), and waits for their leader.
func startForwardingFleet(t *testing.T, follower, hold string) (*recordingBackend, []*Instance, *Instance, int64) {
	t.Helper()
	etcd := etcdtest.Start(t, 1)
	backend := safety.StartBackend(t)
	fleet := StartFleet(t, 3, Config{Endpoints: etcd.Endpoints(), Follower: follower, Hold: hold, Backend: backend.Server.URL})
	leader, token := WaitStableLeader(t, fleet, electTimeout)
	return backend, fleet, leader, token
}

// checkServedOnce checks the application's log against the clients' outcomes: every
// request that was answered 200 arrived exactly once, nothing arrived twice, every token
// belongs to one instance, tokens never go back (no stale arrival), and the forwarding
// mark never reached the application. It returns the tokens in order of first arrival.
func checkServedOnce(t *testing.T, results []outcome, log []arrival) []int64 {
	t.Helper()
	seen := map[string]int{}
	owner := map[int64]string{}
	var tokens []int64
	var last int64
	for _, a := range log {
		seen[a.ReqID]++
		if a.Marked {
			t.Errorf("request %s reached the application with the forwarding mark", a.ReqID)
		}
		if a.Token < last {
			t.Errorf("stale arrival: request %s with token %d after token %d", a.ReqID, a.Token, last)
		}
		if a.Token > last {
			tokens = append(tokens, a.Token)
			last = a.Token
		}
		if prev, ok := owner[a.Token]; ok && prev != a.ServedBy {
			t.Errorf("token %d served by both %s and %s", a.Token, prev, a.ServedBy)
		}
		owner[a.Token] = a.ServedBy
	}
	for id, n := range seen {
		if n > 1 {
			t.Errorf("request %s reached the application %d times", id, n)
		}
	}
	for _, o := range results {
		if o.Status == http.StatusOK && seen[o.ReqID] != 1 {
			t.Errorf("request %s was answered 200 but reached the application %d times", o.ReqID, seen[o.ReqID])
		}
	}
	return tokens
}

func TestForwarding(t *testing.T) {
	needCaddy(t)

	switchovers := []struct {
		name     string
		follower string
		handOver func(t *testing.T, leader *Instance, l *loadRun)
	}{
		{"forward_sigterm_of_the_leader", "forward", func(t *testing.T, leader *Instance, l *loadRun) {
			l.MarkDown(leader)
			leader.Term()
		}},
		{"forward_resign_through_the_admin_api", "forward", func(t *testing.T, leader *Instance, l *loadRun) {
			resp, err := leader.Admin(http.MethodPost, "/leader/default/resign?hold_off=30s", nil)
			if err != nil || resp.Status != http.StatusOK {
				t.Errorf("resign: %v %d %s", err, resp.Status, resp.Body)
			}
		}},
		{"redirect_sigterm_of_the_leader", "redirect", func(t *testing.T, leader *Instance, l *loadRun) {
			l.MarkDown(leader)
			leader.Term()
		}},
	}
	for _, sc := range switchovers {
		t.Run("graceful_switchover_under_load_fails_no_request/"+sc.name, func(t *testing.T) {
			backend, fleet, leader, token := startForwardingFleet(t, sc.follower, "2s")

			client := &http.Client{Timeout: 10 * time.Second} // follows redirects, keeping POST and body on 307
			l := safety.NewLoadRun(fleet, client)
			done := make(chan struct{})
			go func() { l.Run(200, 4*time.Second); close(done) }()
			time.Sleep(1500 * time.Millisecond) // steady traffic before the handover
			sc.handOver(t, leader, l)
			<-done

			counts := safety.Summarize(l.Results)
			t.Logf("MEASURED %s: %d requests, outcomes by status %v", sc.name, len(l.Results), counts)
			failed := false
			for _, o := range l.Results {
				if o.Status != http.StatusOK {
					failed = true
					t.Errorf("request %s to %s failed: status %d, error %v", o.ReqID, o.Target, o.Status, o.Err)
				}
			}
			if failed {
				for _, in := range fleet {
					t.Logf("%s handler errors:\n%s", in, handlerErrors(in))
				}
			}
			tokens := checkServedOnce(t, l.Results, backend.Log())
			if len(tokens) != 2 || tokens[0] != token {
				t.Errorf("tokens in order of arrival = %v, want the old term %d then one new term", tokens, token)
			}
		})
	}

	t.Run("crash_of_the_leader_holds_then_503_and_serves_nothing_twice", func(t *testing.T) {
		backend, fleet, leader, _ := startForwardingFleet(t, "forward", "1s")

		l := safety.NewLoadRun(fleet, &http.Client{Timeout: 10 * time.Second})
		done := make(chan struct{})
		go func() { l.Run(200, 5*time.Second); close(done) }()
		time.Sleep(time.Second)
		l.MarkDown(leader)
		leader.Kill()
		<-done

		counts := safety.Summarize(l.Results)
		t.Logf("MEASURED crash with hold 1s: %d requests, outcomes by status %v", len(l.Results), counts)
		for _, o := range l.Results {
			switch {
			case o.Status == http.StatusOK:
			case o.Status == http.StatusServiceUnavailable && o.RetryAfter != "":
			case o.Err != nil && o.Target == leader.ID:
				// Sent to the leader just before the kill: no process is left to answer.
			default:
				t.Errorf("request %s: status %d (Retry-After %q), error %v; want 200, or 503 with Retry-After", o.ReqID, o.Status, o.RetryAfter, o.Err)
			}
		}
		if counts[http.StatusServiceUnavailable] == 0 {
			t.Errorf("no request saw the leaderless window: the test did not exercise the hold")
		}
		checkServedOnce(t, l.Results, backend.Log())
	})

	t.Run("forged_mark_is_stripped_and_the_request_never_forwarded", func(t *testing.T) {
		backend, fleet, leader, _ := startForwardingFleet(t, "forward", "500ms")
		follower := others(fleet, leader)[0]

		send := func(in *Instance, id string) *http.Response {
			req, _ := http.NewRequest(http.MethodPost, in.URL()+"/gated/guard", strings.NewReader("x"))
			req.Header.Set("X-Req-Id", id)
			req.Header.Set("Caddy-Leader-Forwarded-By", "some-peer")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			return resp
		}
		// A client cannot mark a request as forwarded (the mark carries a MAC made
		// with a secret of the leader's term), so the leader drops the forged mark and
		// serves the request as any other. A follower does not forward a request that
		// came marked, forged or not: one hop is the most any request travels, so the
		// client only denied itself the forward.
		if resp := send(follower, "marked-to-follower"); resp.StatusCode != http.StatusServiceUnavailable ||
			resp.Header.Get("Retry-After") == "" || resp.Header.Get("Caddy-Leader-Not-Leader") == "" {
			t.Errorf("a request with a forged mark to a follower got %d (Retry-After %q, Not-Leader %q), want 503 with both",
				resp.StatusCode, resp.Header.Get("Retry-After"), resp.Header.Get("Caddy-Leader-Not-Leader"))
		}
		if resp := send(leader, "marked-to-leader"); resp.StatusCode != http.StatusOK {
			t.Errorf("a marked request to the leader got %d, want 200", resp.StatusCode)
		}
		seen := map[string]int{}
		for _, a := range backend.Log() {
			seen[a.ReqID]++
			if a.Marked {
				t.Errorf("request %s reached the application with the mark", a.ReqID)
			}
		}
		if seen["marked-to-follower"] != 0 || seen["marked-to-leader"] != 1 {
			t.Errorf("arrivals: marked to the follower %d, marked to the leader %d; want 0 and 1",
				seen["marked-to-follower"], seen["marked-to-leader"])
		}
	})

	t.Run("handle_path_in_front_of_the_gate_forwards_the_original_uri", func(t *testing.T) {
		etcd := etcdtest.Start(t, 1)
		backend := safety.StartBackend(t)
		fleet := StartFleet(t, 3, Config{Endpoints: etcd.Endpoints(), Follower: "forward", Backend: backend.Server.URL, HandlePath: "/api"})
		leader, _ := WaitStableLeader(t, fleet, electTimeout)
		follower := others(fleet, leader)[0]

		// handle_path strips /api on the follower before its gate runs; the leader must
		// get /api/... as the client sent it, and route it through its own handle_path
		// (there is no route for /gated without the prefix).
		req, _ := http.NewRequest(http.MethodPost, follower.URL()+"/api/gated/items?page=2&q=a%20b", strings.NewReader("x"))
		req.Header.Set("X-Req-Id", "stripped")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(string(body), leader.ID+" ") {
			t.Errorf("through %s: status %d, body %q; want 200 from the leader %s's application", follower, resp.StatusCode, body, leader)
		}
		var got []arrival
		for _, a := range backend.Log() {
			if a.ReqID == "stripped" {
				got = append(got, a)
			}
		}
		want := arrival{ServedBy: leader.ID, URI: "/gated/items?page=2&q=a%20b", OriginalURI: "/api/gated/items?page=2&q=a%20b"}
		if len(got) != 1 || got[0].ServedBy != want.ServedBy || got[0].URI != want.URI || got[0].OriginalURI != want.OriginalURI {
			t.Errorf("arrivals %+v; want one, served by %s, the leader sent %q and its application getting %q",
				got, want.ServedBy, want.OriginalURI, want.URI)
		}
	})

	t.Run("websocket_and_10MB_streamed_upload_through_a_follower", func(t *testing.T) {
		backend, fleet, leader, _ := startForwardingFleet(t, "forward", "")
		follower := others(fleet, leader)[0]

		// /gated/* is gated for every method, so the upgrade (a GET) is forwarded too.
		ws, err := websocket.Dial("ws"+strings.TrimPrefix(follower.URL(), "http")+"/gated/ws", "", follower.URL())
		if err != nil {
			t.Fatalf("websocket through %s: %v", follower, err)
		}
		for i := range 3 {
			msg := fmt.Sprintf("hello %d", i)
			if err := websocket.Message.Send(ws, msg); err != nil {
				t.Fatal(err)
			}
			var echo string
			if err := websocket.Message.Receive(ws, &echo); err != nil {
				t.Fatal(err)
			}
			if echo != msg {
				t.Errorf("echo %q, want %q", echo, msg)
			}
		}
		ws.Close()

		payload := make([]byte, 10<<20)
		_, _ = rand.Read(payload)
		want := sha256.Sum256(payload)
		pr, pw := io.Pipe()
		go func() {
			// Streamed in small chunks, with no Content-Length: chunked all the way.
			for off := 0; off < len(payload); off += 64 << 10 {
				if _, err := pw.Write(payload[off:min(off+64<<10, len(payload))]); err != nil {
					return
				}
			}
			pw.Close()
		}()
		req, _ := http.NewRequest(http.MethodPost, follower.URL()+"/gated/upload", pr)
		req.Header.Set("X-Req-Id", "upload")
		resp, err := (&http.Client{Timeout: 60 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || string(body) != hex.EncodeToString(want[:]) {
			t.Fatalf("upload through %s: status %d, body %q; want 200 and the SHA-256 of the payload", follower, resp.StatusCode, body)
		}
		for _, a := range backend.Log() {
			if a.ReqID == "upload" && a.ServedBy != leader.ID {
				t.Errorf("upload served by %s, want the leader %s", a.ServedBy, leader.ID)
			}
		}
	})

	t.Run("added_latency_of_a_forwarded_request", func(t *testing.T) {
		_, fleet, leader, _ := startForwardingFleet(t, "forward", "")
		follower := others(fleet, leader)[0]
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
		measure := func(in *Instance) time.Duration {
			start := time.Now()
			resp, err := client.Post(in.URL()+"/gated/latency", "text/plain", bytes.NewReader([]byte("x")))
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d from %s", resp.StatusCode, in)
			}
			return time.Since(start)
		}
		var direct, forwarded []time.Duration
		for range 20 { // warm both paths' connections
			measure(leader)
			measure(follower)
		}
		for range 500 { // side by side, interleaved
			direct = append(direct, measure(leader))
			forwarded = append(forwarded, measure(follower))
		}
		p := func(d []time.Duration, q float64) time.Duration {
			sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
			return d[int(q*float64(len(d)-1))]
		}
		t.Logf("MEASURED latency over 500 sequential POSTs each: direct to the leader p50 %v p99 %v; through a follower p50 %v p99 %v",
			p(direct, 0.5), p(direct, 0.99), p(forwarded, 0.5), p(forwarded, 0.99))
	})
}

// handlerErrors returns the error lines Caddy logged for requests, to tell which path
// failed a request.
func handlerErrors(in *Instance) string {
	b, _ := os.ReadFile(in.LogPath())
	var lines []string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, `"logger":"http.log.error`) {
			lines = append(lines, line)
		}
	}
	return strings.Join(lines, "\n")
}
