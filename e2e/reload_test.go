//go:build unix

package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
)

func TestReload(t *testing.T) {
	needCaddy(t)

	t.Run("twenty_reloads_of_the_leader_keep_its_term_and_fail_no_gated_request", func(t *testing.T) {
		etcd := etcdtest.Start(t, 1)
		cfg := Config{Endpoints: etcd.Endpoints(), Variant: "v0"}
		fleet := StartFleet(t, 3, cfg)
		leader, token := WaitStableLeader(t, fleet, electTimeout)
		watch := startTermWatch(fleet, leader, token)

		// Spread over a ttl, so that lease renewals happen between and during reloads.
		const reloads = 20
		const spacing = ttl / reloads
		checkDrops := 0
		for i := range reloads {
			time.Sleep(spacing)
			cfg.Variant = fmt.Sprintf("v%d", 1+i%2)
			leader.Reload(cfg)
			// /load returns once the new config serves; prove that it does. (Retry a
			// connection that Caddy drops as it closes the old config's listener.)
			resp, dropped, err := getRetrying(leader, "/gated")
			checkDrops += dropped
			if err != nil || resp.Status != http.StatusOK {
				t.Fatalf("reload %d: GET /gated on leader %s = %+v, %v; want 200", i+1, leader, resp, err)
			}
			g, err := parseGated(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			if g.Variant != cfg.Variant || g.Token != token {
				t.Fatalf("reload %d: leader %s serves variant %q with token %d, want variant %q with token %d", i+1, leader, g.Variant, g.Token, cfg.Variant, token)
			}
		}
		watch.stopAndCheck(t)
		t.Logf("%d reloads; the checks after them saw %d connections dropped by Caddy (retried)", reloads, checkDrops)
	})

	t.Run("bad_config_is_refused_naming_the_field_and_leaves_the_term_alone", func(t *testing.T) {
		etcd := etcdtest.Start(t, 1)
		good := Config{Endpoints: etcd.Endpoints(), Variant: "v0"}
		fleet := StartFleet(t, 2, good)
		leader, token := WaitStableLeader(t, fleet, electTimeout)

		for _, tc := range []struct {
			name  string
			bad   Config
			field string // the error must name it
		}{
			{"redirect_with_status_302", Config{Endpoints: good.Endpoints, Follower: "redirect", FollowerStatus: 302, Variant: "bad"}, "status_code"},
			{"ttl_500ms", Config{Endpoints: good.Endpoints, TTL: "500ms", Variant: "bad"}, "ttl"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				watch := startTermWatch(fleet, leader, token)
				status, body, err := leader.LoadConfig(tc.bad)
				if err != nil {
					t.Fatalf("POST /load: %v", err)
				}
				if status != http.StatusBadRequest {
					t.Errorf("POST /load of a bad config = %d %s, want 400", status, body)
				}
				if !strings.Contains(body, tc.field) {
					t.Errorf("POST /load error %s does not mention the bad field %q", body, tc.field)
				}
				time.Sleep(ttl / 2) // let a wrongly started candidacy show itself
				resp, err := leader.Get("/gated")
				if err != nil || resp.Status != http.StatusOK {
					t.Fatalf("after the refused config: GET /gated on leader %s = %+v, %v; want 200", leader, resp, err)
				}
				if g, err := parseGated(resp.Body); err != nil || g.Variant != good.Variant {
					t.Errorf("after the refused config the leader serves %q (%v), want the running config's variant %q", resp.Body, err, good.Variant)
				}
				// The running config is the good one, as the admin API reports it too.
				resp, err = leader.Admin(http.MethodGet, "/config/apps/leader/ttl", nil)
				if err != nil || strings.TrimSpace(resp.Body) != `"`+ttl.String()+`"` {
					t.Errorf("after the refused config: GET /config/apps/leader/ttl = %+v, %v; want %q", resp, err, ttl.String())
				}
				watch.stopAndCheck(t)
			})
		}
	})
}

