package safety

import (
	"fmt"
	"math"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"
)

// Report is what the checker finds in the backend's log and the clients' log of one
// scenario. The rule it applies is written down in the README's "Safety model" section:
//
//   - A term is a fencing token. Its instance is the one that served most of its requests.
//   - Stale arrival: a request whose token is lower than one that already arrived.
//   - Wrong token: a request served by another instance than its token's.
//   - Double leadership: a request of an older term whose admission the old leader's gate
//     began (X-Gate-Entered, stamped just before leader_gate on the instance that served
//     it) after a newer term had already admitted a request and sent it on (X-Admitted-At,
//     stamped by the proxy after the gate). Both stamps are the same host's wall clock,
//     in nanoseconds; the first is a lower bound of that request's admission, the second
//     an upper bound of the newer term's first admission, so every request counted was
//     admitted by the old leader while the new one was already admitting.
//   - Late (in flight): a request of an older term that arrived after the newer term's
//     first arrival but is not double leadership: the old leader admitted it before the
//     new one admitted anything, and it was still on its way (the overlap of the two
//     terms' arrival intervals that in-flight requests explain).
type Report struct {
	Scenario   string
	Renews     bool           // the fault let renewals through (slow links): see safetyScenario.renews
	Title      string         // the table's name for it; empty: Scenario with spaces for underscores
	Requests   int            // client requests
	Statuses   map[int]int    // client outcomes by status; 0 is no answer
	Errors     int            // client requests not answered 200
	Terms      []TermSummary  // in token order
	Stale      int            // stale arrivals
	StaleWrong int            // stale arrivals that also carry another instance's token
	Wrong      int            // arrivals with another instance's token
	Double     int            // double leadership, by the rule above
	DoubleSpan time.Duration  // the longest time by which such a request's gate entry followed the newer term's first admission
	Late       int            // older-term arrivals after a newer term's first, in flight
	Overlap    time.Duration  // the longest stretch of such late arrivals past the newer term's first
	Unstamp    int            // arrivals without a token or without gate stamps (a harness fault)
	Problems   []string       // the first few offending arrivals, for the test's error
	Extra      map[string]int // scenario-specific counts, for the notes column
	// Shards, ShardsMoved and ShardTerms are set by CheckShards: the shards that requests
	// arrived for, those whose term changed after the fault, and the terms of all of them.
	Shards, ShardsMoved, ShardTerms int

	// Times relative to the fault (zero when there is none).
	OldLastAdmit time.Duration // the old term's last gate entry after the fault (negative: before)
	NoLeader     time.Duration // the longest time without a request arriving at the backend, from the fault to the end of the load
	Takeover     time.Duration // from the fault to the first arrival of a newer term; -1 if none
	Frozen       bool          // the old leader may have been frozen mid-request: stale arrivals are reported, not failed
	Notes        string
}

// TermSummary is one term as the backend saw it.
type TermSummary struct {
	Token       int64
	Instance    string
	Count       int
	First, Last time.Time // arrivals
	MinAdmitted time.Time // earliest X-Admitted-At of its own instance's requests
	LastEntered time.Time // latest X-Gate-Entered of its own instance's requests
}

func (s TermSummary) String() string { return fmt.Sprintf("%s:%d", s.Instance, s.Token) }

