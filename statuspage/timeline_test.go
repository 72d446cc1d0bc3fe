package statuspage

import (
	"slices"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/electionstatus"
	"github.com/caddyleader/caddy-leader/elector"
)

func TestTimeline(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	past := func(token int64, leader string, start, end time.Duration, ended string) elector.PastTerm {
		return elector.PastTerm{Token: token, Leader: leader, Start: ago(start), End: ago(end), Ended: ended}
	}
	for _, c := range []struct {
		name       string
		history    []elector.PastTerm
		current    elector.PastTerm
		lanes      []string
		classes    []string
		gaps       int
		lastGapEnd bool   // the last gap reaches now: no leader at present
		firstTitle string // the first bar's tooltip, when set
	}{
		{name: "first_term_only", current: elector.PastTerm{Token: 1, Leader: "a", Start: ago(10 * time.Second)},
			lanes: []string{"a"}, classes: []string{"term-current"}},
		{name: "handover_without_gap_then_crash_with_gap",
			history: []elector.PastTerm{past(1, "a", 50*time.Second, 30*time.Second, elector.EndedHandedOver),
				past(2, "b", 30*time.Second, 20*time.Second, elector.EndedDeadlinePassed)},
			current: elector.PastTerm{Token: 3, Leader: "a", Start: ago(15 * time.Second)},
			lanes:   []string{"a", "b"}, classes: []string{"term-handover", "term-crash", "term-current"}, gaps: 1},
		{name: "each_way_a_term_ends_has_its_class",
			history: []elector.PastTerm{past(1, "a", 60*time.Second, 55*time.Second, elector.EndedResigned),
				past(2, "b", 55*time.Second, 50*time.Second, elector.EndedTransferred),
				past(3, "a", 50*time.Second, 45*time.Second, elector.EndedKeyDeleted),
				past(4, "b", 45*time.Second, 40*time.Second, elector.EndedDeadlineMissed),
				past(5, "a", 40*time.Second, 35*time.Second, elector.EndedCrashed),
				past(6, "b", 35*time.Second, 30*time.Second, "a reason of a newer release")},
			current: elector.PastTerm{Token: 7, Leader: "a", Start: ago(30 * time.Second)},
			lanes:   []string{"a", "b"},
			classes: []string{"term-resign", "term-transfer", "term-deleted", "term-deadline", "term-crash", "term-ended", "term-current"}},
		{name: "no_leader_now",
			history: []elector.PastTerm{past(4, "c", 20*time.Second, 5*time.Second, elector.EndedDeadlinePassed)},
			lanes:   []string{"c"}, classes: []string{"term-crash"}, gaps: 1, lastGapEnd: true},
		{name: "current_term_already_in_history_is_drawn_once",
			history: []elector.PastTerm{past(5, "a", 20*time.Second, 5*time.Second, elector.EndedHandedOver)},
			current: elector.PastTerm{Token: 5, Leader: "a", Start: ago(20 * time.Second)},
			lanes:   []string{"a"}, classes: []string{"term-handover"}, gaps: 1, lastGapEnd: true},
		{name: "terms_older_than_the_window_are_left_out",
			history: []elector.PastTerm{past(1, "old", 3*time.Hour, 2*time.Hour, elector.EndedHandedOver)},
			current: elector.PastTerm{Token: 2, Leader: "a", Start: ago(90 * time.Minute)},
			lanes:   []string{"old", "a"}, classes: []string{"term-current"}},
		{name: "clock_skew_makes_no_negative_gap",
			history: []elector.PastTerm{past(1, "a", 30*time.Second, 10*time.Second, elector.EndedHandedOver)},
			current: elector.PastTerm{Token: 2, Leader: "b", Start: ago(11 * time.Second)},
			lanes:   []string{"a", "b"}, classes: []string{"term-handover", "term-current"}},
		{name: "term_never_seen_by_its_successor_is_drawn_at_its_end_under_an_unknown_leader",
			history: []elector.PastTerm{{Token: 4, End: ago(20 * time.Second), Ended: elector.EndedHandedOver, Successor: "b"}},
			current: elector.PastTerm{Token: 5, Leader: "b", Start: ago(19 * time.Second)},
			lanes:   []string{"unknown", "b"}, classes: []string{"term-handover", "term-current"}, gaps: 1,
			firstTitle: "term 4: unknown, start unknown, to 03:03:45 UTC, handed over; next: b"},
	} {
		t.Run(c.name, func(t *testing.T) {
			tl := newTimeline(c.history, c.current, now)
			var lanes, classes []string
			for _, l := range tl.Lanes {
				lanes = append(lanes, l.ID)
			}
			for _, b := range tl.Terms {
				classes = append(classes, b.Class)
				if b.X < tl.PlotLeft || b.X+b.W > tl.Width {
					t.Errorf("term %d: bar %.1f+%.1f outside the plot [%.1f, %.1f]", b.Token, b.X, b.W, tl.PlotLeft, tl.Width)
				}
			}
			if c.firstTitle != "" && tl.Terms[0].Title != c.firstTitle {
				t.Errorf("first bar's title = %q, want %q", tl.Terms[0].Title, c.firstTitle)
			}
			if !slices.Equal(lanes, c.lanes) {
				t.Errorf("lanes = %q, want %q", lanes, c.lanes)
			}
			if !slices.Equal(classes, c.classes) {
				t.Errorf("term classes = %q, want %q", classes, c.classes)
			}
			if len(tl.Gaps) != c.gaps {
				t.Fatalf("%d gaps (%+v), want %d", len(tl.Gaps), tl.Gaps, c.gaps)
			}
			if c.lastGapEnd {
				g := tl.Gaps[len(tl.Gaps)-1]
				if right := tl.PlotLeft + plotWidth; g.X+g.W < right-0.01 {
					t.Errorf("the last gap ends at %.1f, want it to reach now (%.1f)", g.X+g.W, right)
				}
			}
			if len(tl.Ticks) == 0 || tl.Ticks[len(tl.Ticks)-1].Label != now.Format("15:04:05") {
				t.Errorf("ticks %+v do not end at now", tl.Ticks)
			}
		})
	}
}

