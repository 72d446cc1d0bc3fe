package elector

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// Every election keeps a view of the store's registry of its candidates, fed by the
// store's watch of it (Backend.WatchCandidates), so that the steps of a handover that
// look at the fleet cost no round trip: whether a higher priority is around to yield to
// before a campaign (one that must yield, and so waits anyway, counts from the store), the
// check of a transfer's target, preemption. The view is as fresh as the watch, which
// is what a read just before would have shown but for the watch's delay; those steps only
// decide who tries first or whom to ask, and the store decides the rest (the campaign
// is a compare-and-swap). A transfer is never refused on the view alone: when the view
// does not list its target as able to lead, the store is read, since an instance that
// announced itself a moment ago may not have reached the view yet. While the watch is
// broken (or has not reported yet), every step reads the store as before.

// registryView is an election's view of its candidates.
type registryView struct {
	mu      sync.Mutex
	list    []CandidateInfo // sorted by id; never modified once set
	live    bool            // the watch has reported and is not broken
	changed chan struct{}   // closed and replaced whenever the view changes
}

func newRegistryView() registryView { return registryView{changed: make(chan struct{})} }

// set replaces the view with list (live) or marks it broken (!live).
func (v *registryView) set(list []CandidateInfo, live bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.list, v.live = list, live
	close(v.changed)
	v.changed = make(chan struct{})
}

// get returns the view's list and whether it is live.
func (v *registryView) get() ([]CandidateInfo, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.list, v.live
}

// changes returns a channel that is closed at the next change of the view.
func (v *registryView) changes() <-chan struct{} {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.changed
}

// followRegistry keeps e's view of its candidates from the store's watch, for as long as
// ctx lasts, watching again after a backoff whenever the watch breaks.
func (e *Election) followRegistry(ctx context.Context) {
	followWatch(ctx, e.c.cfg.TTL,
		func(ctx context.Context) <-chan CandidatesChange { return e.c.cfg.Backend.WatchCandidates(ctx, e.name) },
		func(change CandidatesChange) bool { return change.Err != nil },
		func(change CandidatesChange) {
			list := decodeCandidates(change.Candidates)
			e.noteTTLs(list)
			e.noteLeaderless(list)
			e.registry.set(list, true)
		},
		func() { e.registry.set(nil, false) })
}

// followWatch hands each report of the watch that watch starts to report, for as long as
// ctx lasts, and starts it again after a backoff whenever it breaks (failed tells a report
// that says so), calling broken first (if not nil).
func followWatch[T any](ctx context.Context, ttl time.Duration, watch func(context.Context) <-chan T, failed func(T) bool, report func(T), broken func()) {
	retry := newBackoff(100*time.Millisecond, min(5*time.Second, ttl))
	for ctx.Err() == nil {
		for v := range watch(ctx) {
			if failed(v) {
				break
			}
			retry.reset()
			report(v)
		}
		if broken != nil {
			broken()
		}
		if !retry.wait(ctx) {
			return
		}
	}
}

// NobodyCanLead reports whether this instance's view of the registry is live and lists
// candidates none of which can ever lead (every one has priority 0): no term begins until
// one that can joins. It reads no store.
func (e *Election) NobodyCanLead() bool {
	list, live := e.registry.get()
	return live && noneCanLead(list)
}

func noneCanLead(list []CandidateInfo) bool {
	return len(list) > 0 && !slices.ContainsFunc(list, func(c CandidateInfo) bool { return c.Priority > 0 })
}

// noteLeaderless warns, once each time it becomes so, that the registry lists no candidate
// able to lead: a fleet configured with priority 0 everywhere would otherwise stand by
// forever without a word.
func (e *Election) noteLeaderless(list []CandidateInfo) {
	noteLeaderless(e.c, e.name, list, &e.leaderless)
}

// noteLeaderless warns as Election.noteLeaderless does, for the election (or shard set)
// named name, with leaderless as its flag.
func noteLeaderless(c *Candidate, name string, list []CandidateInfo, leaderless *atomic.Bool) {
	if !noneCanLead(list) {
		leaderless.Store(false)
		return
	}
	if !leaderless.Swap(true) {
		c.log().Warn("no candidate of this election can lead: every one has priority 0, so nobody will lead until an instance with a priority above 0 joins",
			zap.String("election", name), zap.Int("candidates", len(list)))
	}
}

// KnownCandidates lists the election's live candidates, sorted by id, as this instance's
// view of the store's registry has them: without a store request, but as late as the
// registry's watch (a moment, usually). While that watch is broken, or before it has
// reported, it reads the store as Candidates does, and then blocks for one store request
// at most.
func (e *Election) KnownCandidates(ctx context.Context) ([]CandidateInfo, error) {
	list, err := e.knownCandidates(ctx)
	return slices.Clone(list), err
}

// knownCandidates is KnownCandidates for a caller that only reads the list: the view's
// own, which shards of a set share and nobody modifies, is not copied. The preempt loop
// asks it for every shard of a set every ttl.
func (e *Election) knownCandidates(ctx context.Context) ([]CandidateInfo, error) {
	if list, live := e.registry.get(); live {
		return list, nil
	}
	return e.Candidates(ctx)
}

// candidatesToLead is KnownCandidates for a step that would refuse id unless it is a
// candidate able to lead: the store is read when the view does not list id with a
// priority above 0.
func (e *Election) candidatesToLead(ctx context.Context, id string) ([]CandidateInfo, error) {
	list, live := e.registry.get()
	if live {
		for _, c := range list {
			if c.ID == id && c.Priority > 0 {
				return list, nil
			}
		}
	}
	return e.Candidates(ctx)
}

// decodeCandidates turns the store's entries into what the candidates announced, sorted by
// id. An entry whose value this plugin did not write is listed with its id only.
func decodeCandidates(entries []CandidateEntry) []CandidateInfo {
	list := make([]CandidateInfo, 0, len(entries))
	for _, en := range entries {
		// An entry without a priority was announced before priorities existed.
		info := CandidateInfo{Priority: DefaultPriority}
		if json.Unmarshal(en.Value, &info) != nil {
			info = CandidateInfo{Priority: DefaultPriority}
		}
		info.ID = en.ID
		list = append(list, info)
	}
	slices.SortFunc(list, func(a, b CandidateInfo) int { return strings.Compare(a.ID, b.ID) })
	return list
}
