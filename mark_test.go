package caddyleader

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
	"github.com/caddyleader/caddy-leader/internal/testkit/faultproxy"
)

func TestForwardMarkVerify(t *testing.T) {
	const key = "term-secret"
	now := time.Now()
	const uri = "/write?id=7&mode=a%20b"
	good := signMark("peer", 7, key, now, http.MethodPost, uri)
	cases := []struct {
		name        string
		header      string
		key         string
		method, uri string
		want        bool
	}{
		{"genuine_mark_verifies", good, key, http.MethodPost, uri, true},
		{"bare_instance_id_does_not", "peer", key, http.MethodPost, uri, false},
		{"mark_made_with_another_key_does_not", signMark("peer", 7, "guess", now, http.MethodPost, uri), key, http.MethodPost, uri, false},
		{"replayed_with_another_method", good, key, http.MethodDelete, uri, false},
		{"replayed_with_another_path", good, key, http.MethodPost, "/admin?id=7&mode=a%20b", false},
		{"replayed_with_another_query", good, key, http.MethodPost, "/write?id=8&mode=a%20b", false},
		{"replayed_without_the_query", good, key, http.MethodPost, "/write", false},
		{"replayed_with_a_parameter_added", good, key, http.MethodPost, uri + "&all=1", false},
		{"replayed_with_the_query_reordered", good, key, http.MethodPost, "/write?mode=a%20b&id=7", false},
		{"replayed_with_the_path_escaped_otherwise", good, key, http.MethodPost, "/%77rite?id=7&mode=a%20b", false},
		{"mark_with_the_token_changed_does_not", "peer; token=8" + good[len("peer; token=7"):], key, http.MethodPost, uri, false},
		{"mark_with_another_sender_does_not", "other" + good[len("peer"):], key, http.MethodPost, uri, false},
		{"stale_mark_does_not", signMark("peer", 7, key, now.Add(-2*maxMarkAge), http.MethodPost, uri), key, http.MethodPost, uri, false},
		{"mark_from_the_future_does_not", signMark("peer", 7, key, now.Add(2*maxMarkAge), http.MethodPost, uri), key, http.MethodPost, uri, false},
		{"mark_within_the_skew_verifies", signMark("peer", 7, key, now.Add(-maxMarkAge/2), http.MethodPost, uri), key, http.MethodPost, uri, true},
		{"garbage_does_not", "peer; token=7; at=x; mac=!!", key, http.MethodPost, uri, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := parseMark(tc.header).verify([]byte(tc.key), tc.method, tc.uri, now); got != tc.want {
				t.Fatalf("verify(%q) for %s %s = %v, want %v", tc.header, tc.method, tc.uri, got, tc.want)
			}
		})
	}
}

// TestRequestTarget: the receiving end MACs the request target as it came in the request
// line, and the sending end as its URL writes it; for what Go's transport sends, the two
// are the same string.
func TestRequestTarget(t *testing.T) {
	for _, target := range []string{"/", "/write", "/write?id=7&mode=a%20b", "/a%2Fb/%41?x=%2f&x=1", "/p?", "/caf%C3%A9?q=%E2%82%AC"} {
		t.Run(target, func(t *testing.T) {
			sent, err := http.NewRequest(http.MethodPost, "http://leader.test"+target, nil)
			if err != nil {
				t.Fatal(err)
			}
			onWire := sent.URL.RequestURI() // what the transport writes
			received := httptest.NewRequest(http.MethodPost, onWire, nil)
			if got := requestTarget(received); got != onWire {
				t.Errorf("received %q, sent %q", got, onWire)
			}
			if got := requestTarget(sent); got != onWire {
				t.Errorf("requestTarget of the sent request = %q, want %q", got, onWire)
			}
		})
	}
}

