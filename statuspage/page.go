package statuspage

import (
	"bytes"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/caddyleader/caddy-leader/electionstatus"
	"github.com/caddyleader/caddy-leader/elector"
)

// The page is one HTML document with its style and script inlined (both embedded in the
// binary): nothing is fetched from elsewhere, and the path it is mounted at does not
// matter, since everything else it asks for is the same path with a query:
//
//	?events        Server-Sent Events: the live part of the page, rendered again
//	?format=json   the Snapshot as JSON
//
//	?format=self   this instance's view of itself, which the pages of its peers ask for
//	               (see peers.go)
//
// The live part is rendered on the server, so the page without script is the same page,
// refreshed by a <noscript> meta refresh instead of the event stream.

//go:embed assets
var assets embed.FS

var pageTemplate = template.Must(template.New("").Funcs(template.FuncMap{
	"style":   func() template.CSS { return template.CSS(asset("page.css")) },
	"script":  func() template.JS { return template.JS(asset("page.js")) },
	"endings": func() []ending { return endings },
}).ParseFS(assets, "assets/page.html"))

// contentSecurityPolicy lets the page run its own inline style and script (by their hashes)
// and talk to its own origin, and nothing else: no other script, style, frame or resource,
// and no site may frame it.
var contentSecurityPolicy = "default-src 'none'; style-src '" + sha256Source(asset("page.css")) + "'; script-src '" +
	sha256Source(asset("page.js")) + "'; connect-src 'self'; img-src data:; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"

// sha256Source is a CSP hash source for an inline element's text.
func sha256Source(text string) string {
	sum := sha256.Sum256([]byte(text))
	return "sha256-" + base64.StdEncoding.EncodeToString(sum[:])
}

func asset(name string) string {
	b, err := assets.ReadFile("assets/" + name)
	if err != nil {
		panic(err) // embedded at build time
	}
	return string(b)
}

// Timing of the live updates.
const (
	// watchInterval spaces the looks at this instance's own state, which cost no store
	// request: a change of term is on the page within this much of this instance seeing it.
	watchInterval = 100 * time.Millisecond
	// refreshInterval spaces the snapshots taken without a change, which read the store:
	// a new or departed candidate, and the clocks on the page, lag by this much at most.
	refreshInterval = time.Second
	// streamLifetime ends an event stream after a while; the browser reconnects at once.
	// It keeps a stream from outliving the configuration that served it by much.
	streamLifetime = 5 * time.Minute
	// noScriptRefresh is how often the page reloads itself when scripts are off.
	noScriptRefresh = 5
)

// page serves the status page; the handler module and the admin API each have one.
type page struct {
	title string
	// admin adds the resign and transfer buttons, which post to the admin API.
	admin bool
	// source gives the elections of this process: the leader app. A nil source or one
	// that returns nil shows none.
	source func() electionSource
	// only limits the page to these elections; empty shows every one.
	only []string
	// adminLink is the URL of the admin API's page, linked from this one; empty for none.
	adminLink string
	// done ends the event streams: the handler's configuration was unloaded.
	done <-chan struct{}
	// kept is the history last read, shown while the store does not answer.
	kept *keptHistory
	// candidates remembers the candidates the registries listed, and peers asks the
	// other candidates for their view of themselves (see peers.go); nil for neither.
	candidates *keptCandidates
	peers      *peers
}

// servedAt is the path at which a leader_status handler of this process last served its
// page: the admin API's page asks the peers' pages there, since the fleet shares one
// configuration and the admin API's own path is not on the peers' advertise URLs.
var servedAt atomic.Pointer[string]

// peerPath is the path at which the peers' pages are asked for this request; empty when
// unknown (the admin API's page, before any handler served).
func (p *page) peerPath(r *http.Request) string {
	if !p.admin {
		path := r.URL.Path
		servedAt.Store(&path)
		return path
	}
	if path := servedAt.Load(); path != nil {
		return *path
	}
	return ""
}

