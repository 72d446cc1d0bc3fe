package statuspage

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/electionstatus"
	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/jobs"
)

// snapshotOf is a snapshot of one election "main" seen by c1, led by c0.
func snapshotOf(at time.Time, problem string) Snapshot {
	return Snapshot{At: at, Elections: []Election{{
		Election: electionstatus.Election{
			Election: "main", Self: "c1", Role: "follower", LeaderID: "c0", LeaderURL: "http://127.0.0.1:8001", Token: 7,
			TermStart: at.Add(-90 * time.Second), LeaseRemaining: 1.5, LastContact: at.Add(-time.Second), Healthy: true, Priority: 1,
			Candidates: []electionstatus.Candidate{
				{ID: "c0", URL: "http://127.0.0.1:8001", Healthy: true, Priority: 1},
				{ID: "c1", URL: "http://127.0.0.1:8002", Healthy: true, Priority: 1, HoldOffUntil: at.Add(5 * time.Second)},
				{ID: "c2", URL: "http://127.0.0.1:8003", Healthy: true},
			},
		},
		History: []elector.PastTerm{{Token: 6, Leader: "c2", Start: at.Add(-3 * time.Minute), End: at.Add(-92 * time.Second),
			Ended: elector.EndedDeadlinePassed, Successor: "c0", SuccessorToken: 7}},
		StoreProblem: problem,
	}}}
}