// markedRequest is a gated request to path carrying ForwardedByHeader set to mark.
func markedRequest(path, mark string) *http.Request {
	r, _ := gatedRequest(http.MethodPost, path)
	r.Header.Set(ForwardedByHeader, mark)
	// The original request (what the mark covers) carries it too, as Caddy's server has it.
	orig := r.Context().Value(caddyhttp.OriginalRequestCtxKey).(http.Request)
	orig.Header = r.Header.Clone()
	return r.WithContext(context.WithValue(r.Context(), caddyhttp.OriginalRequestCtxKey, orig))
}

// genuineMark is the mark a peer makes for inst's current term.
func genuineMark(inst *testInstance, path string) string {
	term := inst.election.Term()
	return signMark("peer", term.Token, term.Leader.MarkKey, time.Now(), http.MethodPost, path)
}

// forgedMarks are marks a client without access to etcd can make for inst's current term.
func forgedMarks(inst *testInstance) map[string]string {
	token := strconv.FormatInt(inst.election.Term().Token, 10)
	return map[string]string{
		"bare_id":      "peer",
		"bad_mac":      "peer; token=" + token + "; at=" + strconv.FormatInt(time.Now().UnixMilli(), 10) + "; mac=AAAA",
		"guessed_key":  signMark("peer", inst.election.Term().Token, "guess", time.Now(), http.MethodPost, "/forged"),
		"own_id_twice": inst.id,
	}
}

// serveMarked sends a marked request through g and reports whether the application ran
// and the error the gate returned.
func serveMarked(g *Gate, path, mark string) (bool, error) {
	next := &recordingNext{}
	err := g.ServeHTTP(httptest.NewRecorder(), markedRequest(path, mark), next)
	return next.ran, err
}

// slowRequest admits one request through g that runs until the returned func is called.
func slowRequest(t *testing.T, g *Gate) (finish func()) {
	t.Helper()
	entered, release := make(chan struct{}), make(chan struct{})
	served := make(chan error, 1)
	go func() {
		r, _ := gatedRequest(http.MethodPost, "/slow")
		served <- g.ServeHTTP(httptest.NewRecorder(), r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
			close(entered)
			<-release
			return nil
		}))
	}()
	select {
	case <-entered:
	case err := <-served:
		t.Fatalf("the slow request was not admitted: %v", err)
	}
	return func() {
		close(release)
		if err := <-served; err != nil {
			t.Error(err)
		}
	}
}

