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
)

// ShardSetStatus is a shard set as GET /leader/ and GET /leader/shards/<set> report it (see
// electionstatus.ShardSet).
type ShardSetStatus = electionstatus.ShardSet

// ShardStatus is one shard of a set (see electionstatus.Shard).
type ShardStatus = electionstatus.Shard

// shardCount is the number of shards of the set named set in the newest config; 0 if none
// has it.
func shardCount(set string) int {
	n, _ := shardSetsInUse.Load(set)
	count, _ := n.(int)
	return count
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

// shardSetStatus is set's status as this process has it, with what is wrong with its count.
func shardSetStatus(ctx context.Context, set string, elections map[int]*elector.Election, detail bool, now time.Time) ShardSetStatus {
	st := electionstatus.ShardSetOf(ctx, set, shardCount(set), elections, detail, now)
	st.Problem = shardCountProblem(set)
	return st
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

// resignShards hands over, at once, every shard of set that this instance owns, and holds
// the instance off every shard of the set, owned or not: it then announces itself held off
// in each, so that placement prefers others for all of them (a shard it did not own would
// otherwise still count it as the preferred owner, and read as moving, for the hold-off).
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
			// Nothing to hand over: the resign only holds it off (it does not block).
			_ = e.Resign(r.Context(), holdOff)
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