func TestPageRenders(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, c := range []struct {
		name      string
		page      page
		problem   string
		want      []string
		wantNot   []string
		transfers int
		// peers adds the peers' answers: c0 says it is cut off, c3 is gone and does not
		// answer.
		peers bool
		// shards adds a shard set "rooms" of 16 shards, 2 of them on the move.
		shards bool
		// jobs adds the jobs "report" (every 1m under "main", last run failed) and
		// "sweep" (on the set "rooms", this instance owning 2 of its 3 shards).
		jobs bool
	}{
		{name: "handler_page_is_read_only", page: page{title: "Fleet"},
			want:    []string{`<b data-leader>c0</b>`, `data-token>7<`, "1m30s", `data-term="6"`, `data-term="7"`, "deadline passed", "5s left", "never leads", `class="gap"`},
			wantNot: []string{"<form", "/resign", "/transfer", "data-admin-link"}},
		{name: "admin_page_has_the_buttons", page: page{title: "Fleet", admin: true},
			want: []string{`action="/leader/main/resign"`, `action="/leader/main/transfer?to=c1"`}, wantNot: []string{"to=c0", "to=c2"}, transfers: 1},
		{name: "store_problem_is_said_plainly", page: page{title: "Fleet"}, problem: "cannot reach the store: reading the candidates failed: context deadline exceeded",
			want: []string{`role="alert"`, "cannot reach the store: reading the candidates failed", `<span class="bad">unreachable</span>`}},
		{name: "admin_link", page: page{title: "Fleet", adminLink: "http://127.0.0.1:2019/leader/status"},
			want: []string{`<a href="http://127.0.0.1:2019/leader/status" data-admin-link>`}},
		{name: "every_candidate_says_how_it_reaches_the_store", page: page{title: "Fleet"}, peers: true,
			want: []string{`data-store="reachable"`, "reachable, lease confirmed 1s ago", `data-store="unreachable"`,
				"unreachable, it says: “cannot reach the store: lease ran out”", "active since 03:04:01: lease lost",
				"unreachable: no answer: connection refused", `<tr data-candidate="c3" class="gone">`, "not in the registry since 03:03:05"}},
		{name: "shard_sets_are_summed", page: page{title: "Fleet"}, shards: true,
			want:    []string{`data-shard-set="rooms"`, `data-shards>16<`, `data-moving>2 `, `<tr data-shard-candidate="c1"><td>c1 (this one)</td><td data-owned>6</td><td>5</td>`},
			wantNot: []string{`data-election="rooms.`}},
		{name: "no_jobs_no_section", page: page{title: "Fleet"},
			wantNot: []string{"data-jobs", "<h2>Jobs</h2>"}},
		{name: "an_elections_job_shows_its_runs", page: page{title: "Fleet"}, jobs: true,
			want: []string{"data-jobs", `<tr data-job="report">`, "every 1m0s", "election main", `data-job-runs>c0, its leader<`,
				"slot Jan 2 03:03:00 by c0 (token 7)", `<span class="bad">slot Jan 2 03:03:00 by c0: failed in 1.5s: status 500</span>`,
				"Jan 2 03:05:00", `data-job-missed><span class="bad">2</span>`}},
		{name: "a_shard_sets_job_is_summed", page: page{title: "Fleet"}, jobs: true,
			want: []string{`<tr data-job="sweep">`, "shard set rooms", "this instance for the 2 of 3 shards it owns",
				"last result of each shard: ok ×2, timeout ×1", "running here: slot Jan 2 03:04:00, attempt 2, token 12"},
			wantNot: []string{"rooms.0", "rooms.1"}}, // one row for the set, none per shard
	} {
		t.Run(c.name, func(t *testing.T) {
			snap := snapshotOf(at, c.problem)
			if c.shards {
				snap.ShardSets = []electionstatus.ShardSet{{Set: "rooms", Shards: 16, Self: "c1", Moving: 2,
					Owners: map[string]int{"c0": 5, "c1": 6, "c2": 5},
					Candidates: []electionstatus.ShardCandidate{
						{ID: "c0", Priority: 1, Healthy: true, Preferred: 6, Owned: 5},
						{ID: "c1", Priority: 1, Healthy: true, Preferred: 5, Owned: 6},
						{ID: "c2", Priority: 1, Healthy: true, Preferred: 5, Owned: 5},
					}}}
			}
			if c.jobs {
				snap.Jobs = testJobs(at)
			}
			if c.peers {
				el := &snap.Elections[0]
				el.Peers = map[string]PeerState{
					"c0": {Asked: at, View: &SelfView{Self: "c0", Elections: map[string]SelfElection{"main": {
						StoreProblem: "cannot reach the store: lease ran out", Failsafe: &elector.FailsafeStatus{Enabled: true, Active: true, Since: at.Add(-4 * time.Second), Cause: "lease lost"}}}}},
					"c3": {Asked: at, Unreachable: "no answer: connection refused"},
				}
				el.Gone = []GoneCandidate{{Candidate: electionstatus.Candidate{ID: "c3", URL: "http://127.0.0.1:8004", Priority: 1}, LastListed: at.Add(-time.Minute)}}
			}
			var b bytes.Buffer
			if err := pageTemplate.ExecuteTemplate(&b, "page", c.page.view(snap)); err != nil {
				t.Fatal(err)
			}
			html := b.String()
			for _, w := range c.want {
				if !strings.Contains(html, w) {
					t.Errorf("the page lacks %q", w)
				}
			}
			for _, w := range c.wantNot {
				if strings.Contains(html, w) {
					t.Errorf("the page has %q", w)
				}
			}
			if n := strings.Count(html, "data-transfer="); n != c.transfers {
				t.Errorf("%d transfer buttons, want %d", n, c.transfers)
			}
			// Self-contained: nothing is loaded from anywhere (the icon is a data: URL; the
			// other URLs are links and the candidates' addresses as text).
			if m := regexp.MustCompile(`(?i)<(script|link|img|iframe)[^>]+(src|href)="[^d]`).FindString(html); m != "" {
				t.Errorf("the page loads an outside resource: %s", m)
			}
		})
	}
}