// TestForwardedMarkWhileSettling: a new holder whose predecessor has not yet stopped (its
// admitted request still runs) admits no marked request, forged or genuine; once the
// predecessor acknowledged, a genuine mark is admitted and a forged one is not honoured.
func TestForwardedMarkWhileSettling(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	cluster := etcdtest.Start(t, 1)
	const election = "mark-settling"
	old, next := leaderAndFollower(t, cluster.Endpoints(), election, false)
	gOld := newGate(t, Gate{Election: election}, old.election)
	gNext := newGate(t, Gate{Election: election, Hold: new(caddy.Duration)}, next.election)
	finish := slowRequest(t, gOld)

	// An operator deletes the key until the other instance takes it (the old leader
	// campaigns too and may win a round); the old leader's request keeps it from
	// acknowledging the end of its term, so the new holder settles.
	waitUntil(t, "the other instance holds the key, settling", func() bool {
		if term := next.election.Term(); term.Holds() {
			return term.Settling
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if old.election.Term().Holds() {
			if _, err := cluster.Client(t).Delete(ctx, "/gate-test/"+election); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(50 * time.Millisecond)
		return false
	})

	for name, mark := range forgedMarks(next) {
		if ran, _ := serveMarked(gNext, "/forged", mark); ran {
			t.Errorf("forged mark %s admitted while the term settles", name)
		}
	}
	if ran, err := serveMarked(gNext, "/genuine", genuineMark(next, "/genuine")); ran {
		t.Error("genuine forwarded request admitted while the term settles")
	} else {
		assertHandlerError(t, err, http.StatusServiceUnavailable)
	}

	finish()
	waitUntil(t, "the new holder settles", func() bool { _, ok := next.election.Check(); return ok })
	if ran, err := serveMarked(gNext, "/genuine", genuineMark(next, "/genuine")); !ran {
		t.Errorf("genuine forwarded request not admitted once settled: %v", err)
	}
}

// TestForwardedMarkWhileDraining: a leader that hands over admits no request with a forged
// mark, and forged marks arriving all along do not keep its drain going (its drain
// timeout here is far longer than the test).
func TestForwardedMarkWhileDraining(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	cluster := etcdtest.Start(t, 1)
	const election = "mark-draining"
	leader, _ := leaderAndFollower(t, cluster.Endpoints(), election, false)
	leader.election.Candidate().SetDrainTimeout(time.Hour)
	g := newGate(t, Gate{Election: election, Hold: new(caddy.Duration)}, leader.election)
	finish := slowRequest(t, g)
	forged := forgedMarks(leader)

	resigned := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		resigned <- leader.election.Resign(ctx, time.Minute)
	}()
	waitUntil(t, "the leader drains", func() bool { return leader.election.Term().Draining })

	var admitted atomic.Int32
	stop := make(chan struct{})
	sent := make(chan int)
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				sent <- n
				return
			default:
			}
			for _, mark := range forged {
				if ran, _ := serveMarked(g, "/forged", mark); ran {
					admitted.Add(1)
				}
				n++
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	finish()
	select {
	case err := <-resigned:
		if err != nil {
			t.Error(err)
		}
	case <-time.After(20 * time.Second):
		t.Error("forged marks kept the drain going")
	}
	close(stop)
	if n := <-sent; n == 0 {
		t.Fatal("no forged request was sent during the drain")
	}
	if n := admitted.Load(); n > 0 {
		t.Errorf("%d requests with a forged mark admitted during the drain", n)
	}
}

// TestFailedReleaseLeavesTheTermClosed: once a handover has drained and sends the release
// (which acknowledges the end of the term to the successor), the term admits nothing,
// forwarded requests included, and it stays so when the release gets no answer.
func TestFailedReleaseLeavesTheTermClosed(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	cluster := etcdtest.Start(t, 1)
	proxy, err := faultproxy.New(strings.TrimPrefix(cluster.Endpoint(0), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	const election = "mark-release"
	// A long lease, so that it is still valid when the release has timed out; the
	// election is primed so that the leader need not wait out that ttl as a first winner.
	primeElection(t, cluster.Endpoints(), election)
	leader := startInstance(t, []string{proxy.URL()}, "leader", election, 20*time.Second, false)
	waitUntil(t, "the leader leads", func() bool { _, ok := leader.election.Check(); return ok })
	follower := startInstance(t, cluster.Endpoints(), "follower", election, 3*time.Second, false)
	waitUntil(t, "the follower knows the leader", func() bool { return follower.election.Term().Leader.ID == "leader" })

	g := newGate(t, Gate{Election: election, Hold: new(caddy.Duration)}, leader.election)
	finish := slowRequest(t, g)
	resigned := make(chan error, 1)
	go func() { resigned <- leader.election.Resign(context.Background(), time.Minute) }()
	waitUntil(t, "the handover is draining", func() bool { return leader.election.Term().Draining })

	// The leader's link to etcd goes dark: its release cannot land, or its answer is lost.
	proxy.Blackhole()
	finish()
	select {
	case err := <-resigned:
		if err == nil {
			t.Fatal("the release succeeded through a cut link")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the release did not give up")
	}
	if !leader.election.Term().Holds() {
		t.Fatal("the leader let go of its term: the test did not exercise a failed release")
	}
	if ran, err := serveMarked(g, "/genuine", genuineMark(leader, "/genuine")); ran {
		t.Error("a genuine forwarded request was admitted after the release was sent")
	} else {
		assertHandlerError(t, err, http.StatusServiceUnavailable)
	}
	r, _ := gatedRequest(http.MethodPost, "/plain")
	if next := (&recordingNext{}); g.ServeHTTP(httptest.NewRecorder(), r, next) == nil || next.ran {
		t.Error("a plain request was admitted after the release was sent")
	}
}
