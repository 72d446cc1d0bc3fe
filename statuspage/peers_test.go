package statuspage

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/electionstatus"
	"github.com/caddyleader/caddy-leader/elector"
)

// TestCandidateLink: every candidate's failsafe state and link to the store, as the page
// says them: this instance's own for itself, its peers' own words for them, and plainly
// unreachable for a peer that did not answer.
func TestCandidateLink(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	answeredAt := func(asked time.Time, asking bool, e SelfElection) map[string]PeerState {
		return map[string]PeerState{"c2": {Asked: asked, Asking: asking, View: &SelfView{Self: "c2", At: asked.Add(-100 * time.Millisecond),
			Elections: map[string]SelfElection{"main": e}}}}
	}
	answered := func(e SelfElection) map[string]PeerState { return answeredAt(now, false, e) }
	reaching := SelfElection{LastContact: now.Add(-34*time.Second - 500*time.Millisecond)}
	for _, c := range []struct {
		name                      string
		id                        string
		el                        Election
		failsafe, store, wantText string
	}{
		{name: "itself_reaching_the_store", id: "c1",
			el:       Election{Election: electionstatus.Election{LastContact: now.Add(-time.Second)}},
			failsafe: "off", store: "reachable", wantText: "lease confirmed 1s ago"},
		{name: "itself_cut_off", id: "c1",
			el:       Election{Election: electionstatus.Election{Failsafe: &elector.FailsafeStatus{Enabled: true}}, StoreProblem: "cannot reach the store: x"},
			failsafe: "on, idle", store: "unreachable", wantText: "cannot reach the store: x"},
		{name: "a_peer_that_says_it_reaches_the_store", id: "c2",
			el:       Election{Peers: answered(SelfElection{LastContact: now.Add(-2 * time.Second), Failsafe: &elector.FailsafeStatus{Enabled: true, Confirming: 9}})},
			failsafe: "keeping term 9 alive for its leader", store: "reachable", wantText: "answer taken 03:04:05 (0s ago): reachable, lease confirmed 1.9s before it"},
		// A cached answer is of its moment: never aged against now as the peer's state.
		{name: "a_peer_whose_answer_is_old_and_asked_again", id: "c2",
			el:       Election{Peers: answeredAt(now.Add(-34*time.Second), true, reaching)},
			failsafe: "off", store: "unknown", wantText: "asking… (old answer taken 03:03:31 (34s ago): reachable, lease confirmed 400ms before it)"},
		{name: "a_peer_whose_answer_is_old", id: "c2",
			el:       Election{Peers: answeredAt(now.Add(-10*time.Minute), false, reaching)},
			failsafe: "off", store: "unknown", wantText: "old answer taken 02:54:05 (10m0s ago)"},
		{name: "a_peer_that_says_it_is_cut_off", id: "c2",
			el: Election{Peers: answered(SelfElection{StoreProblem: "cannot reach the store: it last confirmed this instance's lease 3s ago",
				Failsafe: &elector.FailsafeStatus{Enabled: true, Active: true, Since: now, Cause: "lease lost"}})},
			failsafe: "active since 03:04:05: lease lost", store: "unreachable", wantText: "last confirmed this instance's lease 3s ago"},
		{name: "a_peer_that_does_not_answer", id: "c2",
			el:       Election{Peers: map[string]PeerState{"c2": {Asked: now, Unreachable: "no answer: connection refused"}}},
			failsafe: "unknown", store: "unreachable", wantText: "connection refused"},
		{name: "a_peer_not_answered_yet", id: "c2",
			el:       Election{Peers: map[string]PeerState{"c2": {}}},
			failsafe: "asking…", store: "unknown", wantText: "asking"},
		{name: "a_peer_not_asked", id: "c2", el: Election{},
			failsafe: "unknown", store: "unknown", wantText: "not asked"},
		{name: "a_peer_whose_page_shows_other_elections", id: "c2",
			el:       Election{Peers: map[string]PeerState{"c2": {Asked: now, View: &SelfView{Self: "c2"}}}},
			failsafe: "unknown", store: "unknown", wantText: "does not show this election"},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.el.Self, c.el.Election.Election = "c1", "main"
			failsafe, store, state, _ := candidateLink(c.el, c.id, now)
			if failsafe != c.failsafe || state != c.store || !strings.Contains(store, c.wantText) {
				t.Errorf("candidateLink = %q, %q (%s); want %q, %s, with %q", failsafe, store, state, c.failsafe, c.store, c.wantText)
			}
		})
	}
}

