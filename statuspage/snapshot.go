package statuspage

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/caddyleader/caddy-leader/electionstatus"
	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/jobs"
)

// Snapshot is what the page shows: the elections this instance takes part in, as it sees
// them at one moment. `?format=json` serves it as is.
type Snapshot struct {
	// At is when the snapshot was taken, by this instance's clock.
	At time.Time `json:"at"`
	// Elections are sorted by name.
	Elections []Election `json:"elections"`
	// ShardSets are this instance's shard sets, each summed over its shards (its shards'
	// elections are not among Elections), sorted by name.
	ShardSets []electionstatus.ShardSet `json:"shard_sets,omitempty"`
	// Unknown are the names the page is limited to (its elections option) that are
	// neither an election nor a shard set of this instance, sorted.
	Unknown []string `json:"unknown,omitempty"`
	// ShardSetsGone are, by shard set, the candidates it listed lately but no longer
	// (stopped, crashed or cut off from the store), as Election.Gone.
	ShardSetsGone map[string][]GoneCandidate `json:"shard_sets_gone,omitempty"`
	// Jobs are the scheduled jobs that run under the elections and shard sets shown, as
	// GET /leader/jobs lists them, sorted by name.
	Jobs []jobs.Listing `json:"jobs,omitempty"`
}

// Election is one election of a Snapshot: GET /leader/'s report of it, its history and
// whether this instance reaches the store.
type Election struct {
	electionstatus.Election
	// History is the election's ended terms, oldest first, as the store keeps them.
	History []elector.PastTerm `json:"history"`
	// HistoryError says why the history could not be read; History is then the last one
	// this page read, if any.
	HistoryError string `json:"history_error,omitempty"`
	// StoreProblem says why this instance looks cut off from the store; empty while the
	// store answers and confirms its lease.
	StoreProblem string `json:"store_problem,omitempty"`
	// Gone are the candidates the registry listed lately, but no longer: stopped, crashed
	// or cut off from the store (see peers.go).
	Gone []GoneCandidate `json:"gone_candidates,omitempty"`
	// Peers is what the other candidates, gone ones included, last said of themselves
	// when this page asked them, by instance_id.
	Peers map[string]PeerState `json:"peers,omitempty"`
}

// electionSource is what the page needs of the leader app (caddyleader.App): the elections
// of this process.
type electionSource interface {
	RunningElections() map[string]*elector.Election
}

// shardSource is a source that also has shard sets (caddyleader.App does).
type shardSource interface {
	RunningShardSets(ctx context.Context) []electionstatus.ShardSet
}

// jobSource is a source that also runs scheduled jobs (caddyleader.App does). fresh reads
// each job's record from the store; otherwise each is as this instance last knew it.
type jobSource interface {
	RunningJobs(ctx context.Context, fresh bool) []jobs.Listing
}

// jobsShown are the jobs of src under the elections and shard sets in only (all when only
// is empty).
func jobsShown(ctx context.Context, src electionSource, only []string, fresh bool) []jobs.Listing {
	js, ok := src.(jobSource)
	if !ok || src == nil {
		return nil
	}
	var shownJobs []jobs.Listing
	for _, j := range js.RunningJobs(ctx, fresh) {
		if shown(only, j.Election+j.ShardSet) { // one of them is empty
			shownJobs = append(shownJobs, j)
		}
	}
	return shownJobs
}

