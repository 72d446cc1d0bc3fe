package statuspage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/caddyleader/caddy-leader/electionstatus"
	"github.com/caddyleader/caddy-leader/elector"
)

// Whether a candidate reaches the store, and its failsafe state, only the candidate itself
// knows for sure, and one cut off from the store cannot say so through the store: its
// registry entry simply runs out with its lease. So the page asks every other candidate's
// own page for its view of itself (?format=self, over the candidate's advertise URL, at
// the path this page is served at: a fleet shares one configuration). That answer asks the
// store nothing, so a peer cut off from the store still answers at once.
//
// The asking is cheap whatever the number of open pages: each page asks each peer at most
// once every peerRefresh, in the background, each question bounded by peerTimeout; a
// snapshot shows the latest answer and never waits for one. A peer that did not answer the
// latest question is shown unreachable.

// Timing of the questions to peers.
const (
	peerRefresh = 2 * time.Second
	peerTimeout = time.Second
	// peerAnswerLimit bounds the size of a peer's answer that is read.
	peerAnswerLimit = 1 << 20
	// goneKept is how long a candidate that left the registry stays on the page (as
	// gone, and still asked): long enough to see what became of an instance cut off from
	// the store, whose entry runs out with its lease.
	goneKept = 10 * time.Minute
)

// SelfView is an instance's view of itself, as ?format=self serves it: what it alone knows
// of each of its elections.
type SelfView struct {
	// Self is the instance's instance_id.
	Self string `json:"self"`
	// At is when the view was taken, by the instance's clock.
	At time.Time `json:"at"`
	// Elections are the instance's elections, by name.
	Elections map[string]SelfElection `json:"elections"`
}

// SelfElection is what an instance alone knows of one of its elections.
type SelfElection struct {
	// Role is the instance's role (see electionstatus.RoleOf).
	Role string `json:"role"`
	// Failsafe is its failsafe state; absent when failsafe is off.
	Failsafe *elector.FailsafeStatus `json:"failsafe,omitempty"`
	// LastContact is when the store last confirmed its lease.
	LastContact time.Time `json:"last_store_contact,omitzero"`
	// LeaseRemaining is how long its lease deadline is ahead, in seconds.
	LeaseRemaining float64 `json:"lease_remaining_seconds"`
	// StoreProblem says why it looks cut off from the store; empty while the store
	// confirms its lease.
	StoreProblem string `json:"store_problem,omitempty"`
}

// selfView is this instance's view of itself, from its own state alone.
func selfView(src electionSource, only []string, now time.Time) SelfView {
	v := SelfView{At: now, Elections: map[string]SelfElection{}}
	if src == nil {
		return v
	}
	for name, e := range src.RunningElections() {
		if !shown(only, name) {
			continue
		}
		st := electionstatus.Local(e, now)
		v.Self = st.Self
		v.Elections[name] = SelfElection{Role: st.Role, Failsafe: st.Failsafe, LastContact: st.LastContact,
			LeaseRemaining: st.LeaseRemaining, StoreProblem: storeProblem(Election{Election: st}, now)}
	}
	return v
}

// PeerState is what the page last heard from a peer about itself.
type PeerState struct {
	// Asked is when the latest answer, or the failure to get one, came; zero while the
	// first question is on its way.
	Asked time.Time `json:"asked,omitzero"`
	// Unreachable says why the peer did not answer the latest question; its view is then
	// the one it gave before, if any.
	Unreachable string `json:"unreachable,omitempty"`
	// View is the peer's latest answer; nil until it answered once.
	View *SelfView `json:"view,omitempty"`
	// Asking says a question is on its way: a fresher answer than this one is coming.
	Asking bool `json:"asking,omitempty"`
}

// peers asks other instances for their view of themselves and keeps the latest answers,
// one question at a time per peer. Its methods are safe for concurrent use.
type peers struct {
	client *http.Client
	mu     sync.Mutex
	byURL  map[string]*peer
}

type peer struct {
	state  PeerState
	asking bool
	since  time.Time // when the latest question was sent
}

