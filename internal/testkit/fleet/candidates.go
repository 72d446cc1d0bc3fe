package fleet

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/shards"
)

// StartCandidate starts an elector candidate with cfg, standing in each of elections, in
// this process: what a Caddy instance does, without Caddy. It closes the candidate (which
// resigns) when the test ends, allowing 10s for that.
func StartCandidate(t T, cfg elector.Config, elections ...string) (*elector.Candidate, []*elector.Election) {
	t.Helper()
	return startCandidate(t, cfg, elections, nil)
}

// StartShardCandidate is StartCandidate in every shard of a shard set named set, of count
// shards (elections `<set>.0` to `<set>.<count-1>`, in that order), placed as the leader
// app places them: by shards.Score, at most moves transfers at once.
func StartShardCandidate(t T, cfg elector.Config, set string, count, moves int) (*elector.Candidate, []*elector.Election) {
	t.Helper()
	names := make([]string, count)
	for s := range names {
		names[s] = set + "." + strconv.Itoa(s)
	}
	slots := make(chan struct{}, moves)
	return startCandidate(t, cfg, names, func(c *elector.Candidate, es []*elector.Election) {
		// As the leader app does: a follower whose store does not group the set's
		// heartbeats never sees a holder's beacons, and deletes its key after a ttl.
		c.GroupHeartbeats(set)
		for s, e := range es {
			e.SetPlacement(func(id string, priority int) float64 { return shards.Score(id, s, priority) }, slots)
			e.ShareRegistry(set)
		}
	})
}

// startCandidate starts a candidate in elections, calling setUp (if not nil) with the
// candidate and its elections, in order, before any of them starts.
func startCandidate(t T, cfg elector.Config, elections []string, setUp func(*elector.Candidate, []*elector.Election)) (*elector.Candidate, []*elector.Election) {
	t.Helper()
	cand, err := elector.NewCandidate(cfg)
	if err != nil {
		t.Fatalf("candidate %s: %v", cfg.ID, err)
	}
	es := make([]*elector.Election, len(elections))
	for i, name := range elections {
		es[i] = cand.Election(name)
	}
	if setUp != nil {
		setUp(cand, es)
	}
	cand.Start()
	for _, e := range es {
		e.Start()
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = cand.Close(ctx)
	})
	return cand, es
}

// WaitAgreed polls the elections (one per candidate, all of the same name) until exactly
// one of them admits and every one names it as leader with its token, and returns its
// index and the token. After within it logs every view and fails t.
func WaitAgreed(t T, within time.Duration, elections []*elector.Election) (int, int64) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		if i, token, ok := agreed(elections); ok {
			return i, token
		}
		if time.Now().After(deadline) {
			var views []string
			for _, e := range elections {
				term, leads := e.Check()
				views = append(views, fmt.Sprintf("%s: leading=%v leader=%q token=%d reason=%q",
					term.Self, leads, term.Leader.ID, term.Token, term.Reason))
			}
			t.Fatalf("election: no single agreed leader within %v; views: %s", within, strings.Join(views, "; "))
			return -1, 0
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func agreed(elections []*elector.Election) (int, int64, bool) {
	leader := -1
	for i, e := range elections {
		if _, ok := e.Check(); ok {
			if leader >= 0 {
				return -1, 0, false
			}
			leader = i
		}
	}
	if leader < 0 {
		return -1, 0, false
	}
	lt := elections[leader].Term()
	for _, e := range elections {
		if t := e.Term(); t.Leader.ID != lt.Self || t.Token != lt.Token {
			return -1, 0, false
		}
	}
	return leader, lt.Token, true
}