// take reads the elections of src named in only (every one when only is empty). Each election
// costs two store requests (the history and the registry of candidates), each bounded by
// ctx and the election's request timeout; the elections are read side by side, so a store
// that does not answer delays the snapshot by two timeouts and no more. The history is read first and this instance's own
// state after it, so that a store that timed out shows in that state too (how long ago the
// store last confirmed the lease), not only in the errors.
func take(ctx context.Context, src electionSource, only []string, kept *keptHistory) Snapshot {
	var running map[string]*elector.Election
	if src != nil {
		running = src.RunningElections()
	}
	names := make([]string, 0, len(running))
	for name := range running {
		if shown(only, name) {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	snap := Snapshot{Elections: make([]Election, len(names))}
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Go(func() {
			e := running[name]
			terms, err := e.History(ctx)
			el := Election{Election: electionstatus.Of(ctx, e, time.Now()), History: kept.remember(name, terms, err)}
			if err != nil {
				el.HistoryError = err.Error()
			}
			snap.Elections[i] = el
		})
	}
	wg.Wait()
	if sets, ok := src.(shardSource); ok && src != nil {
		for _, set := range sets.RunningShardSets(ctx) {
			if shown(only, set.Set) {
				snap.ShardSets = append(snap.ShardSets, set)
			}
		}
	}
	for _, name := range only {
		known := running[name] != nil || slices.ContainsFunc(snap.ShardSets, func(s electionstatus.ShardSet) bool { return s.Set == name })
		if !known && !slices.Contains(snap.Unknown, name) {
			snap.Unknown = append(snap.Unknown, name)
		}
	}
	slices.Sort(snap.Unknown)
	snap.Jobs = jobsShown(ctx, src, only, true)
	snap.At = time.Now()
	for i := range snap.Elections {
		snap.Elections[i].StoreProblem = storeProblem(snap.Elections[i], snap.At)
	}
	return snap
}

// snapshot takes the page's snapshot of src (see take), with the candidates gone from
// each registry lately and what each other candidate last said of itself, asked at this
// page's path (empty: not asked).
func (p *page) snapshot(ctx context.Context, src electionSource, path string) Snapshot {
	snap := take(ctx, src, p.only, p.kept)
	for i := range snap.Elections {
		el := &snap.Elections[i]
		if el.CandidatesError == "" && p.candidates != nil {
			el.Gone = p.candidates.gone(el.Election.Election, el.Candidates, snap.At)
		}
		ask := func(c electionstatus.Candidate) {
			at := peerAddress(c.URL, path)
			if c.ID == el.Self || at == "" || p.peers == nil {
				return
			}
			if el.Peers == nil {
				el.Peers = make(map[string]PeerState)
			}
			el.Peers[c.ID] = p.peers.state(at, c.ID, snap.At)
		}
		for _, c := range el.Candidates {
			ask(c)
		}
		for _, g := range el.Gone {
			ask(g.Candidate)
		}
	}
	for _, set := range snap.ShardSets {
		if p.candidates == nil {
			break
		}
		list := make([]electionstatus.Candidate, len(set.Candidates))
		for i, c := range set.Candidates {
			list[i] = electionstatus.Candidate{ID: c.ID, URL: c.URL, Priority: c.Priority, Healthy: c.Healthy}
		}
		// Kept apart from the elections' candidates: no election's name starts with NUL.
		if gone := p.candidates.gone("\x00shards/"+set.Set, list, snap.At); len(gone) > 0 {
			if snap.ShardSetsGone == nil {
				snap.ShardSetsGone = make(map[string][]GoneCandidate)
			}
			snap.ShardSetsGone[set.Set] = gone
		}
	}
	return snap
}

// keptHistory is the last history of each election a page read, which it goes on showing
// while the store does not answer. Its methods are safe for concurrent use.
type keptHistory struct {
	mu    sync.Mutex
	terms map[string][]elector.PastTerm
}

// remember keeps terms as election name's history unless reading them failed (err), and
// returns the history to show: terms, or the last one kept (empty if none).
func (k *keptHistory) remember(name string, terms []elector.PastTerm, err error) []elector.PastTerm {
	if k == nil { // a page that keeps nothing
		k = new(keptHistory)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.terms == nil {
		k.terms = make(map[string][]elector.PastTerm)
	}
	if err == nil {
		k.terms[name] = terms
		return terms
	}
	if last, ok := k.terms[name]; ok {
		return last
	}
	return []elector.PastTerm{}
}

// storeProblem says why election el looks cut off from the store, or "". A failed read is
// the plainest sign; a lease that has run out, or a leader on failsafe, says the same
// before any read has timed out.
func storeProblem(el Election, now time.Time) string {
	switch {
	case el.Failsafe != nil && el.Failsafe.Active:
		return "the store is unreachable: this instance leads on through failsafe while its peers confirm it (cause: " + el.Failsafe.Cause + ")"
	case el.CandidatesError != "":
		return "cannot reach the store: reading the candidates failed: " + el.CandidatesError
	case el.HistoryError != "":
		return "cannot reach the store: reading the history failed: " + el.HistoryError
	case el.LastContact.IsZero():
		return "the store has not confirmed this instance's lease yet"
	case el.LeaseRemaining <= 0:
		return fmt.Sprintf("cannot reach the store: it last confirmed this instance's lease %s ago, and the lease has run out",
			now.Sub(el.LastContact).Round(100*time.Millisecond))
	}
	return ""
}
