package statuspage

import (
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
)

// The timeline is drawn on the server as SVG, so that it needs no script: one lane per
// instance that led, a bar per term, a red band over every leaderless gap.

// timelineWindow is how far back the timeline reaches at most; timelineMinSpan is the
// shortest span it shows, so that a young election's first seconds do not fill the width.
const (
	timelineWindow  = time.Hour
	timelineMinSpan = time.Minute
)

// Geometry of the picture, in SVG user units (the page scales it to its width).
const (
	laneLabelWidth = 110.0
	plotWidth      = 860.0
	laneHeight     = 24.0
	barHeight      = 16.0
	axisHeight     = 22.0
)

// timeline is the picture of an election's terms over a window that ends now.
type timeline struct {
	Width, Height float64
	PlotLeft      float64
	Lanes         []lane
	Terms         []termBar
	Gaps          []gapBar
	Ticks         []tick
}

// lane is the row of one instance that led.
type lane struct {
	ID string
	Y  float64 // the top of its bars
}

// termBar is one term: a bar from its start to its end (now, for the current term), and
// a mark at its end whose class says how it ended.
type termBar struct {
	Token      int64
	X, Y, W    float64
	Class      string // term-current, or the class of how it ended (see endings)
	Ended      string // how it ended (elector.Ended*); empty for the current term
	Label      string // the token, when the bar is wide enough to hold it
	Title      string // the tooltip: who, when, how it ended
	EndX, EndY float64
}

// gapBar is a time without a leader, across every lane.
type gapBar struct {
	X, W  float64
	Title string
}

// tick is a time on the axis.
type tick struct {
	X      float64
	Label  string
	Anchor string // the label's text-anchor: the first starts at its tick, the last ends there
}

// span is one term as the timeline sees it, recorded or current.
type span struct {
	token      int64
	leader     string
	url        string
	start, end time.Time // end is zero for the current term
	ended      string
	successor  string
	// startUnknown: the record does not say when the term began (start is then its end).
	startUnknown bool
	// leaderless is when the time without a leader after this term began, and admitted
	// when the next term first admitted (zero if unknown: the next term's start stands in).
	leaderless, admitted time.Time
}

// leaderlessAfter is when the time without a leader after ended term p began, and when it
// ended, if the history says (zero otherwise). A term that crashed served nothing after its
// leader's last heartbeat, which its successor saw up to a TTL before End: the outage
// counts from there.
func leaderlessAfter(p elector.PastTerm) (from, until time.Time) {
	from = p.End
	if endingClass(p.Ended) == "term-crash" && !p.LastHeartbeat.IsZero() && p.LastHeartbeat.Before(from) {
		from = p.LastHeartbeat
	}
	return from, p.SuccessorAdmitted
}