// termWatch polls /whoami on a whole fleet, and /gated and the control route /plain on its
// leader, and records every answer that is not the expected term.
//
// Caddy itself drops some connections while it swaps configs, on every route alike (the
// old listener's queue is reset), before any handler runs. Such a request did not fail at
// the gate: it is counted, retried at once as a client would, and only the retry's answer
// is judged. The same count on /plain shows how many drops are Caddy's own.
type termWatch struct {
	leader *Instance
	token  int64
	done   chan struct{}
	wg     sync.WaitGroup

	mu           sync.Mutex
	problems     []string
	polls        int
	gatedOK      int
	gatedDropped int
	plainDropped int
	unknown      int      // follower answers with no leader known (lost track, not a change)
	unknowns     []string // the first few of them
}

func startTermWatch(fleet []*Instance, leader *Instance, token int64) *termWatch {
	w := &termWatch{leader: leader, token: token, done: make(chan struct{})}
	for _, in := range fleet {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			for {
				select {
				case <-w.done:
					return
				default:
				}
				w.pollWhoami(in)
				if in == leader {
					w.pollGated()
					w.pollPlain()
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	return w
}

func (w *termWatch) problem(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.problems = append(w.problems, time.Now().Format("15:04:05.000 ")+fmt.Sprintf(format, args...))
}

// getRetrying GETs path, retrying requests that got no answer at all a few times. It
// returns the first answer and how many attempts got none.
func getRetrying(in *Instance, path string) (Response, int, error) {
	const attempts = 3
	for i := 1; ; i++ {
		resp, err := in.Get(path)
		if err == nil || i == attempts {
			return resp, i - 1, err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (w *termWatch) pollWhoami(in *Instance) {
	var who Whoami
	resp, _, err := getRetrying(in, "/whoami")
	if err == nil {
		who, err = parseWhoami(resp)
	}
	w.mu.Lock()
	w.polls++
	w.mu.Unlock()
	switch {
	case err != nil:
		w.problem("%s: /whoami: %v", in, err)
	case in == w.leader:
		if !who.IsLeader || who.Leader != w.leader.ID || who.Token != w.token {
			w.problem("leader %s: /whoami = %+v, want it leading with token %d", in, who, w.token)
		}
	case who.Leader == "" && who.Token == 0:
		w.mu.Lock()
		w.unknown++
		if len(w.unknowns) < 5 {
			w.unknowns = append(w.unknowns, time.Now().Format("15:04:05.000 ")+in.ID)
		}
		w.mu.Unlock()
	case who.Leader != w.leader.ID || who.Token != w.token || who.IsLeader:
		w.problem("%s: /whoami = %+v, want leader %s with token %d", in, who, w.leader, w.token)
	}
}

func (w *termWatch) pollGated() {
	resp, dropped, err := getRetrying(w.leader, "/gated")
	w.mu.Lock()
	w.gatedDropped += dropped
	w.mu.Unlock()
	if err != nil {
		w.problem("leader %s: GET /gated, %d attempts: %v", w.leader, dropped, err)
		return
	}
	if resp.Status != http.StatusOK {
		w.problem("leader %s: GET /gated = %d %q", w.leader, resp.Status, resp.Body)
		return
	}
	if g, err := parseGated(resp.Body); err != nil || g.Token != w.token || g.Self != w.leader.ID {
		w.problem("leader %s: GET /gated = %q (%v), want token %d", w.leader, resp.Body, err, w.token)
		return
	}
	w.mu.Lock()
	w.gatedOK++
	w.mu.Unlock()
}

func (w *termWatch) pollPlain() {
	_, dropped, _ := getRetrying(w.leader, "/plain")
	w.mu.Lock()
	w.plainDropped += dropped
	w.mu.Unlock()
}

// stopAndCheck ends the watch and fails the test for every answer off the expected term.
// Followers that briefly know no leader are reported, not failed: losing track of the
// leader is not a change of leadership.
func (w *termWatch) stopAndCheck(t *testing.T) {
	t.Helper()
	close(w.done)
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	t.Logf("term watch: %d /whoami polls, %d gated 200s on leader %s (token %d); connections dropped by Caddy and retried: %d on /gated, %d on /plain; %d follower answers without a known leader %v",
		w.polls, w.gatedOK, w.leader, w.token, w.gatedDropped, w.plainDropped, w.unknown, w.unknowns)
	const show = 20
	for i, p := range w.problems {
		if i == show {
			t.Errorf("... and %d more", len(w.problems)-show)
			break
		}
		t.Errorf("off the term: %s", p)
	}
	if w.gatedOK == 0 {
		t.Errorf("no gated request on leader %s succeeded while watching", w.leader)
	}
}
