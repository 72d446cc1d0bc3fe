package statuspage

import (
	"bytes"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"encoding/json"
	"html/template"
	"net/http"
	"slices"
	"strconv"
	"strings"
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
}

func (p *page) serve(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	switch {
	case q.Has("events"):
		return p.stream(w, r)
	case q.Get("format") == "json":
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		return json.NewEncoder(w).Encode(take(r.Context(), p.source(), p.only, p.kept))
	}
	var buf bytes.Buffer
	if err := pageTemplate.ExecuteTemplate(&buf, "page", p.view(take(r.Context(), p.source(), p.only, p.kept))); err != nil {
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
			if err := pageTemplate.ExecuteTemplate(&buf, "live", p.view(take(ctx, src, p.only, p.kept))); err != nil {
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
		if len(p.only) > 0 && !slices.Contains(p.only, name) {
			continue
		}
		t := e.Term()
		holdOff, leaving := e.HoldOff()
		lines = append(lines, strings.Join([]string{name, t.Leader.ID, t.Reason, strconv.FormatInt(t.Token, 10),
			boolText(t.Leading(now)), boolText(t.Holds()), boolText(holdOff > 0), boolText(leaving), boolText(e.Healthy()),
			boolText(e.Failsafe().Active), boolText(e.Candidate().LeaseRemaining() > 0)}, "\x00"))
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
}

type termRow struct {
	elector.PastTerm
	StartText, EndText, Lasted, GapBefore string
}

func (p *page) view(s Snapshot) view {
	v := view{Title: p.title, Admin: p.admin, AdminLink: p.adminLink, At: s.At.UTC().Format("2006-01-02 15:04:05 UTC"), Refresh: noScriptRefresh}
	for _, el := range s.Elections {
		v.Self = el.Self
		ev := electionView{Election: el, Name: el.Election.Election}
		if el.LeaderID != "" && !el.TermStart.IsZero() {
			ev.LedFor = roundDuration(s.At.Sub(el.TermStart)).String()
		}
		if !el.LastContact.IsZero() {
			ev.ContactAgo = roundDuration(s.At.Sub(el.LastContact)).String()
		}
		for _, c := range el.Candidates {
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
			ev.Candidates = append(ev.Candidates, cv)
		}
		current := elector.PastTerm{Token: el.Token, Leader: el.LeaderID, URL: el.LeaderURL, Start: el.TermStart}
		if el.LeaderID == "" {
			current.Token = 0
		}
		ev.Timeline = newTimeline(el.History, current, s.At)
		for i := len(el.History) - 1; i >= 0; i-- {
			t := el.History[i]
			row := termRow{PastTerm: t, StartText: t.Start.UTC().Format("15:04:05.0"), EndText: t.End.UTC().Format("15:04:05.0"),
				Lasted: roundDuration(t.End.Sub(t.Start)).String()}
			if i > 0 {
				switch gap := t.Start.Sub(el.History[i-1].End); {
				case gap >= 50*time.Millisecond:
					row.GapBefore = roundDuration(gap).String()
				case gap > 0:
					row.GapBefore = "under 0.1s"
				}
			}
			ev.Terms = append(ev.Terms, row)
		}
		v.Elections = append(v.Elections, ev)
	}
	return v
}

func boolText(b bool) string {
	if b {
		return "1"
	}
	return "0"
}
