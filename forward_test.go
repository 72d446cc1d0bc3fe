package caddyleader

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
)

func TestNotLeaderCatcher(t *testing.T) {
	cases := []struct {
		name       string
		status     int
		marked     bool
		wantCaught bool
	}{
		{"ok_response_passes_through", http.StatusOK, false, false},
		{"plain_503_passes_through", http.StatusServiceUnavailable, false, false},
		{"marked_503_is_swallowed", http.StatusServiceUnavailable, true, true},
		{"marked_non_503_passes_through", http.StatusBadGateway, true, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			rec.Header().Set("X-Before", "kept")
			c := newNotLeaderCatcher(rec)
			// What reverse_proxy does with an upstream response: copy headers, write the
			// status, copy the body (through ReadFrom when the writer has it).
			c.Header().Set("X-Upstream", "copied")
			if tc.marked {
				c.Header().Set(NotLeaderHeader, "default")
			}
			c.WriteHeader(tc.status)
			if _, err := c.ReadFrom(strings.NewReader("body")); err != nil {
				t.Fatal(err)
			}
			if c.caught != tc.wantCaught {
				t.Fatalf("caught = %v, want %v", c.caught, tc.wantCaught)
			}
			if !tc.wantCaught {
				if rec.Code != tc.status || rec.Body.String() != "body" {
					t.Fatalf("passed through as %d %q", rec.Code, rec.Body.String())
				}
				return
			}
			c.restoreHeader()
			if rec.Body.Len() != 0 || rec.Header().Get("X-Upstream") != "" || rec.Header().Get(NotLeaderHeader) != "" {
				t.Fatalf("swallowed response leaked: body %q, headers %v", rec.Body.String(), rec.Header())
			}
			if rec.Header().Get("X-Before") != "kept" {
				t.Fatalf("headers set before the try were lost: %v", rec.Header())
			}
		})
	}
}

func TestBufferBody(t *testing.T) {
	cases := []struct {
		name           string
		body           io.Reader
		contentLength  int64
		wantReplayable bool
		wantBody       string
	}{
		{"no_body", nil, 0, true, ""},
		{"small_body_is_buffered", strings.NewReader("hello"), 5, true, "hello"},
		{"streamed_body_of_unknown_length_is_not", strings.NewReader("hello"), -1, false, ""},
		{"body_over_the_limit_is_not", strings.NewReader(strings.Repeat("x", replayLimit+1)), replayLimit + 1, false, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/", tc.body)
			r.ContentLength = tc.contentLength
			body, replayable, err := bufferBody(r)
			if err != nil {
				t.Fatal(err)
			}
			if replayable != tc.wantReplayable {
				t.Fatalf("replayable = %v, want %v", replayable, tc.wantReplayable)
			}
			if string(body) != tc.wantBody {
				t.Fatalf("buffered %q, want %q", body, tc.wantBody)
			}
			if !replayable {
				// The body must still be readable in full by the one try it gets.
				rest, _ := io.ReadAll(r.Body)
				if int64(len(rest)) != max(tc.contentLength, 5) {
					t.Fatalf("body left for the single try: %d bytes", len(rest))
				}
			}
		})
	}
}