// Check applies the rule to the backend's log and the clients' outcomes. oldToken is
// the term that led when the fault began at faultAt; loadEnd is when the load stopped.
func Check(name string, results []Outcome, log []Arrival, oldToken int64, faultAt, loadEnd time.Time) Report {
	rep := Report{Scenario: name, Requests: len(results), Statuses: Summarize(results), Takeover: -1, Extra: map[string]int{}}
	for _, o := range results {
		if o.Status != http.StatusOK {
			rep.Errors++
		}
	}
	problem := rep.problem

	// Terms, and which instance each belongs to (the one that served most of its requests).
	byToken := map[int64]map[string]int{}
	for _, a := range log {
		if a.Token == 0 || a.Entered.IsZero() || a.Admitted.IsZero() {
			rep.Unstamp++
			problem("request %s (served by %q) arrived without a token or gate stamps", a.ReqID, a.ServedBy)
			continue
		}
		if byToken[a.Token] == nil {
			byToken[a.Token] = map[string]int{}
		}
		byToken[a.Token][a.ServedBy]++
	}
	owner := map[int64]string{}
	for token, servers := range byToken {
		best := ""
		for s, n := range servers {
			if best == "" || n > servers[best] || n == servers[best] && s < best {
				best = s
			}
		}
		owner[token] = best
	}
	terms := map[int64]*TermSummary{}
	for _, a := range log {
		if _, ok := owner[a.Token]; !ok || a.Entered.IsZero() || a.Admitted.IsZero() {
			continue
		}
		s := terms[a.Token]
		if s == nil {
			s = &TermSummary{Token: a.Token, Instance: owner[a.Token], First: a.At}
			terms[a.Token] = s
		}
		s.Count++
		s.Last = a.At
		if a.ServedBy != s.Instance {
			continue
		}
		if s.MinAdmitted.IsZero() || a.Admitted.Before(s.MinAdmitted) {
			s.MinAdmitted = a.Admitted
		}
		if a.Entered.After(s.LastEntered) {
			s.LastEntered = a.Entered
		}
	}
	tokens := make([]int64, 0, len(terms))
	for token := range terms {
		tokens = append(tokens, token)
	}
	slices.Sort(tokens)
	for _, token := range tokens {
		rep.Terms = append(rep.Terms, *terms[token])
	}
	// For each term, the earliest first arrival and the earliest admission of any newer one.
	firstAbove := map[int64]time.Time{}
	admittedAbove := map[int64]time.Time{}
	var first, admitted time.Time
	for i := len(tokens) - 1; i >= 0; i-- {
		firstAbove[tokens[i]], admittedAbove[tokens[i]] = first, admitted
		s := terms[tokens[i]]
		if first.IsZero() || s.First.Before(first) {
			first = s.First
		}
		if !s.MinAdmitted.IsZero() && (admitted.IsZero() || s.MinAdmitted.Before(admitted)) {
			admitted = s.MinAdmitted
		}
	}

	var highest int64
	for _, a := range log {
		if _, ok := terms[a.Token]; !ok {
			continue
		}
		if a.Token < highest {
			rep.Stale++
			if a.ServedBy != owner[a.Token] {
				rep.StaleWrong++
			}
			problem("stale arrival: request %s served by %s with token %d after token %d had arrived (arrived %s)",
				a.ReqID, a.ServedBy, a.Token, highest, sinceFault(a.At, faultAt))
		}
		highest = max(highest, a.Token)
		if a.ServedBy != owner[a.Token] {
			rep.Wrong++
			problem("wrong token: request %s served by %s with token %d, which is %s's term (gate entered %s)",
				a.ReqID, a.ServedBy, a.Token, owner[a.Token], sinceFault(a.Entered, faultAt))
			continue
		}
		if adm := admittedAbove[a.Token]; !adm.IsZero() && a.Entered.After(adm) {
			rep.Double++
			rep.DoubleSpan = max(rep.DoubleSpan, a.Entered.Sub(adm))
			problem("double leadership: %s admitted request %s under token %d; its gate began %s after a newer term had admitted a request",
				a.ServedBy, a.ReqID, a.Token, FmtDur(a.Entered.Sub(adm)))
			continue
		}
		if fa := firstAbove[a.Token]; !fa.IsZero() && a.At.After(fa) {
			rep.Late++
			rep.Overlap = max(rep.Overlap, a.At.Sub(fa))
		}
	}

	if faultAt.IsZero() {
		return rep
	}
	for _, token := range tokens {
		if token > oldToken {
			rep.Takeover = terms[token].First.Sub(faultAt)
			if old, ok := terms[oldToken]; ok {
				rep.OldLastAdmit = old.LastEntered.Sub(faultAt)
			}
			break
		}
	}
	rep.NoLeader = longestSilence(log, faultAt, loadEnd)
	return rep
}

// longestSilence is the longest stretch after the fault with no request arriving at the
// backend, counting from the last arrival before the fault and up to the end of the load.
func longestSilence(log []Arrival, faultAt, loadEnd time.Time) time.Duration {
	var at []time.Time
	for _, a := range log {
		if !a.At.After(loadEnd) {
			at = append(at, a.At)
		}
	}
	sort.Slice(at, func(i, j int) bool { return at[i].Before(at[j]) })
	var prev time.Time
	var longest time.Duration
	for _, t := range append(at, loadEnd) {
		if t.After(faultAt) && !prev.IsZero() {
			longest = max(longest, t.Sub(prev))
		}
		prev = t
	}
	return longest
}