func newPeers() *peers {
	return &peers{byURL: make(map[string]*peer), client: &http.Client{
		Timeout: peerTimeout,
		// A peer answers itself; a redirect is not its answer.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

// state returns what the page last heard from the instance id at the page address at
// (its advertise URL with this page's path), and asks again in the background if the
// latest question is older than peerRefresh. Its Asked is zero until the first answer.
func (p *peers) state(at, id string, now time.Time) PeerState {
	p.mu.Lock()
	defer p.mu.Unlock()
	pr, ok := p.byURL[at]
	if !ok {
		for other, o := range p.byURL { // forget the addresses no page has shown for long
			if !o.asking && now.Sub(o.since) > goneKept {
				delete(p.byURL, other)
			}
		}
		pr = new(peer)
		p.byURL[at] = pr
	}
	if !pr.asking && now.Sub(pr.since) >= peerRefresh {
		pr.asking, pr.since = true, now
		go p.ask(at, id, pr)
	}
	st := pr.state
	st.Asking = pr.asking
	return st
}

// ask puts one question to the peer and keeps its answer.
func (p *peers) ask(at, id string, pr *peer) {
	view, err := p.fetch(at, id)
	p.mu.Lock()
	defer p.mu.Unlock()
	pr.asking = false
	pr.state.Asked = time.Now()
	if err != nil {
		pr.state.Unreachable = err.Error()
		return
	}
	pr.state.Unreachable, pr.state.View = "", &view
}

func (p *peers) fetch(at, id string) (SelfView, error) {
	ctx, cancel := context.WithTimeout(context.Background(), peerTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, at+"?format=self", nil)
	if err != nil {
		return SelfView{}, err
	}
	resp, err := p.client.Do(req)
	if err != nil {
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err // the URL is on the page already
		}
		return SelfView{}, fmt.Errorf("no answer: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return SelfView{}, fmt.Errorf("its page answered %s", resp.Status)
	}
	var v SelfView
	if err := json.NewDecoder(io.LimitReader(resp.Body, peerAnswerLimit)).Decode(&v); err != nil {
		return SelfView{}, fmt.Errorf("its page answered no view of itself: %w", err)
	}
	if v.Self != id {
		return SelfView{}, fmt.Errorf("another instance answers there: %q", v.Self)
	}
	return v, nil
}

// peerAddress is the address of the page of the candidate at advertise URL base, at this
// page's path; empty when either is unknown.
func peerAddress(base, path string) string {
	if base == "" || path == "" {
		return ""
	}
	return strings.TrimSuffix(base, "/") + path
}

// keptCandidates remembers the candidates each election's registry listed, so that one
// that left it (its lease ran out: stopped, crashed, or cut off from the store) stays on
// the page for goneKept. Its methods are safe for concurrent use.
type keptCandidates struct {
	mu   sync.Mutex
	seen map[string]map[string]seenCandidate // election -> id -> last listing
}

type seenCandidate struct {
	c  electionstatus.Candidate
	at time.Time
}

// GoneCandidate is a candidate that the election's registry listed before, but no longer.
type GoneCandidate struct {
	electionstatus.Candidate
	// LastListed is when the registry last listed it.
	LastListed time.Time `json:"last_listed"`
}

// gone notes list, the election's candidates read at now, and returns those listed before
// but not now, for goneKept after they were last listed, sorted by id.
func (k *keptCandidates) gone(election string, list []electionstatus.Candidate, now time.Time) []GoneCandidate {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.seen == nil {
		k.seen = make(map[string]map[string]seenCandidate)
	}
	seen := k.seen[election]
	if seen == nil {
		seen = make(map[string]seenCandidate)
		k.seen[election] = seen
	}
	listed := make(map[string]bool, len(list))
	for _, c := range list {
		seen[c.ID], listed[c.ID] = seenCandidate{c: c, at: now}, true
	}
	var gone []GoneCandidate
	for id, s := range seen {
		switch {
		case listed[id]:
		case now.Sub(s.at) > goneKept:
			delete(seen, id)
		default:
			gone = append(gone, GoneCandidate{Candidate: s.c, LastListed: s.at})
		}
	}
	slices.SortFunc(gone, func(a, b GoneCandidate) int { return strings.Compare(a.ID, b.ID) })
	return gone
}

// shown reports whether a page limited to the elections only (every one, if empty) shows
// election name.
func shown(only []string, name string) bool {
	return len(only) == 0 || slices.Contains(only, name)
}