// TestForwardAsksAgainWhileTheLeaderSettles: the instance a follower takes for the leader
// may answer NotLeaderHeader for a while (it has not yet confirmed its own win, or it waits
// for its predecessor to stop). The follower keeps asking, paced, and serves the request
// once the leader admits it, or answers 503 with Retry-After when Hold runs out.
func TestForwardAsksAgainWhileTheLeaderSettles(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	cluster := etcdtest.Start(t, 1)
	const always = -1
	cases := []struct {
		name     string
		refusals int // answers with NotLeaderHeader before the leader admits
		// elsewhere refuses as an instance that knows it will not lead soon (a process
		// started again at the leader's address), rather than as a settling leader.
		elsewhere bool
		hold      time.Duration
		// What the client gets, and how many tries the leader saw at least and at most.
		wantStatus         int
		minTries, maxTries int32
	}{
		// Six refusals: more than a fixed try budget would allow, well within Hold.
		{"served_once_the_leader_admits", 6, false, 5 * time.Second, http.StatusOK, 7, 7},
		// Paced: the pauses (5, 10, 20, 40, 80, 100ms...) fit about 7 tries into 300ms,
		// and a slow machine fits fewer; a tight loop would make thousands.
		{"503_when_hold_runs_out", always, false, 300 * time.Millisecond, http.StatusServiceUnavailable, 2, 8},
		// An instance that knows it will not lead soon is asked once: nothing but a change
		// of the election is worth another try, and none comes within hold.
		{"asked_once_when_the_term_is_not_held_there", always, true, 300 * time.Millisecond, http.StatusServiceUnavailable, 1, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			election := "settling-" + tc.name
			var tries atomic.Int32
			var forwardedBy atomic.Value
			leaderSide := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n := tries.Add(1)
				forwardedBy.Store(r.Header.Get(ForwardedByHeader))
				body, _ := io.ReadAll(r.Body)
				if tc.refusals == always || int(n) <= tc.refusals {
					w.Header().Set(NotLeaderHeader, election)
					if tc.elsewhere {
						w.Header().Set(NotLeaderHeader, notLeaderElsewhere)
					}
					w.WriteHeader(http.StatusServiceUnavailable)
					return
				}
				fmt.Fprintf(w, "served %s", body)
			}))
			t.Cleanup(leaderSide.Close)

			eps := cluster.Endpoints()
			leader := startInstanceAt(t, eps, "leader", leaderSide.URL, election, 3*time.Second, false)
			waitUntil(t, "the leader leads", func() bool { _, ok := leader.election.Check(); return ok })
			follower := startInstance(t, eps, "follower", election, 3*time.Second, false)
			waitUntil(t, "the follower knows the leader", func() bool {
				return follower.election.Term().Leader.ID == "leader"
			})

			hold := caddy.Duration(tc.hold)
			g := newGate(t, Gate{Election: election, Follower: FollowerForward, Hold: &hold}, follower.election)
			if err := g.provisionForwarder(newLoadedContext(t), &App{InstanceID: "follower"}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = g.Cleanup() })

			r, _ := gatedRequest(http.MethodPost, "/write")
			r.Body = io.NopCloser(strings.NewReader("payload"))
			r.ContentLength = int64(len("payload"))
			w := httptest.NewRecorder()
			next := &recordingNext{}
			err := g.ServeHTTP(w, r, next)
			if next.ran {
				t.Fatal("the follower served the request itself")
			}
			if tc.wantStatus == http.StatusOK {
				if err != nil || w.Code != http.StatusOK || w.Body.String() != "served payload" {
					t.Fatalf("got %d %q, error %v; want 200 %q", w.Code, w.Body.String(), err, "served payload")
				}
			} else {
				assertHandlerError(t, err, tc.wantStatus)
				if w.Header().Get("Retry-After") == "" || w.Header().Get(NotLeaderHeader) != "" {
					t.Fatalf("503 headers %v: want Retry-After, and nothing of the refusals", w.Header())
				}
			}
			if n := tries.Load(); n < tc.minTries || n > tc.maxTries {
				t.Errorf("the leader saw %d tries, want %d to %d", n, tc.minTries, tc.maxTries)
			}
			if by, _ := forwardedBy.Load().(string); parseMark(by).by != "follower" {
				t.Errorf("%s = %q, want the follower's id", ForwardedByHeader, by)
			}
		})
	}
}

// TestForwardServesHereOnceThisInstanceWins: a request the forward loop holds while the
// leader steps down is served here once this instance wins, with the placeholders of that
// admission: this term's token and, with admission_times, when and until when it admitted.
func TestForwardServesHereOnceThisInstanceWins(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	cluster := etcdtest.Start(t, 1)
	const election = "wins-while-holding"
	var leader *testInstance
	var resign sync.Once
	leaderSide := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The leader has just let go: it refuses, and hands over.
		resign.Do(func() {
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_ = leader.election.Resign(ctx, time.Hour)
			}()
		})
		w.Header().Set(NotLeaderHeader, election)
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(leaderSide.Close)

	eps := cluster.Endpoints()
	primeElection(t, eps, election)
	leader = startInstanceAt(t, eps, "leader", leaderSide.URL, election, 3*time.Second, false)
	waitUntil(t, "the leader leads", func() bool { _, ok := leader.election.Check(); return ok })
	follower := startInstance(t, eps, "follower", election, 3*time.Second, false)
	waitUntil(t, "the follower knows the leader", func() bool { return follower.election.Term().Leader.ID == "leader" })

	hold := caddy.Duration(10 * time.Second)
	g := newGate(t, Gate{Election: election, Follower: FollowerForward, Hold: &hold, AdmissionTimes: true}, follower.election)
	if err := g.provisionForwarder(newLoadedContext(t), &App{InstanceID: "follower"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Cleanup() })

	r, _ := gatedRequest(http.MethodPost, "/write")
	w := httptest.NewRecorder()
	next := &recordingNext{}
	if err := g.ServeHTTP(w, r, next); err != nil || !next.ran {
		t.Fatalf("served here: %v, error %v; want the follower, now leader, to serve it", next.ran, err)
	}
	term := follower.election.Term()
	want := map[string]string{phIsLeader: "true", phID: "follower", phToken: fmt.Sprint(term.Token)}
	for key, v := range want {
		if next.placeholders[key] != v {
			t.Errorf("{%s} = %q, want %q", key, next.placeholders[key], v)
		}
	}
	admittedAt, err := time.Parse(time.RFC3339Nano, next.placeholders[phAdmittedAt])
	if err != nil {
		t.Errorf("{%s} = %q: %v", phAdmittedAt, next.placeholders[phAdmittedAt], err)
	}
	if deadline, err := time.Parse(time.RFC3339Nano, next.placeholders[phDeadline]); err != nil || !deadline.After(admittedAt) {
		t.Errorf("{%s} = %q (%v), want a time after {%s}", phDeadline, next.placeholders[phDeadline], err, phAdmittedAt)
	}
}