// newTimeline lays out the terms of history (oldest first, as the store keeps them) and
// the current term (token 0 when no leader is known) over the window that ends at now.
// Clocks: a term's start is its leader's, its end its successor's, so a gap between two
// instances' clocks can shift a bar by as much; a negative gap is no gap.
func newTimeline(history []elector.PastTerm, current elector.PastTerm, now time.Time) timeline {
	var spans []span
	seen := make(map[int64]bool)
	for _, p := range history {
		from, until := leaderlessAfter(p)
		s := span{token: p.Token, leader: p.Leader, url: p.URL, start: p.Start, end: p.End, ended: p.Ended,
			successor: p.Successor, leaderless: from, admitted: until}
		if s.leader == "" {
			s.leader = elector.Unknown
		}
		if _, known := p.Lasted(); !known {
			// Drawn as its end alone: where it began is not known.
			s.start, s.startUnknown = p.End, true
		}
		spans = append(spans, s)
		seen[p.Token] = true
	}
	if current.Token != 0 && !seen[current.Token] {
		spans = append(spans, span{token: current.Token, leader: current.Leader, url: current.URL, start: current.Start})
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].token < spans[j].token })

	from := now.Add(-timelineMinSpan)
	for _, s := range spans {
		if !s.start.IsZero() && s.start.Before(from) {
			from = s.start
		}
	}
	if earliest := now.Add(-timelineWindow); from.Before(earliest) {
		from = earliest
	}
	from = from.Add(-now.Sub(from) / 50) // a little room before the first bar
	total := now.Sub(from)
	x := func(t time.Time) float64 {
		switch {
		case t.Before(from):
			t = from
		case t.After(now):
			t = now
		}
		return laneLabelWidth + plotWidth*float64(t.Sub(from))/float64(total)
	}

	tl := timeline{Width: laneLabelWidth + plotWidth + 10, PlotLeft: laneLabelWidth}
	laneOf := make(map[string]float64)
	for _, s := range spans {
		if _, ok := laneOf[s.leader]; !ok {
			y := 6 + float64(len(tl.Lanes))*laneHeight
			laneOf[s.leader] = y
			tl.Lanes = append(tl.Lanes, lane{ID: s.leader, Y: y})
		}
	}
	tl.Height = 6 + float64(max(len(tl.Lanes), 1))*laneHeight + axisHeight

	for i, s := range spans {
		end := s.end
		if end.IsZero() {
			end = now
		}
		if end.Before(from) {
			continue
		}
		bar := termBar{Token: s.token, X: x(s.start), Y: laneOf[s.leader], Title: termTitle(s, now), Ended: s.ended}
		bar.W = max(x(end)-bar.X, 2)
		bar.EndX, bar.EndY = bar.X+bar.W, bar.Y-2
		bar.Class = "term-current"
		if !s.end.IsZero() {
			bar.Class = endingClass(s.ended)
		}
		if bar.W >= 30 {
			bar.Label = fmt.Sprintf("#%d", s.token)
		}
		tl.Terms = append(tl.Terms, bar)

		// The gap after this term: until the next one began, or until now if none did.
		if s.end.IsZero() {
			continue
		}
		next := now
		switch {
		case i+1 < len(spans) && !s.admitted.IsZero():
			next = s.admitted
		case i+1 < len(spans) && spans[i+1].startUnknown:
			continue // whether a gap came before it is not known either
		case i+1 < len(spans):
			next = spans[i+1].start
		}
		if gap := next.Sub(s.leaderless); gap > 0 && next.After(from) {
			g := gapBar{X: x(s.leaderless), Title: fmt.Sprintf("no leader for %s after term %d", roundDuration(gap), s.token)}
			if i+1 == len(spans) {
				g.Title = fmt.Sprintf("no leader since term %d ended, %s ago", s.token, roundDuration(gap))
			}
			g.W = max(x(next)-g.X, 2)
			tl.Gaps = append(tl.Gaps, g)
		}
	}

	const ticks = 5
	for i := 0; i <= ticks; i++ {
		t := from.Add(total * time.Duration(i) / ticks)
		anchor := "middle"
		switch i {
		case 0:
			anchor = "start"
		case ticks:
			anchor = "end"
		}
		tl.Ticks = append(tl.Ticks, tick{X: x(t), Label: t.UTC().Format("15:04:05"), Anchor: anchor})
	}
	return tl
}

// ending is one way a term can end, as the timeline draws it and its legend names it.
type ending struct {
	Class, Label string
	// ended lists the elector.Ended* values drawn so.
	ended []string
}

// endings are the ways a term can end, in the legend's order. A value this page does not
// know (written by a newer release) is drawn as term-ended.
var endings = []ending{
	{"term-handover", "handed over (shutdown, reload)", []string{elector.EndedHandedOver}},
	{"term-resign", "resigned", []string{elector.EndedResigned}},
	{"term-transfer", "transferred", []string{elector.EndedTransferred}},
	{"term-deleted", "key deleted by an operator", []string{elector.EndedKeyDeleted}},
	{"term-deadline", "missed its deadline (store slow or unreachable)", []string{elector.EndedDeadlineMissed}},
	{"term-crash", "crashed (no word: killed, hung or cut off)", []string{elector.EndedCrashed, elector.EndedDeadlinePassed}},
}

// endingClass is the class of a term bar that ended as ended says.
func endingClass(ended string) string {
	for _, e := range endings {
		if slices.Contains(e.ended, ended) {
			return e.Class
		}
	}
	return "term-ended"
}

// termTitle is the tooltip of a term's bar.
func termTitle(s span, now time.Time) string {
	leader := s.leader
	if s.url != "" {
		leader += " (" + s.url + ")"
	}
	if s.end.IsZero() {
		return fmt.Sprintf("term %d: %s, leading since %s UTC (%s)", s.token, leader, s.start.UTC().Format("15:04:05"), roundDuration(now.Sub(s.start)))
	}
	if s.startUnknown {
		return fmt.Sprintf("term %d: %s, start unknown, to %s UTC, %s; next: %s", s.token, leader,
			s.end.UTC().Format("15:04:05"), s.ended, s.successor)
	}
	return fmt.Sprintf("term %d: %s, %s to %s UTC (%s), %s; next: %s", s.token, leader, s.start.UTC().Format("15:04:05"),
		s.end.UTC().Format("15:04:05"), roundDuration(s.end.Sub(s.start)), s.ended, s.successor)
}

// roundDuration rounds d for people: tenths of a second under a minute, seconds above.
func roundDuration(d time.Duration) time.Duration {
	if d < time.Minute {
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Second)
}
