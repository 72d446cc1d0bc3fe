package caddyleader

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddyleader/caddy-leader/electionstatus"
	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/shards"
)

// ShardSetStatus is a shard set as this instance sees it, as GET /leader/ (a summary) and
// GET /leader/shards/<set> (with every shard) report it.
type ShardSetStatus struct {
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
	// List is every shard, in order (GET /leader/shards/<set> only).
	List []ShardStatus `json:"shard_list,omitempty"`
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

// ShardStatus is one shard of a set.
type ShardStatus struct {
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

// shardSetStatus describes the set named set from the shard elections of this process
// (elections, by shard).
func shardSetStatus(ctx context.Context, set string, elections map[int]*elector.Election, detail bool, now time.Time) ShardSetStatus {
	st := ShardSetStatus{Set: set, Owners: map[string]int{}, Candidates: []ShardCandidate{}}
	if n, ok := shardSetsInUse.Load(set); ok {
		st.Shards = n.(int)
	}
	var live []shards.Candidate
	var infos []elector.CandidateInfo
	for _, e := range elections {
		st.Self = e.Term().Self
		if list, err := e.KnownCandidates(ctx); err == nil {
			infos = list
		}
		break // every shard has the same candidates
	}
	for _, c := range infos {
		if c.Healthy && !c.Leaving {
			live = append(live, shards.Candidate{ID: c.ID, Weight: c.Priority})
		}
	}
	preferredCount := map[string]int{}
	for s := 0; s < st.Shards; s++ {
		e, ok := elections[s]
		if !ok {
			continue
		}
		t := e.Term()
		preferred := shards.Owner(s, live)
		preferredCount[preferred]++
		role := electionstatus.RoleOf(t, now)
		owner := t.Leader.ID
		switch {
		case !t.LeaderKnown():
			st.Leaderless++
			owner = ""
		default:
			st.Owners[owner]++
		}
		if owner != "" && (owner != preferred || t.Leader.HandingOver || role == electionstatus.RoleSettling) {
			st.Moving++
		}
		if detail {
			st.List = append(st.List, ShardStatus{Shard: s, Election: e.Name(), Owner: owner, URL: t.Leader.URL,
				Token: t.Token, Preferred: preferred, Role: role})
		}
	}
	for _, c := range infos {
		st.Candidates = append(st.Candidates, ShardCandidate{ID: c.ID, URL: c.URL, Priority: c.Priority,
			Healthy: c.Healthy && !c.Leaving, Preferred: preferredCount[c.ID], Owned: st.Owners[c.ID]})
	}
	return st
}

// runningShardSets groups the shard elections of this process by set and shard.
func runningShardSets() map[string]map[int]*elector.Election {
	sets := map[string]map[int]*elector.Election{}
	for name, e := range runningElections() {
		if set, s, ok := shardOf(name); ok {
			if sets[set] == nil {
				sets[set] = map[int]*elector.Election{}
			}
			sets[set][s] = e
		}
	}
	return sets
}

// listShardSets summarises every shard set of this process, by name.
func listShardSets(ctx context.Context, now time.Time) []ShardSetStatus {
	list := []ShardSetStatus{}
	for set, elections := range runningShardSets() {
		list = append(list, shardSetStatus(ctx, set, elections, false, now))
	}
	sort.Slice(list, func(i, j int) bool { return list[i].Set < list[j].Set })
	return list
}

// serveShards answers /leader/shards/<set> (GET: every shard) and
// /leader/shards/<set>/resign (POST: this instance hands over every shard of the set it
// owns, and stays out for ?hold_off, default one ttl).
func serveShards(w http.ResponseWriter, r *http.Request, rest string) error {
	set, action, _ := strings.Cut(rest, "/")
	elections, ok := runningShardSets()[set]
	if !ok {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("this instance takes no part in a shard set %q", set)}
	}
	switch {
	case action == "" && r.Method == http.MethodGet:
		w.Header().Set("Content-Type", "application/json")
		return json.NewEncoder(w).Encode(shardSetStatus(r.Context(), set, elections, true, time.Now()))
	case action == "resign" && r.Method == http.MethodPost:
		return resignShards(w, r, set, elections)
	case action == "" || action == "resign":
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: errors.New("use GET for a set, POST for its resign")}
	}
	return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no such leader endpoint: %s", r.URL.Path)}
}

// resignShards hands over, at once, every shard of set that this instance owns.
func resignShards(w http.ResponseWriter, r *http.Request, set string, elections map[int]*elector.Election) error {
	var ttl time.Duration
	for _, e := range elections {
		ttl = e.Candidate().TTL()
		break
	}
	holdOff, err := durationParam(r, "hold_off", ttl)
	if err != nil {
		return err
	}
	type result struct {
		shard int
		err   error
	}
	done := make(chan result)
	n := 0
	for s, e := range elections {
		if !e.Term().Holds() {
			continue
		}
		n++
		go func() {
			ctx, cancel := context.WithTimeout(r.Context(), e.Candidate().HandoverTimeout())
			defer cancel()
			done <- result{s, e.Resign(ctx, holdOff)}
		}()
	}
	var resigned []int
	var errs []error
	for range n {
		res := <-done
		if res.err != nil {
			errs = append(errs, fmt.Errorf("shard %d: %w", res.shard, res.err))
			continue
		}
		resigned = append(resigned, res.shard)
	}
	sort.Ints(resigned)
	if err := errors.Join(errs...); err != nil {
		return refusal(fmt.Errorf("resigning the shards of set %q: %w", set, err))
	}
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(map[string]any{"set": set, "resigned": resigned, "hold_off": holdOff.String()})
}