// waitUntil polls cond for up to 10s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
	}
}

// newLoadedContext is a context of a running (empty) Caddy config: reverse_proxy's
// Provision looks up the events app in it.
func newLoadedContext(t *testing.T) caddy.Context {
	t.Helper()
	if err := caddy.Load([]byte(`{"admin": {"disabled": true, "config": {"persist": false}}}`), true); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := caddy.NewContext(caddy.ActiveContext())
	t.Cleanup(func() {
		cancel()
		_ = caddy.Stop()
	})
	return ctx
}

// TestForwardOneHopAtMost: a follower in forward mode never sends a request to its own
// address, whether the leader record names this instance's id (a previous process of the
// instance whose lease has not run out) or its advertise address, and never forwards a
// request that arrived with a forwarding mark, forged or not. The control case shows that
// a plain request to a follower of another leader is forwarded.
func TestForwardOneHopAtMost(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	cluster := etcdtest.Start(t, 1)
	cases := []struct {
		name                 string
		leaderID, followerID string
		followerIsLeaderAddr bool   // the follower's own address is the one the leader record gives
		mark                 string // a ForwardedByHeader the client sets; empty for none
		wantForwarded        bool
		wantNotLeader        bool // the 503 carries NotLeaderHeader
	}{
		{"control_plain_request_to_a_follower_is_forwarded", "leader", "follower", false, "", true, false},
		{"record_with_this_instance_id", "twin", "twin", false, "", false, false},
		{"record_with_this_instance_address", "leader", "follower", true, "", false, false},
		{"request_that_came_marked", "leader", "follower", false, "some-peer", false, true},
		{"request_that_came_with_this_instance_mark", "leader", "follower", false, "follower", false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			election := "hop-" + tc.name
			var hits atomic.Int32
			var leader *testInstance
			var verified atomic.Bool
			leaderSide := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				hits.Add(1)
				// The mark binds the method and the request target as they arrive.
				m := parseMark(r.Header.Get(ForwardedByHeader))
				key, _ := leader.election.MarkKey(m.token)
				verified.Store(m.verify(key, r.Method, requestTarget(r), time.Now()))
				fmt.Fprint(w, "served")
			}))
			t.Cleanup(leaderSide.Close)

			eps := cluster.Endpoints()
			leader = startInstanceAt(t, eps, tc.leaderID, leaderSide.URL, election, 3*time.Second, false)
			waitUntil(t, "the leader leads", func() bool { _, ok := leader.election.Check(); return ok })
			follower := startInstance(t, eps, tc.followerID, election, 3*time.Second, false)
			// The follower has seen the key (its view of a record with its own id may also be
			// "no leader known").
			waitUntil(t, "the follower has seen the leader's key", func() bool {
				return follower.election.Term().Reason != "starting"
			})

			advertise := "http://" + tc.followerID + ".test:8080"
			if tc.followerIsLeaderAddr {
				advertise = leaderSide.URL
			}
			hold := caddy.Duration(200 * time.Millisecond)
			g := newGate(t, Gate{Election: election, Follower: FollowerForward, Hold: &hold}, follower.election)
			g.selfDial, _ = leaderDial(advertise)
			if err := g.provisionForwarder(newLoadedContext(t), &App{InstanceID: tc.followerID, Advertise: advertise}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = g.Cleanup() })

			r, _ := gatedRequest(http.MethodGet, "/write?b=2&a=1&x=%2F")
			if tc.mark != "" {
				r.Header.Set(ForwardedByHeader, tc.mark)
			}
			w := httptest.NewRecorder()
			next := &recordingNext{}
			err := g.ServeHTTP(w, r, next)
			if next.ran {
				t.Fatal("the follower served the request itself")
			}
			if tc.wantForwarded {
				if err != nil || w.Code != http.StatusOK || hits.Load() != 1 {
					t.Fatalf("got %d, error %v, %d arrivals at the leader; want 200 through one forward", w.Code, err, hits.Load())
				}
				if !verified.Load() {
					t.Error("the leader could not verify the mark of the forwarded request")
				}
				return
			}
			assertHandlerError(t, err, http.StatusServiceUnavailable)
			if n := hits.Load(); n != 0 {
				t.Errorf("the request was forwarded %d times, want never", n)
			}
			if w.Header().Get("Retry-After") == "" {
				t.Error("503 without Retry-After")
			}
			if got := w.Header().Get(NotLeaderHeader) != ""; got != tc.wantNotLeader {
				t.Errorf("%s set: %v, want %v", NotLeaderHeader, got, tc.wantNotLeader)
			}
		})
	}
}