// testJobs are the jobs of TestPageRenders's jobs cases, as of at.
func testJobs(at time.Time) []jobs.Listing {
	slot := at.Truncate(time.Minute).Add(-time.Minute)
	mark := func(token int64, by, result string) *jobs.Mark {
		return &jobs.Mark{Slot: slot, Token: token, By: by, At: slot.Add(time.Second), Result: result, Took: 1500 * time.Millisecond}
	}
	failed := mark(7, "c0", jobs.ResultFailed)
	failed.Error = "status 500"
	shard := func(n int, leading bool, token int64, result string) jobs.Status {
		return jobs.Status{Job: "sweep", Election: fmt.Sprintf("rooms.%d", n), Shard: n, Leading: leading, Next: slot.Add(2 * time.Minute),
			Record: &jobs.Record{Started: mark(token, "c1", ""), Finished: mark(token, "c1", result)}}
	}
	sweeping := shard(2, true, 12, jobs.ResultTimeout)
	sweeping.Running = &jobs.Run{Job: "sweep", Slot: slot.Add(time.Minute), Attempt: 2, Token: 12}
	return []jobs.Listing{
		{Job: "report", Election: "main", Schedule: "every 1m0s", Request: "POST http://127.0.0.1:9000/report",
			Leads: []jobs.Status{{Job: "report", Election: "main", Shard: -1, Next: slot.Add(2 * time.Minute),
				Record: &jobs.Record{Started: mark(7, "c0", ""), Finished: failed, MissedSlots: 2}}}},
		{Job: "sweep", ShardSet: "rooms", Schedule: "every 1m0s", Request: "GET http://127.0.0.1:9000/sweep",
			Leads: []jobs.Status{shard(0, true, 10, jobs.ResultOK), shard(1, false, 11, jobs.ResultOK), sweeping}},
	}
}

func TestStoreProblem(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	ok := Election{Election: electionstatus.Election{LastContact: now.Add(-time.Second), LeaseRemaining: 1}}
	with := func(change func(*Election)) Election { e := ok; change(&e); return e }
	for _, c := range []struct {
		name string
		el   Election
		want string // a part of the problem; empty for none
	}{
		{"reachable", ok, ""},
		{"registry_read_failed", with(func(e *Election) { e.CandidatesError = "context deadline exceeded" }), "reading the candidates failed"},
		{"history_read_failed", with(func(e *Election) { e.HistoryError = "connection refused" }), "reading the history failed"},
		{"lease_ran_out", with(func(e *Election) { e.LeaseRemaining = 0; e.LastContact = now.Add(-4 * time.Second) }), "4s ago"},
		{"never_confirmed", with(func(e *Election) { e.LastContact = time.Time{} }), "not confirmed"},
		{"failsafe", with(func(e *Election) {
			e.Failsafe = &elector.FailsafeStatus{Enabled: true, Active: true, Cause: "lease lost"}
		}), "through failsafe"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := storeProblem(c.el, now)
			if c.want == "" && got != "" || !strings.Contains(got, c.want) {
				t.Errorf("storeProblem = %q, want one with %q", got, c.want)
			}
		})
	}
}

func TestKeptHistory(t *testing.T) {
	term := func(token int64) []elector.PastTerm { return []elector.PastTerm{{Token: token}} }
	var k keptHistory
	for _, c := range []struct {
		name     string
		election string
		terms    []elector.PastTerm
		err      error
		want     int64 // the token of the history shown; 0 for an empty one
	}{
		{"failed_read_before_any_shows_nothing", "main", nil, errors.New("timeout"), 0},
		{"a_read_is_shown", "main", term(7), nil, 7},
		{"a_failed_read_shows_the_last_one", "main", nil, errors.New("timeout"), 7},
		{"elections_are_kept_apart", "jobs", nil, errors.New("timeout"), 0},
		{"a_new_read_replaces_it", "main", term(8), nil, 8},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := k.remember(c.election, c.terms, c.err)
			if got == nil {
				t.Fatal("nil history: the JSON would say null")
			}
			var token int64
			if len(got) > 0 {
				token = got[0].Token
			}
			if token != c.want {
				t.Errorf("shows the history with token %d, want %d", token, c.want)
			}
		})
	}
}

// noElections is a leader app that runs no election.
type noElections struct{}

