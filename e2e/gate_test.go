//go:build unix

package e2e

import (
	"bytes"
	"context"
	"net/http"
	"testing"

	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
)

func TestGate(t *testing.T) {
	needCaddy(t)

	t.Run("one_of_three_serves_followers_reject_with_retry_after", func(t *testing.T) {
		etcd := etcdtest.Start(t, 1)
		fleet := StartFleet(t, 3, Config{Endpoints: etcd.Endpoints(), Variant: "v0"})
		leader, token := WaitStableLeader(t, fleet, electTimeout)

		served := 0
		for _, in := range fleet {
			resp, err := in.Get("/gated")
			if err != nil {
				t.Fatalf("%s: GET /gated: %v", in, err)
			}
			if in == leader {
				served++
				if resp.Status != http.StatusOK {
					t.Errorf("leader %s: GET /gated = %d %q, want 200", in, resp.Status, resp.Body)
					continue
				}
				g, err := parseGated(resp.Body)
				if err != nil {
					t.Fatal(err)
				}
				if g.Self != leader.ID || g.Token != token {
					t.Errorf("leader %s: /gated served by %s with token %d, want %s with token %d", in, g.Self, g.Token, leader.ID, token)
				}
			} else {
				if resp.Status != http.StatusServiceUnavailable {
					t.Errorf("follower %s: GET /gated = %d %q, want 503", in, resp.Status, resp.Body)
				}
				if ra := resp.Header.Get("Retry-After"); ra != "1" {
					t.Errorf("follower %s: Retry-After = %q, want \"1\" (default retry_after 1s)", in, ra)
				}
			}

			resp, err = in.Get("/leader")
			if err != nil {
				t.Fatalf("%s: GET /leader: %v", in, err)
			}
			want := http.StatusServiceUnavailable
			if in == leader {
				want = http.StatusOK
			}
			if resp.Status != want {
				t.Errorf("%s: GET /leader (leader matcher) = %d %q, want %d", in, resp.Status, resp.Body, want)
			}
			// Load balancers often health-check with HEAD: the same status, no body.
			for path, want := range map[string]int{"/leader": want, "/health": http.StatusOK} {
				resp, err := in.Do(context.Background(), http.MethodHead, path, nil)
				if err != nil {
					t.Fatalf("%s: HEAD %s: %v", in, path, err)
				}
				if resp.Status != want || resp.Body != "" {
					t.Errorf("%s: HEAD %s = %d with %d body bytes, want %d and none", in, path, resp.Status, len(resp.Body), want)
				}
			}
		}
		if served != 1 {
			t.Errorf("%d instances lead, want exactly 1", served)
		}
	})

	t.Run("followers_redirect_to_the_leader_keeping_uri_and_method", func(t *testing.T) {
		etcd := etcdtest.Start(t, 1)
		fleet := StartFleet(t, 3, Config{Endpoints: etcd.Endpoints(), Follower: "redirect", Variant: "v0"})
		leader, token := WaitStableLeader(t, fleet, electTimeout)

		const uri = "/gated/some/path?q=1&name=a%20b&q=2"
		if resp, err := leader.Get(uri); err != nil || resp.Status != http.StatusOK {
			t.Fatalf("leader %s: GET %s = %+v, %v; want 200", leader, uri, resp, err)
		}
		for _, in := range others(fleet, leader) {
			resp, err := in.Get(uri)
			if err != nil {
				t.Fatalf("%s: GET %s: %v", in, uri, err)
			}
			if resp.Status != http.StatusTemporaryRedirect {
				t.Errorf("follower %s: GET %s = %d %q, want 307", in, uri, resp.Status, resp.Body)
			}
			if loc, want := resp.Header.Get("Location"), leader.URL()+uri; loc != want {
				t.Errorf("follower %s: Location = %q, want %q", in, loc, want)
			}

			// A client that follows the redirect must arrive at the leader with its POST.
			req, err := http.NewRequest(http.MethodPost, in.URL()+uri, bytes.NewReader([]byte("payload")))
			if err != nil {
				t.Fatal(err)
			}
			follow := &http.Client{Transport: client.Transport, Timeout: requestTimeout}
			presp, err := follow.Do(req)
			if err != nil {
				t.Fatalf("follower %s: POST %s following redirects: %v", in, uri, err)
			}
			var body bytes.Buffer
			_, _ = body.ReadFrom(presp.Body)
			presp.Body.Close()
			if presp.StatusCode != http.StatusOK {
				t.Errorf("follower %s: POST %s following redirects = %d %q, want 200 from the leader", in, uri, presp.StatusCode, body.String())
				continue
			}
			g, err := parseGated(body.String())
			if err != nil {
				t.Fatal(err)
			}
			if g.Self != leader.ID || g.Token != token || g.Method != http.MethodPost {
				t.Errorf("follower %s: POST followed to %s with token %d as %s, want %s with token %d as POST", in, g.Self, g.Token, g.Method, leader.ID, token)
			}
		}
	})
}
