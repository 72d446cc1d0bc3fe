package caddyleader

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap/zaptest"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/etcdbackend"
	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
	"github.com/caddyleader/caddy-leader/internal/testkit/fleet"
)

// testInstance is one candidate with a clock that a test can move forward, as if the
// process had been paused.
type testInstance struct {
	id       string
	election *elector.Election
	skew     atomic.Int64
}

func (i *testInstance) now() time.Time { return time.Now().Add(time.Duration(i.skew.Load())) }

// startInstance starts a candidate. With skewable, it reads the instance's own clock, which
// a test can move forward; without, the production clock, as benchmarks want.
func startInstance(t testing.TB, endpoints []string, id, election string, ttl time.Duration, skewable bool) *testInstance {
	t.Helper()
	return startInstanceAt(t, endpoints, id, "http://"+id+".test:8080", election, ttl, skewable)
}

// startInstanceAt starts a candidate that advertises url.
func startInstanceAt(t testing.TB, endpoints []string, id, url, election string, ttl time.Duration, skewable bool) *testInstance {
	t.Helper()
	return startInstanceUnder(t, endpoints, "/gate-test/", id, url, election, ttl, skewable)
}

// startInstanceUnder starts a candidate that advertises url, with its elections under prefix.
func startInstanceUnder(t testing.TB, endpoints []string, prefix, id, url, election string, ttl time.Duration, skewable bool) *testInstance {
	t.Helper()
	inst := &testInstance{id: id}
	backend, err := etcdbackend.New(etcdbackend.Config{Endpoints: endpoints, Prefix: prefix, DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	cfg := elector.Config{
		ID: id, URL: url, TTL: ttl, DrainTimeout: 5 * time.Second,
		Backend: backend, Logger: zaptest.NewLogger(t).Named(id),
	}
	if skewable {
		cfg.Now = inst.now
	}
	_, es := fleet.StartCandidate(t, cfg, election)
	inst.election = es[0]
	return inst
}

// primeElection lets a short-lived candidate take election's first term and hand it over
// cleanly, so that the next winner proves by that acknowledgement that its predecessor
// stopped, rather than waiting out a ttl as the first winner of an election must. The
// primer stays, held off, as a follower.
func primeElection(t testing.TB, endpoints []string, election string) {
	t.Helper()
	p := startInstance(t, endpoints, "primer", election, time.Second, false)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, ok := p.election.Check(); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the primer did not lead")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.election.Resign(ctx, time.Hour); err != nil {
		t.Fatalf("primer's resign: %v", err)
	}
}

// leaderAndFollower starts two instances in a fresh election and returns them once one
// leads and the other knows it.
func leaderAndFollower(t testing.TB, endpoints []string, election string, skewable bool) (leader, follower *testInstance) {
	t.Helper()
	a := startInstance(t, endpoints, "a", election, 3*time.Second, skewable)
	b := startInstance(t, endpoints, "b", election, 3*time.Second, skewable)
	if i, _ := fleet.WaitAgreed(t, 10*time.Second, []*elector.Election{a.election, b.election}); i == 1 {
		return b, a
	}
	return a, b
}

func newGate(t testing.TB, g Gate, e *elector.Election) *Gate {
	t.Helper()
	g.setDefaults()
	if err := g.check(); err != nil {
		t.Fatal(err)
	}
	g.bind(e)
	return &g
}

// gatedRequest builds a request as Caddy's server hands it to handlers: with a replacer, the
// original request, the server and the request variables in its context.
func gatedRequest(method, target string) (*http.Request, *caddy.Replacer) {
	r := httptest.NewRequest(method, target, nil)
	repl := caddy.NewReplacer()
	ctx := context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl)
	ctx = context.WithValue(ctx, caddyhttp.OriginalRequestCtxKey, *r)
	ctx = context.WithValue(ctx, caddyhttp.ServerCtxKey, &caddyhttp.Server{})
	ctx = context.WithValue(ctx, caddyhttp.VarsCtxKey, map[string]any{
		caddyhttp.TrustedProxyVarKey: false,
		caddyhttp.ClientIPVarKey:     "192.0.2.1", // httptest's client address
	})
	return r.WithContext(ctx), repl
}