// sinceFault renders t as the time since the fault, or as the time of day when there is
// no fault (a soak's faults are many).
func sinceFault(t, faultAt time.Time) string {
	if faultAt.IsZero() {
		return "at " + t.Format("15:04:05.000")
	}
	return FmtDur(t.Sub(faultAt)) + " after the fault"
}

// FmtDur renders d for the table: ms below a second, else seconds with two decimals. A
// difference with a zero time saturates to the smallest Duration, whose negation is
// itself: that is shown as "never" rather than recursing.
func FmtDur(d time.Duration) string {
	switch {
	case d == math.MinInt64 || d == math.MaxInt64:
		return "never"
	case d < 0:
		return "−" + FmtDur(-d)
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Round(time.Millisecond)/time.Millisecond)
	default:
		return fmt.Sprintf("%.2fs", d.Seconds())
	}
}

// Row renders the report as one line of the results table.
func (r Report) Row() string {
	title := r.Title
	if title == "" {
		title = strings.ReplaceAll(r.Scenario, "_", " ")
	}
	if r.Requests == 0 && len(r.Terms) == 0 { // a proof with its own measures, all in the notes
		return fmt.Sprintf("| %s | — | — | — | — | — | — | — | — | %s |", title, r.Notes)
	}
	var terms []string
	for _, s := range r.Terms {
		terms = append(terms, s.String())
	}
	if r.Shards > 0 {
		terms = []string{fmt.Sprintf("%d shards: %d moved (%d terms)", r.Shards, r.ShardsMoved, r.ShardTerms)}
	}
	stale := fmt.Sprint(r.Stale)
	switch {
	case r.StaleWrong == r.Stale && r.Stale > 0:
		stale += " (all with a wrong token)"
	case r.StaleWrong > 0:
		stale += fmt.Sprintf(" (%d with a wrong token)", r.StaleWrong)
	}
	if r.Frozen {
		stale += " (frozen)"
	}
	double := fmt.Sprint(r.Double)
	if r.Late > 0 {
		double += fmt.Sprintf(" (%d in flight, ≤%s)", r.Late, FmtDur(r.Overlap))
	}
	errs := fmt.Sprintf("%d of %d", r.Errors, r.Requests)
	if r.Errors > 0 {
		errs += " (" + FmtStatuses(r.Statuses, false) + ")"
	}
	dash := func(d time.Duration, ok bool) string {
		if !ok {
			return "—"
		}
		return FmtDur(d)
	}
	return fmt.Sprintf("| %s | %s | %d | %s | %s | %s | %s | %s | %s | %s |",
		title, strings.Join(terms, " → "), r.Wrong, stale, double,
		dash(r.OldLastAdmit, r.OldLastAdmit > 0), dash(r.NoLeader, r.NoLeader > 0), dash(r.Takeover, r.Takeover >= 0),
		errs, r.Notes)
}

// Table renders reports as the results table, after a newline.
func Table(reports []Report) string {
	var b strings.Builder
	b.WriteString("\n" + TableHeader + "\n")
	for _, r := range reports {
		b.WriteString(r.Row() + "\n")
	}
	return b.String()
}

// TableHeader is the results table's header, which Table begins with.
const TableHeader = "| scenario | terms (instance:token) | wrong token | stale arrivals | double leadership | old leader admitted until | longest time with no request served | first request of the new term | client errors | notes |\n" +
	"|---|---|---|---|---|---|---|---|---|---|"

// FmtStatuses renders counts by status as "503×12, no answer×1", with 200 only if ok.
func FmtStatuses(counts map[int]int, ok bool) string {
	var parts []string
	for _, status := range sortedKeys(counts) {
		if status == http.StatusOK && !ok {
			continue
		}
		name := fmt.Sprint(status)
		if status == 0 {
			name = "no answer"
		}
		parts = append(parts, fmt.Sprintf("%s×%d", name, counts[status]))
	}
	return strings.Join(parts, ", ")
}

func sortedKeys(m map[int]int) []int {
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// NoteDouble adds to rep's notes how long two terms admitted at once, if they did: the
// longest time by which an older term's admission followed a newer term's first.
func NoteDouble(rep *Report) {
	if rep.Double == 0 {
		return
	}
	if rep.Notes != "" {
		rep.Notes += "; "
	}
	rep.Notes += "two leaders for " + FmtDur(rep.DoubleSpan)
}