// TestPeersAsk asks real HTTP servers on loopback the way the page asks its peers.
func TestPeersAsk(t *testing.T) {
	var asked atomic.Int64
	view := SelfView{Self: "c2", Elections: map[string]SelfElection{"main": {Role: "follower", StoreProblem: "cut"}}}
	peer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		if r.URL.Path != "/status" || r.URL.RawQuery != "format=self" {
			http.NotFound(w, r)
			return
		}
		_ = json.NewEncoder(w).Encode(view)
	}))
	defer peer.Close()
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close() // nobody listens there any more

	for _, c := range []struct {
		name, at, id, wantErr string
	}{
		{name: "a_peer_answers_for_itself", at: peer.URL + "/status", id: "c2"},
		{name: "another_instance_at_that_address", at: peer.URL + "/status", id: "c3", wantErr: `another instance answers there: "c2"`},
		{name: "no_page_at_that_path", at: peer.URL + "/elsewhere", id: "c2", wantErr: "404"},
		{name: "nobody_listens", at: gone.URL + "/status", id: "c2", wantErr: "no answer"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := newPeers().fetch(c.at, c.id)
			switch {
			case c.wantErr == "" && (err != nil || got.Elections["main"].StoreProblem != "cut"):
				t.Errorf("fetch = %+v, %v; want the peer's view", got, err)
			case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)):
				t.Errorf("fetch error %v, want one with %q", err, c.wantErr)
			}
		})
	}

	t.Run("one_question_per_peer_per_refresh", func(t *testing.T) {
		p := newPeers()
		at, start := peer.URL+"/status", time.Now()
		before := asked.Load()
		if st := p.state(at, "c2", start); !st.Asked.IsZero() {
			t.Fatalf("an answer before the first question: %+v", st)
		}
		p.state(at, "c2", start) // while the first is on its way: no second question
		waitAnswered(t, p, at)
		p.state(at, "c2", start.Add(peerRefresh/2)) // answered lately: nothing asked
		if n := asked.Load() - before; n != 1 {
			t.Fatalf("%d questions, want 1", n)
		}
		if st := p.state(at, "c2", start.Add(peerRefresh)); st.View == nil || st.Unreachable != "" {
			t.Fatalf("state after the answer = %+v", st)
		}
		waitAnswered(t, p, at)
		if n := asked.Load() - before; n != 2 {
			t.Fatalf("%d questions after a refresh's time, want 2", n)
		}
	})
}

// waitAnswered waits until no question to the peer at at is on its way.
func waitAnswered(t *testing.T, p *peers, at string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		p.mu.Lock()
		asking := p.byURL[at].asking
		p.mu.Unlock()
		if !asking {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the question never came back")
		}
	}
}

// TestKeptCandidates: a candidate that leaves the registry stays on the page, as gone, for
// goneKept, and is forgotten after; one listed again is no longer gone.
func TestKeptCandidates(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	list := func(ids ...string) []electionstatus.Candidate {
		var l []electionstatus.Candidate
		for _, id := range ids {
			l = append(l, electionstatus.Candidate{ID: id})
		}
		return l
	}
	var k keptCandidates
	for _, c := range []struct {
		name     string
		election string
		listed   []electionstatus.Candidate
		after    time.Duration
		gone     string
	}{
		{"all_listed", "main", list("c0", "c1", "c2"), 0, ""},
		{"one_left", "main", list("c0", "c1"), time.Second, "c2@03:04:05"},
		{"elections_are_kept_apart", "jobs", list("c0"), 2 * time.Second, ""},
		{"still_shown_within_goneKept", "main", list("c0"), goneKept, "c1@03:04:06 c2@03:04:05"},
		{"listed_again", "main", list("c0", "c2"), goneKept + time.Second, "c1@03:04:06"},
		{"forgotten_after_goneKept", "main", list("c0", "c2"), goneKept + 2*time.Second, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			var got []string
			for _, g := range k.gone(c.election, c.listed, now.Add(c.after)) {
				got = append(got, g.ID+"@"+g.LastListed.Format("15:04:05"))
			}
			if strings.Join(got, " ") != c.gone {
				t.Errorf("gone = %q, want %q", strings.Join(got, " "), c.gone)
			}
		})
	}
}