// recordingNext is the handler behind the gate: it notes that it ran and what the
// placeholders said at that point.
type recordingNext struct {
	ran          bool
	placeholders map[string]string
}

func (n *recordingNext) ServeHTTP(w http.ResponseWriter, r *http.Request) error {
	n.ran = true
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	n.placeholders = map[string]string{}
	for _, key := range []string{phElection, phIsLeader, phSelf, phID, phURL, phToken, phAdmittedAt, phDeadline} {
		v, _ := repl.GetString(key)
		n.placeholders[key] = v
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

func TestGate(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	cluster := etcdtest.Start(t, 1)
	leader, follower := leaderAndFollower(t, cluster.Endpoints(), "gate", true)
	token := leader.election.Term().Token

	t.Run("leader_admits_and_sets_placeholders", func(t *testing.T) {
		g := newGate(t, Gate{Election: "gate", AdmissionTimes: true}, leader.election)
		r, _ := gatedRequest(http.MethodPost, "/write")
		w := httptest.NewRecorder()
		next := &recordingNext{}
		before := time.Now()
		if err := g.ServeHTTP(w, r, next); err != nil {
			t.Fatal(err)
		}
		after := time.Now()
		if !next.ran {
			t.Fatal("the leader did not pass the request on")
		}
		// The admission's own clock read, and the term's deadline from it.
		admittedAt, err := time.Parse(time.RFC3339Nano, next.placeholders[phAdmittedAt])
		if err != nil || admittedAt.Before(before.Truncate(time.Microsecond)) || admittedAt.After(after) {
			t.Errorf("{%s} = %q (%v), want a time between %s and %s", phAdmittedAt, next.placeholders[phAdmittedAt], err, before, after)
		}
		deadline, err := time.Parse(time.RFC3339Nano, next.placeholders[phDeadline])
		if rem := leader.election.Term().Remaining(after); err != nil || !deadline.After(admittedAt) || deadline.Sub(admittedAt) > time.Duration(leader.election.Candidate().TTL()) {
			t.Errorf("{%s} = %q (%v), want after the admission and within a ttl of it (remaining now %s)", phDeadline, next.placeholders[phDeadline], err, rem)
		}
		want := map[string]string{
			phElection: "gate", phIsLeader: "true", phSelf: leader.id, phID: leader.id,
			phURL: "http://" + leader.id + ".test:8080", phToken: fmt.Sprint(token),
		}
		for k, v := range want {
			if next.placeholders[k] != v {
				t.Errorf("{%s} = %q, want %q", k, next.placeholders[k], v)
			}
		}
		if n := leader.election.InFlight(); n != 0 {
			t.Errorf("in flight after the request = %d", n)
		}
	})

	rejects := []struct {
		name       string
		gate       Gate
		wantStatus int
	}{
		{"follower_rejects_with_503_and_retry_after", Gate{Election: "gate"}, 503},
		{"follower_rejects_with_configured_status", Gate{Election: "gate", StatusCode: 421, RetryAfter: caddy.Duration(2500 * time.Millisecond)}, 421},
	}
	for _, tc := range rejects {
		t.Run(tc.name, func(t *testing.T) {
			g := newGate(t, tc.gate, follower.election)
			r, repl := gatedRequest(http.MethodPost, "/write")
			w := httptest.NewRecorder()
			next := &recordingNext{}
			err := g.ServeHTTP(w, r, next)
			assertHandlerError(t, err, tc.wantStatus)
			if next.ran {
				t.Fatal("a follower passed the request on")
			}
			wantRetry := fmt.Sprint(int((time.Duration(g.RetryAfter) + time.Second - 1) / time.Second))
			if got := w.Header().Get("Retry-After"); got != wantRetry {
				t.Errorf("Retry-After = %q, want %q", got, wantRetry)
			}
			if v, _ := repl.GetString(phIsLeader); v != "false" {
				t.Errorf("{http.leader.is_leader} = %q on a follower", v)
			}
			for _, key := range []string{phAdmittedAt, phDeadline} {
				if v, known := repl.GetString(key); !known || v != "" {
					t.Errorf("{%s} = %q (known %v) on a follower, want empty", key, v, known)
				}
			}
			if v, _ := repl.GetString(phID); v != leader.id {
				t.Errorf("{http.leader.id} = %q, want %q", v, leader.id)
			}
		})
	}

	for _, code := range []int{307, 308} {
		t.Run(fmt.Sprintf("follower_redirects_to_leader_preserving_method_with_%d", code), func(t *testing.T) {
			g := newGate(t, Gate{Election: "gate", Follower: FollowerRedirect, StatusCode: code}, follower.election)
			r, _ := gatedRequest(http.MethodPut, "/items/7?x=1&y=%20z")
			w := httptest.NewRecorder()
			if err := g.ServeHTTP(w, r, &recordingNext{}); err != nil {
				t.Fatal(err)
			}
			if w.Code != code {
				t.Fatalf("status = %d, want %d", w.Code, code)
			}
			want := "http://" + leader.id + ".test:8080/items/7?x=1&y=%20z"
			if got := w.Header().Get("Location"); got != want {
				t.Fatalf("Location = %q, want %q", got, want)
			}
		})
	}

	t.Run("redirect_uses_the_uri_before_rewrites", func(t *testing.T) {
		g := newGate(t, Gate{Election: "gate", Follower: FollowerRedirect}, follower.election)
		r, _ := gatedRequest(http.MethodPost, "/public/path")
		r.URL.Path, r.RequestURI = "/internal/path", "/internal/path" // as a rewrite would
		w := httptest.NewRecorder()
		if err := g.ServeHTTP(w, r, &recordingNext{}); err != nil {
			t.Fatal(err)
		}
		if got := w.Header().Get("Location"); got != "http://"+leader.id+".test:8080/public/path" {
			t.Fatalf("Location = %q", got)
		}
	})

	t.Run("leader_resumed_after_a_pause_past_its_lease_rejects_the_first_request", func(t *testing.T) {
		g := newGate(t, Gate{Election: "gate"}, leader.election)
		leader.skew.Store(int64(time.Minute)) // the clock jumps as after SIGSTOP
		defer leader.skew.Store(0)
		r, _ := gatedRequest(http.MethodPost, "/write")
		next := &recordingNext{}
		err := g.ServeHTTP(httptest.NewRecorder(), r, next)
		assertHandlerError(t, err, 503)
		if next.ran {
			t.Fatal("admitted on a lease whose deadline had passed")
		}
	})

	t.Run("matcher_matches_only_on_the_leader", func(t *testing.T) {
		for _, tc := range []struct {
			inst *testInstance
			want bool
		}{{leader, true}, {follower, false}} {
			m := &Matcher{Election: "gate", election: tc.inst.election, placeholders: new(placeholderCache)}
			r, repl := gatedRequest(http.MethodGet, "/")
			if got := m.Match(r); got != tc.want {
				t.Errorf("%s: Match = %v, want %v", tc.inst.id, got, tc.want)
			}
			if v, _ := repl.GetString(phIsLeader); v != fmt.Sprint(tc.want) {
				t.Errorf("%s: {http.leader.is_leader} = %q", tc.inst.id, v)
			}
			if v, _ := repl.GetString(phSelf); v != tc.inst.id {
				t.Errorf("%s: {http.leader.self} = %q", tc.inst.id, v)
			}
		}
	})
}

// TestGateDrainsBeforeHandover checks the handover order: once a resign starts, no new
// request is admitted, and the key is released only after the admitted ones finished.
func TestGateDrainsBeforeHandover(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	cluster := etcdtest.Start(t, 1)
	leader, follower := leaderAndFollower(t, cluster.Endpoints(), "drain", true)
	g := newGate(t, Gate{Election: "drain"}, leader.election)

	entered, release := make(chan struct{}), make(chan struct{})
	slow := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		close(entered)
		<-release
		return nil
	})
	served := make(chan error, 1)
	go func() {
		r, _ := gatedRequest(http.MethodPost, "/slow")
		served <- g.ServeHTTP(httptest.NewRecorder(), r, slow)
	}()
	<-entered

	resigned := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resigned <- leader.election.Resign(ctx, time.Minute)
	}()
	// Wait until the handover is under way: the leader no longer admits.
	for {
		if _, ok := leader.election.Check(); !ok {
			break
		}
		time.Sleep(time.Millisecond)
	}
	r, _ := gatedRequest(http.MethodPost, "/new")
	assertHandlerError(t, g.ServeHTTP(httptest.NewRecorder(), r, &recordingNext{}), 503)

	select {
	case err := <-resigned:
		t.Fatalf("resign finished (%v) while an admitted request was still in flight", err)
	case <-time.After(300 * time.Millisecond):
	}
	if !leader.election.Term().Holds() {
		t.Fatal("key released while an admitted request was still in flight")
	}
	if _, ok := follower.election.Check(); ok {
		t.Fatal("the follower leads while the old leader still drains")
	}
	close(release)
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	if err := <-resigned; err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, ok := follower.election.Check(); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the follower did not take over after the drain")
		}
		time.Sleep(time.Millisecond)
	}
}

