package fleet

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"
)

// ShardView is one shard of the fleet's shard set (Config.Shards) as an instance sees it,
// from GET /leader/shards/<set> on its admin API.
type ShardView struct {
	Shard     int    `json:"shard"`
	Owner     string `json:"owner"`
	Token     int64  `json:"token"`
	Preferred string `json:"preferred"`
	// Role is the instance's own role in the shard's election ("leader" while it admits).
	Role string `json:"role"`
}

// ShardViews asks the instance for every shard of the fleet's shard set, in shard order.
func (in *Instance) ShardViews() ([]ShardView, error) {
	resp, err := in.Admin(http.MethodGet, "/leader/shards/"+ShardSet, nil)
	if err != nil {
		return nil, err
	}
	if resp.Status != http.StatusOK {
		return nil, fmt.Errorf("GET /leader/shards/%s: status %d, body %s", ShardSet, resp.Status, resp.Body)
	}
	var st struct {
		List []ShardView `json:"shard_list"`
	}
	if err := json.Unmarshal([]byte(resp.Body), &st); err != nil {
		return nil, fmt.Errorf("GET /leader/shards/%s: %v", ShardSet, err)
	}
	return st.List, nil
}

// WaitShardsPlaced polls every instance of fleet until all of them agree on every shard's
// owner and token, the owner is the shard's preferred owner in every view and admits (its
// own role is "leader"), or within passes (which fails t). It returns the shards as the
// fleet agreed on them.
func WaitShardsPlaced(t T, fleet []*Instance, within time.Duration) []ShardView {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		shards, why := ShardsPlaced(fleet)
		if why == "" {
			return shards
		}
		if time.Now().After(deadline) {
			t.Fatalf("the shards of %v not placed within %v: %s", fleet, within, why)
			return nil
		}
		time.Sleep(PollInterval)
	}
}

// ShardsPlaced asks every instance of fleet once, and returns the shards if the fleet
// agrees on them as WaitShardsPlaced wants; else it says why not.
func ShardsPlaced(fleet []*Instance) ([]ShardView, string) {
	views := map[string][]ShardView{}
	for _, in := range fleet {
		v, err := in.ShardViews()
		if err != nil {
			return nil, fmt.Sprintf("%s: %v", in, err)
		}
		views[in.ID] = v
	}
	first := views[fleet[0].ID]
	var trouble []string
	for s, want := range first {
		if want.Owner == "" || want.Owner != want.Preferred {
			trouble = append(trouble, fmt.Sprintf("shard %d: %s sees owner %q, preferred %q", s, fleet[0], want.Owner, want.Preferred))
			continue
		}
		for _, in := range fleet {
			v := views[in.ID]
			switch {
			case len(v) != len(first):
				return nil, fmt.Sprintf("%s lists %d shards, %s %d", in, len(v), fleet[0], len(first))
			case v[s].Owner != want.Owner || v[s].Token != want.Token || v[s].Preferred != want.Preferred:
				trouble = append(trouble, fmt.Sprintf("shard %d: %s sees %+v, %s %+v", s, in, v[s], fleet[0], want))
			case in.ID == want.Owner && v[s].Role != "leader":
				trouble = append(trouble, fmt.Sprintf("shard %d: its owner %s is %s", s, in, v[s].Role))
			}
		}
		if _, ok := views[want.Owner]; !ok {
			trouble = append(trouble, fmt.Sprintf("shard %d: owner %q is not in the fleet", s, want.Owner))
		}
	}
	if len(trouble) > 0 {
		more := ""
		if len(trouble) > 5 {
			more = fmt.Sprintf(" (and %d more)", len(trouble)-5)
			trouble = trouble[:5]
		}
		return nil, strings.Join(trouble, "; ") + more
	}
	return first, ""
}

// ShardsLedSince reads the instance's log for when it began to lead (admitting) each of
// shards at or after since, by its own clock: the moment itself, where a poll of its admin
// API would see it up to a poll late (and, polling without pause, would take from the
// machine the time it measures). A shard it did not begin to lead since then is missing.
func (in *Instance) ShardsLedSince(since time.Time, shards []int) map[int]time.Time {
	return in.shardsLed(since, shards, false)
}

// ShardsLastLedSince is ShardsLedSince with the last time each shard began to be led
// (since then), not the first.
func (in *Instance) ShardsLastLedSince(since time.Time, shards []int) map[int]time.Time {
	return in.shardsLed(since, shards, true)
}

func (in *Instance) shardsLed(since time.Time, shards []int, last bool) map[int]time.Time {
	want := make(map[string]int, len(shards))
	for _, s := range shards {
		want[ShardElection(s)] = s
	}
	led := map[int]time.Time{}
	b, _ := os.ReadFile(in.LogPath())
	for _, line := range strings.Split(string(b), "\n") {
		var entry struct {
			TS       float64 `json:"ts"`
			Msg      string  `json:"msg"`
			Election string  `json:"election"`
		}
		if !strings.Contains(line, `"became leader"`) || json.Unmarshal([]byte(line), &entry) != nil || entry.Msg != "became leader" {
			continue
		}
		s, ok := want[entry.Election]
		at := time.Unix(0, int64(entry.TS*float64(time.Second)))
		if ok && !at.Before(since) {
			if _, seen := led[s]; !seen || last {
				led[s] = at
			}
		}
	}
	return led
}
