package electortest

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/shards"
)

// TestShardMovesAreSummedUp places a set of 96 shards on one instance, then on three: each
// instance logs its shards' term changes at DEBUG and a few INFO lines per wave of moves,
// not one per shard; the last summary says how many shards it owns. A plain election
// still logs "became leader" at INFO.
func TestShardMovesAreSummedUp(t *testing.T) {
	const count = 96
	t.Run("a_shard_set_logs_a_summary_per_wave_not_a_line_per_shard", func(t *testing.T) {
		f := &placedFleet{t: t, store: NewStore(), shards: count, members: map[string][]*elector.Election{},
			cands: map[string]*elector.Candidate{}, logs: map[string]*observer.ObservedLogs{}}
		f.join("c1", 4)
		f.settledOn([]string{"c1"}, 20*time.Second)
		f.join("c2", 4)
		f.join("c3", 4)
		f.settledOn([]string{"c1", "c2", "c3"}, 60*time.Second)
		want := shards.Placement(count, []shards.Candidate{{ID: "c1", Weight: 1}, {ID: "c2", Weight: 1}, {ID: "c3", Weight: 1}})
		for _, id := range []string{"c1", "c2", "c3"} {
			owns := 0
			for _, o := range want {
				if o == id {
					owns++
				}
			}
			logs := f.logs[id]
			// Waiting for the summary is not a timing assertion: the test asserts what
			// the log says once the wave that placed the shards is summed up.
			summed := func() bool {
				last := logs.FilterMessage("shard set moved shards").All()
				return len(last) > 0 && last[len(last)-1].ContextMap()["owns"] == int64(owns)
			}
			for deadline := time.Now().Add(10 * time.Second); !summed(); time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("%s: no summary says it owns %d shards: %v", id, owns, messages(logs.FilterMessage("shard set moved shards")))
				}
			}
			// A wave may be summed up in a few lines (a line at least every few
			// seconds); what must not happen is a line per shard. (A WARN, a store
			// request that failed on a loaded machine, is trouble, not a move.)
			info := logs.FilterLevelExact(zapcore.InfoLevel)
			if n := info.Len(); n > 12 {
				t.Errorf("%s logged %d INFO lines while placing %d shards: %v", id, n, count, messages(info))
			}
			if n := logs.FilterMessage("became leader").Len(); n < owns {
				t.Errorf("%s logged %d \"became leader\" lines at DEBUG, want at least %d (one per shard it owns)", id, n, owns)
			}
		}
	})

	t.Run("a_plain_election_logs_became_leader_at_info", func(t *testing.T) {
		core, logs := observer.New(zap.InfoLevel)
		c, err := elector.NewCandidate(elector.Config{ID: "solo", TTL: time.Second, Backend: NewStore().Client(), Logger: zap.New(core)})
		if err != nil {
			t.Fatal(err)
		}
		e := c.Election("main")
		c.Start()
		e.Start()
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = c.Close(ctx)
		})
		for deadline := time.Now().Add(10 * time.Second); logs.FilterMessage("became leader").Len() == 0; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no \"became leader\" at INFO: %v", messages(logs))
			}
		}
	})
}

// messages lists the messages of logs, with their set's summary fields, for a failure.
func messages(logs *observer.ObservedLogs) []string {
	var out []string
	for _, e := range logs.All() {
		out = append(out, e.Message)
	}
	return out
}