func assertHandlerError(t *testing.T, err error, status int) {
	t.Helper()
	var he caddyhttp.HandlerError
	if !errors.As(err, &he) {
		t.Fatalf("error = %v, want a caddyhttp.HandlerError with status %d", err, status)
	}
	if he.StatusCode != status {
		t.Fatalf("status = %d, want %d", he.StatusCode, status)
	}
}

func TestGateCancelOnLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	cluster := etcdtest.Start(t, 1)
	for _, tc := range []struct {
		name         string
		cancelOnLoss bool
	}{
		{"on_cancels_admitted_requests_when_the_term_ends", true},
		{"off_leaves_admitted_requests_running", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			election := "cancel-" + fmt.Sprint(tc.cancelOnLoss)
			leader, _ := leaderAndFollower(t, cluster.Endpoints(), election, true)
			g := newGate(t, Gate{Election: election, CancelOnLoss: tc.cancelOnLoss}, leader.election)

			running := make(chan context.Context, 1)
			finish := make(chan struct{})
			handler := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
				running <- r.Context()
				<-finish
				return nil
			})
			served := make(chan error, 1)
			go func() {
				r, _ := gatedRequest(http.MethodPost, "/long")
				served <- g.ServeHTTP(httptest.NewRecorder(), r, handler)
			}()
			reqCtx := <-running
			admittedBy := leader.election.Term()

			// An operator deletes the key: the leader learns it was deposed.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if _, err := cluster.Client(t).Delete(ctx, "/gate-test/"+election); err != nil {
				t.Fatal(err)
			}
			if tc.cancelOnLoss {
				select {
				case <-reqCtx.Done():
				case <-time.After(5 * time.Second):
					t.Fatal("the admitted request's context was not cancelled when the term ended")
				}
			} else {
				select {
				case <-admittedBy.Context().Done():
				case <-time.After(5 * time.Second):
					t.Fatal("the term did not end after its key was deleted")
				}
				if reqCtx.Err() != nil {
					t.Fatal("cancel_on_loss is off, yet the request's context was cancelled")
				}
			}
			close(finish)
			if err := <-served; err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestSetTermPlaceholdersOverridesEarlierValues(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	cluster := etcdtest.Start(t, 1)
	leader, follower := leaderAndFollower(t, cluster.Endpoints(), "override", true)
	_, repl := gatedRequest(http.MethodPost, "/")
	// First seen on a follower (as a held request is), then served under a leader's term.
	new(placeholderCache).set(repl, follower.election.Term(), false)
	at := time.Now()
	new(placeholderCache).setAdmitted(repl, leader.election.Term(), at, true, true)
	want := map[string]string{
		phIsLeader: "true", phSelf: leader.id, phToken: fmt.Sprint(leader.election.Term().Token),
		phAdmittedAt: at.UTC().Format(time.RFC3339Nano),
	}
	for key, v := range want {
		if got, _ := repl.GetString(key); got != v {
			t.Errorf("{%s} = %q, want %q", key, got, v)
		}
	}
	if got, _ := repl.GetString(phDeadline); got == "" {
		t.Errorf("{%s} is empty", phDeadline)
	}
}