// TestCrashOutageCountsFromLastHeartbeat: a crashed leader served nothing after its last
// heartbeat, which its successor saw a TTL before it saw the term over (End). The red band
// and the ended-terms table count the time without a leader from that heartbeat to the
// successor's first admission, not from End.
func TestCrashOutageCountsFromLastHeartbeat(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	end := now.Add(-40 * time.Second)
	crashed := elector.PastTerm{Token: 6, Leader: "c2", Start: now.Add(-3 * time.Minute), End: end, Successor: "c0", SuccessorToken: 7,
		LastHeartbeat: end.Add(-9 * time.Second), SuccessorAdmitted: end.Add(30 * time.Millisecond)}
	next := elector.PastTerm{Token: 7, Leader: "c0", Start: end.Add(10 * time.Millisecond), End: now.Add(-10 * time.Second),
		Ended: elector.EndedHandedOver, Successor: "c1", SuccessorToken: 8, SuccessorAdmitted: now.Add(-10 * time.Second)}
	for _, c := range []struct {
		name, ended, want string
	}{
		{name: "crashed", ended: elector.EndedCrashed, want: "9s"},
		{name: "deadline_passed_release_before_reasons", ended: elector.EndedDeadlinePassed, want: "9s"},
		{name: "handed_over_counts_from_its_end", ended: elector.EndedHandedOver, want: "under 0.1s"},
	} {
		t.Run(c.name, func(t *testing.T) {
			crashed.Ended = c.ended
			s := Snapshot{At: now, Elections: []Election{{
				Election: electionstatus.Election{Election: "main", Self: "c1", LeaderID: "c1", Token: 8, TermStart: now.Add(-10 * time.Second)},
				History:  []elector.PastTerm{crashed, next},
			}}}
			v := (&page{}).view(s)
			rows := v.Elections[0].Terms // newest first
			if got := rows[1].GapAfter; got != c.want {
				t.Errorf("the table says no leader for %q after term 6; want %q", got, c.want)
			}
			var titles []string
			for _, g := range v.Elections[0].Timeline.Gaps {
				titles = append(titles, g.Title)
			}
			if c.want != "under 0.1s" && !slices.Contains(titles, "no leader for "+c.want+" after term 6") {
				t.Errorf("the timeline's gaps say %q; want no leader for %s after term 6", titles, c.want)
			}
		})
	}
	// Right after the crash, its successor is the current term: the crashed term's own row
	// says what the crash cost, without its successor's first admission on record.
	t.Run("successor_leads_now", func(t *testing.T) {
		crashed := crashed
		crashed.Ended, crashed.SuccessorAdmitted = elector.EndedCrashed, time.Time{}
		s := Snapshot{At: now, Elections: []Election{{
			Election: electionstatus.Election{Election: "main", Self: "c0", LeaderID: "c0", Token: 7, TermStart: end.Add(10 * time.Millisecond)},
			History:  []elector.PastTerm{crashed},
		}}}
		if got := (&page{}).view(s).Elections[0].Terms[0].GapAfter; got != "9s" {
			t.Errorf("right after the crash the table says no leader for %q after term 6; want 9s", got)
		}
	})
}
