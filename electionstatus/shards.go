package electionstatus

import (
	"context"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/shards"
)

// ShardSet is a shard set as this instance sees it, as GET /leader/ (a summary) and
// GET /leader/shards/<set> (with every shard) report it.
type ShardSet struct {
	// Set is the set's name.
	Set string `json:"set"`
	// Shards is the number of shards of the set.
	Shards int `json:"shards"`
	// Self is this instance's id.
	Self string `json:"self"`
	// Owners counts the shards each instance owns, by instance id, as this instance
	// knows the shards' leaders.
	Owners map[string]int `json:"owners"`
	// Leaderless counts the shards with no known owner.
	Leaderless int `json:"leaderless"`
	// Moving counts the shards whose owner is handing over, settling, or not the
	// preferred owner (a move is due or under way).
	Moving int `json:"moving"`
	// Candidates lists the set's live candidates, with how many shards each should own
	// (its preferred share).
	Candidates []ShardCandidate `json:"candidates"`
	// Problem says why this instance stays out of the set, when it does: its count
	// differs from the fleet's. Empty otherwise.
	Problem string `json:"problem,omitempty"`
	// List is every shard, in order (GET /leader/shards/<set> only).
	List []Shard `json:"shard_list,omitempty"`
}

// ShardCandidate is one live candidate of a shard set.
type ShardCandidate struct {
	// ID is its instance id.
	ID string `json:"id"`
	// URL is its advertise URL.
	URL string `json:"url,omitempty"`
	// Priority weighs its share of the shards; 0 owns none.
	Priority int `json:"priority"`
	// Healthy is false while it stays out (its service is unhealthy, or it is leaving).
	Healthy bool `json:"healthy"`
	// Preferred is how many shards it should own, by placement.
	Preferred int `json:"preferred"`
	// Owned is how many it owns now.
	Owned int `json:"owned"`
}

// Shard is one shard of a set.
type Shard struct {
	// Shard is its number.
	Shard int `json:"shard"`
	// Election is its election's name, `<set>.<shard>`: resign and transfer it as any
	// election.
	Election string `json:"election"`
	// Owner is the instance id of its leader; empty when none is known.
	Owner string `json:"owner"`
	// URL is the owner's advertise URL.
	URL string `json:"url,omitempty"`
	// Token is the fencing token of its current term; 0 when none is known.
	Token int64 `json:"token"`
	// Preferred is the instance that placement gives it to.
	Preferred string `json:"preferred"`
	// Role is this instance's role in it, as for an election.
	Role string `json:"role"`
}

// ShardSetOf describes the set named set, of count shards, from its elections in this
// process (by shard), at now; with detail, every shard. It reads one shard's view of the
// registry of candidates (every shard has the same), which costs a store request only while
// that view's watch is broken.
func ShardSetOf(ctx context.Context, set string, count int, elections map[int]*elector.Election, detail bool, now time.Time) ShardSet {
	st := ShardSet{Set: set, Shards: count, Owners: map[string]int{}, Candidates: []ShardCandidate{}}
	var infos []elector.CandidateInfo
	for _, e := range elections {
		st.Self = e.Term().Self
		if list, err := e.KnownCandidates(ctx); err == nil {
			infos = list
		}
		break // every shard has the same candidates
	}
	live := Placed(infos)
	preferredCount := map[string]int{}
	for s := 0; s < st.Shards; s++ {
		e, ok := elections[s]
		if !ok {
			continue
		}
		t := e.Term()
		preferred := shards.Owner(s, live)
		preferredCount[preferred]++
		role := RoleOf(t, now)
		owner := t.Leader.ID
		switch {
		case !t.LeaderKnown():
			st.Leaderless++
			owner = ""
		default:
			st.Owners[owner]++
		}
		if owner != "" && (owner != preferred || t.Leader.HandingOver || role == RoleSettling) {
			st.Moving++
		}
		if detail {
			st.List = append(st.List, Shard{Shard: s, Election: e.Name(), Owner: owner, URL: t.Leader.URL,
				Token: t.Token, Preferred: preferred, Role: role})
		}
	}
	for _, c := range infos {
		st.Candidates = append(st.Candidates, ShardCandidate{ID: c.ID, URL: c.URL, Priority: c.Priority,
			Healthy: c.Healthy && !c.Leaving, Preferred: preferredCount[c.ID], Owned: st.Owners[c.ID]})
	}
	return st
}

// Placed is the candidates of infos that placement gives shards to: the live, healthy ones
// (a candidate held off after a resign announces itself unhealthy), weighted by priority.
func Placed(infos []elector.CandidateInfo) []shards.Candidate {
	var live []shards.Candidate
	for _, c := range infos {
		if c.Healthy && !c.Leaving {
			live = append(live, shards.Candidate{ID: c.ID, Weight: c.Priority})
		}
	}
	return live
}