func (p *page) serve(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	switch {
	case q.Has("events"):
		return p.stream(w, r)
	case q.Get("format") == "json":
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		return json.NewEncoder(w).Encode(p.snapshot(r.Context(), p.source(), p.peerPath(r)))
	case q.Get("format") == "self":
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		return json.NewEncoder(w).Encode(selfView(p.source(), p.only, time.Now()))
	}
	var buf bytes.Buffer
	if err := pageTemplate.ExecuteTemplate(&buf, "page", p.view(p.snapshot(r.Context(), p.source(), p.peerPath(r)))); err != nil {
		return err
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Security-Policy", contentSecurityPolicy)
	w.Header().Set("X-Frame-Options", "DENY")
	_, err := w.Write(buf.Bytes())
	return err
}

// stream sends the live part of the page as an event whenever this instance's view of an
// election changes, and every refreshInterval besides, until the client goes, the
// configuration is unloaded or streamLifetime passes.
func (p *page) stream(w http.ResponseWriter, r *http.Request) error {
	rc := http.NewResponseController(w)
	// The admin listener has a read timeout that would end the stream; a failure only
	// means the browser reconnects sooner.
	_ = rc.SetReadDeadline(time.Time{})
	_ = rc.SetWriteDeadline(time.Time{})
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if _, err := w.Write([]byte("retry: 1000\n\n")); err != nil {
		return nil
	}

	ctx, cancel := context.WithTimeout(r.Context(), streamLifetime)
	defer cancel()
	path := p.peerPath(r)
	watch := time.NewTicker(watchInterval)
	defer watch.Stop()
	var seen string
	var sent time.Time
	for {
		now := time.Now()
		src := p.source()
		if state := p.localState(src, now); state != seen || now.Sub(sent) >= refreshInterval {
			seen, sent = state, now
			var buf bytes.Buffer
			if err := pageTemplate.ExecuteTemplate(&buf, "live", p.view(p.snapshot(ctx, src, path))); err != nil {
				return err
			}
			if err := writeEvent(w, "update", buf.Bytes()); err != nil || rc.Flush() != nil {
				return nil // the client went
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-p.done:
			return nil
		case <-watch.C:
		}
	}
}

// writeEvent writes one Server-Sent Event; every line of data goes on a data: line. A
// carriage return would end a line of the stream too, so none is sent (in HTML it is only
// white space).
func writeEvent(w http.ResponseWriter, name string, data []byte) error {
	var b bytes.Buffer
	b.WriteString("event: " + name + "\n")
	for line := range bytes.Lines(bytes.ReplaceAll(data, []byte("\r"), nil)) {
		b.WriteString("data: ")
		b.Write(bytes.TrimSuffix(line, []byte("\n")))
		b.WriteByte('\n')
	}
	b.WriteByte('\n')
	_, err := w.Write(b.Bytes())
	return err
}

// localState sums up what this instance knows of its elections without asking the store:
// when it changes, the page is due for a new snapshot.
func (p *page) localState(src electionSource, now time.Time) string {
	if src == nil {
		return ""
	}
	var lines []string // in name order, so that the same state reads the same
	for name, e := range src.RunningElections() {
		if !shown(p.only, name) {
			continue
		}
		t := e.Term()
		holdOff, leaving := e.HoldOff()
		lines = append(lines, strings.Join([]string{name, t.Leader.ID, t.Reason, strconv.FormatInt(t.Token, 10),
			boolText(t.Leading(now)), boolText(t.Holds()), boolText(holdOff > 0), boolText(leaving), boolText(e.Healthy()),
			boolText(e.Failsafe().Active), boolText(e.Candidate().LeaseRemaining() > 0)}, "\x00"))
	}
	if sets, ok := src.(shardSource); ok {
		// Who owns how many shards, summed: a move shows as soon as this instance sees it.
		for _, set := range sets.RunningShardSets(context.Background()) {
			if !shown(p.only, set.Set) {
				continue
			}
			line := []string{set.Set, strconv.Itoa(set.Leaderless), strconv.Itoa(set.Moving)}
			for _, c := range set.Candidates {
				line = append(line, c.ID, strconv.Itoa(c.Owned), boolText(c.Healthy))
			}
			lines = append(lines, strings.Join(line, "\x00"))
		}
	}
	// Each job's runs as this instance knows them, without a store request.
	for _, j := range jobsShown(context.Background(), src, p.only, false) {
		lines = append(lines, jobState(j))
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// view is what the template draws.
type view struct {
	Title     string
	Admin     bool
	AdminLink string
	At        string
	Refresh   int
	Self      string
	Elections []electionView
	ShardSets []shardSetView
	Unknown   []string
	Jobs      []jobView
}

// shardSetView is a shard set with the candidates gone from it lately, each with since
// when, as an election's section shows them.
type shardSetView struct {
	electionstatus.ShardSet
	Gone []goneRow
}

type goneRow struct {
	GoneCandidate
	Since string
}

type electionView struct {
	Election
	// Name is the election's name.
	Name string
	// LedFor is how long the current term has lasted.
	LedFor string
	// ContactAgo is how long ago the store last confirmed this instance's lease.
	ContactAgo string
	Candidates []candidateView
	Timeline   timeline
	// Terms are the ended terms, newest first.
	Terms []termRow
}

type candidateView struct {
	electionstatus.Candidate
	Role    string
	HoldOff string
	Self    bool
	// Gone says since when the registry no longer lists the candidate; empty while it does.
	Gone string
	// Failsafe and Store are the candidate's failsafe state and its link to the store, as
	// it says itself; StoreState is reachable, unreachable (it says so, or it did not
	// answer) or unknown, and Asked when it last answered, for another candidate.
	Failsafe, Store, StoreState, Asked string
}

type termRow struct {
	elector.PastTerm
	StartText, EndText, Lasted, GapAfter string
}

func (p *page) view(s Snapshot) view {
	v := view{Title: p.title, Admin: p.admin, AdminLink: p.adminLink, At: s.At.UTC().Format("2006-01-02 15:04:05 UTC"), Refresh: noScriptRefresh,
		Unknown: s.Unknown}
	for _, set := range s.ShardSets {
		sv := shardSetView{ShardSet: set}
		for _, g := range s.ShardSetsGone[set.Set] {
			sv.Gone = append(sv.Gone, goneRow{GoneCandidate: g, Since: goneSince(g.LastListed)})
		}
		v.ShardSets = append(v.ShardSets, sv)
	}
	for _, el := range s.Elections {
		v.Self = el.Self
		ev := electionView{Election: el, Name: el.Election.Election}
		if el.LeaderID != "" && !el.TermStart.IsZero() {
			ev.LedFor = roundDuration(s.At.Sub(el.TermStart)).String()
		}
		if !el.LastContact.IsZero() {
			ev.ContactAgo = roundDuration(s.At.Sub(el.LastContact)).String()
		}
		candidates := slices.Clone(el.Candidates)
		gone := make(map[string]time.Time, len(el.Gone))
		for _, g := range el.Gone {
			candidates, gone[g.ID] = append(candidates, g.Candidate), g.LastListed
		}
		for _, c := range candidates {
			cv := candidateView{Candidate: c, Role: "follower", Self: c.ID == el.Self}
			switch {
			case c.ID == el.LeaderID:
				cv.Role = "leader"
			case c.Leaving:
				cv.Role = "leaving"
			case c.Priority == 0:
				cv.Role = "never leads"
			}
			if c.HoldOffUntil.After(s.At) {
				cv.HoldOff = roundDuration(c.HoldOffUntil.Sub(s.At)).String()
			}
			if at, ok := gone[c.ID]; ok {
				cv.Role, cv.HoldOff = "gone", ""
				cv.Gone = goneSince(at)
			}
			cv.Failsafe, cv.Store, cv.StoreState, cv.Asked = candidateLink(el, c.ID, s.At)
			ev.Candidates = append(ev.Candidates, cv)
		}
		current := elector.PastTerm{Token: el.Token, Leader: el.LeaderID, URL: el.LeaderURL, Start: el.TermStart}
		if el.LeaderID == "" {
			current.Token = 0
		}
		ev.Timeline = newTimeline(el.History, current, s.At)
		for i := len(el.History) - 1; i >= 0; i-- {
			t := el.History[i]
			row := termRow{PastTerm: t, StartText: elector.Unknown, EndText: t.End.UTC().Format("15:04:05.0"), Lasted: elector.Unknown}
			if row.Leader == "" {
				row.Leader = elector.Unknown
			}
			lasted, known := t.Lasted()
			if known {
				row.StartText, row.Lasted = t.Start.UTC().Format("15:04:05.0"), roundDuration(lasted).String()
			}
			row.GapAfter = gapAfter(el, i)
			ev.Terms = append(ev.Terms, row)
		}
		v.Elections = append(v.Elections, ev)
	}
	if v.Self == "" && len(s.ShardSets) > 0 {
		v.Self = s.ShardSets[0].Self
	}
	for _, j := range s.Jobs {
		v.Jobs = append(v.Jobs, newJobView(j, s))
	}
	return v
}

// gapAfter is how long election el had no leader after its ended term i, as the table
// shows it: from the term's end (a crashed leader's last heartbeat) to its successor's
// first admission, or, where the history does not say, its successor's start. So a crash
// shows its cost on its own row as soon as its successor leads. Empty when not known.
func gapAfter(el Election, i int) string {
	from, until := leaderlessAfter(el.History[i])
	if until.IsZero() {
		switch next := i + 1; {
		case next < len(el.History):
			if _, known := el.History[next].Lasted(); known {
				until = el.History[next].Start
			}
		case el.Token == el.History[i].SuccessorToken && !el.TermStart.IsZero():
			until = el.TermStart // its successor leads now
		}
	}
	switch gap := until.Sub(from); {
	case until.IsZero():
		return ""
	case gap >= 50*time.Millisecond:
		return roundDuration(gap).String()
	case gap > 0:
		return "under 0.1s"
	}
	return ""
}

// candidateLink says, for candidate id of election el, its failsafe state and its link to
// the store as it says itself: this instance's own state for itself, the latest answer of
// its page for another (see peers.go).
func candidateLink(el Election, id string, now time.Time) (failsafe, store, state, asked string) {
	own := SelfElection{Failsafe: el.Failsafe, LastContact: el.LastContact, StoreProblem: el.StoreProblem}
	if id != el.Self {
		p, ok := el.Peers[id]
		switch {
		case !ok:
			return "unknown", "unknown: not asked (no advertise URL, or no page path known yet)", "unknown", ""
		case p.Asked.IsZero():
			return "asking…", "asking…", "unknown", ""
		case p.Unreachable != "":
			return "unknown", "unreachable: " + p.Unreachable, "unreachable", p.Asked.UTC().Format("15:04:05")
		}
		own, ok = p.View.Elections[el.Election.Election]
		asked = p.Asked.UTC().Format("15:04:05")
		if !ok {
			return "unknown", "unknown: its page does not show this election", "unknown", asked
		}
	}
	failsafe = "off"
	switch fs := own.Failsafe; {
	case fs == nil:
	case fs.Active:
		failsafe = "active since " + fs.Since.UTC().Format("15:04:05") + ": " + fs.Cause
	case fs.Confirming != 0:
		failsafe = fmt.Sprintf("keeping term %d alive for its leader", fs.Confirming)
	default:
		failsafe = "on, idle"
	}
	switch {
	case own.StoreProblem != "" && id == el.Self:
		return failsafe, "unreachable: " + own.StoreProblem, "unreachable", asked
	case own.StoreProblem != "":
		return failsafe, "unreachable, it says: “" + own.StoreProblem + "”", "unreachable", asked
	}
	if id == el.Self {
		return failsafe, "reachable, lease confirmed " + roundDuration(now.Sub(own.LastContact)).String() + " ago", "reachable", asked
	}
	// A peer's answer is of the moment it was taken, by its clock; aged against now it
	// would read as the peer's present state, which it may no longer be.
	p := el.Peers[id]
	store = fmt.Sprintf("answer taken %s (%s ago): reachable, lease confirmed %s before it", asked,
		roundDuration(now.Sub(p.Asked)), roundDuration(p.View.At.Sub(own.LastContact)))
	if now.Sub(p.Asked) > peerRefresh {
		// Older than the page asks: it says what the peer was, not what it is.
		state, store = "unknown", "old "+store
		if p.Asking {
			store = "asking… (" + store + ")"
		}
		return failsafe, store, state, asked
	}
	return failsafe, store, "reachable", asked
}

// goneSince says of a candidate the registry last listed at that it is gone, and why it may be.
func goneSince(at time.Time) string {
	return "not in the registry since " + at.UTC().Format("15:04:05") + " (its lease ran out: stopped, crashed or cut off from the store)"
}

func boolText(b bool) string {
	if b {
		return "1"
	}
	return "0"
}