func (noElections) RunningElections() map[string]*elector.Election { return nil }

// TestPageNamesAnUnknownElection: a page limited to an election this instance does not run
// names that election, rather than asking whether the leader app is configured (it is).
func TestPageNamesAnUnknownElection(t *testing.T) {
	for _, c := range []struct {
		name    string
		only    []string
		want    string
		wantNot string
	}{
		{name: "limited_to_an_unknown_name", only: []string{"nosuch"},
			want: "no election or shard set named <q>nosuch</q>", wantNot: "is the leader app configured"},
		{name: "not_limited", want: "is the leader app configured", wantNot: "named <q>"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := page{title: "Fleet", only: c.only}
			var b bytes.Buffer
			if err := pageTemplate.ExecuteTemplate(&b, "page", p.view(take(t.Context(), noElections{}, c.only, new(keptHistory)))); err != nil {
				t.Fatal(err)
			}
			if html := b.String(); !strings.Contains(html, c.want) || strings.Contains(html, c.wantNot) {
				t.Errorf("the page should say %q and not %q:\n%s", c.want, c.wantNot, html)
			}
		})
	}
}

func TestTermRows(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, c := range []struct {
		name                         string
		term                         elector.PastTerm
		leader, start, lasted, ended string
	}{
		{name: "seen_term", term: elector.PastTerm{Token: 6, Leader: "c2", Start: at.Add(-3 * time.Minute), End: at.Add(-92 * time.Second)},
			leader: "c2", start: "03:01:05.0", lasted: "1m28s", ended: "03:02:33.0"},
		// Its successor started after its leader stopped: the store named only its token.
		{name: "term_its_successor_never_saw_shows_unknown", term: elector.PastTerm{Token: 6, End: at.Add(-92 * time.Second)},
			leader: "unknown", start: "unknown", lasted: "unknown", ended: "03:02:33.0"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := snapshotOf(at, "")
			s.Elections[0].History = []elector.PastTerm{c.term}
			row := (&page{}).view(s).Elections[0].Terms[0]
			if row.Leader != c.leader || row.StartText != c.start || row.Lasted != c.lasted || row.EndText != c.ended {
				t.Errorf("row: leader %q, start %q, lasted %q, end %q; want %q, %q, %q, %q",
					row.Leader, row.StartText, row.Lasted, row.EndText, c.leader, c.start, c.lasted, c.ended)
			}
		})
	}
}

// fakeShards is a source of one shard set, whose candidates a test changes.
type fakeShards struct{ set electionstatus.ShardSet }

func (f *fakeShards) RunningElections() map[string]*elector.Election { return nil }
func (f *fakeShards) RunningShardSets(context.Context) []electionstatus.ShardSet {
	return []electionstatus.ShardSet{f.set}
}

// TestShardSetKeepsAGoneCandidate: an instance that leaves a shard set's registry (killed)
// stays in the set's section as gone, as it does in an election's section.
func TestShardSetKeepsAGoneCandidate(t *testing.T) {
	src := &fakeShards{set: electionstatus.ShardSet{Set: "rooms", Shards: 4, Self: "c1", Candidates: []electionstatus.ShardCandidate{
		{ID: "c1", Priority: 1, Healthy: true, Owned: 2}, {ID: "c2", URL: "http://127.0.0.1:8003", Priority: 1, Healthy: true, Owned: 2}}}}
	p := &page{title: "Fleet", candidates: new(keptCandidates)}
	p.snapshot(context.Background(), src, "")
	src.set.Candidates = src.set.Candidates[:1] // c2 was killed
	var b bytes.Buffer
	if err := pageTemplate.ExecuteTemplate(&b, "page", p.view(p.snapshot(context.Background(), src, ""))); err != nil {
		t.Fatal(err)
	}
	if want := `<tr data-shard-candidate="c2" class="gone">`; !strings.Contains(b.String(), want) {
		t.Errorf("the shard set's section lacks %q", want)
	}
}
