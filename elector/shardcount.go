package elector

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"go.uber.org/zap"
)

// A shard set's count is the fleet's, not each instance's: a key's shard is its hash
// modulo the count, so an instance with another count would campaign in elections of the
// same names that hold other keys, and give a key a second owner. The first count written
// for a set is the fleet's and stays: it lives in the history of an election named as the
// set, which no election uses (a plain election may not be named so, and a shard's is
// `<set>.<n>`), and which outlives every lease, so that a fleet that stops altogether
// comes back with the same count.

// shardCountRecord is the history entry that publishes a set's count.
type shardCountRecord struct {
	ShardCount int `json:"shard_count"`
}

// shardCountKeep bounds the entries of a set's history: only an instance that finds none
// appends one, so more than one is a race of first writers, which the oldest won.
const shardCountKeep = 16

// FleetShardCount returns the published count of shard set set, publishing count when none
// is yet: the first written wins, for every instance. It blocks for at most three store
// requests, each bounded by ctx and the request timeout.
func (c *Candidate) FleetShardCount(ctx context.Context, set string, count int) (int, error) {
	if n, err := c.readShardCount(ctx, set); n > 0 || err != nil {
		return n, err
	}
	entry, err := json.Marshal(shardCountRecord{ShardCount: count})
	if err != nil {
		return 0, err
	}
	rctx, cancel := context.WithTimeout(ctx, c.requestTimeout)
	err = c.cfg.Backend.AppendHistory(rctx, set, entry, shardCountKeep)
	cancel()
	if err != nil {
		return 0, fmt.Errorf("publishing the count of shard set %q: %w", set, err)
	}
	n, err := c.readShardCount(ctx, set)
	if n == 0 && err == nil {
		err = fmt.Errorf("the count of shard set %q was published but cannot be read back", set)
	}
	return n, err
}

// readShardCount reads the published count of set: the oldest valid entry; 0 if none.
func (c *Candidate) readShardCount(ctx context.Context, set string) (int, error) {
	rctx, cancel := context.WithTimeout(ctx, c.requestTimeout)
	defer cancel()
	entries, err := c.cfg.Backend.History(rctx, set)
	if err != nil {
		return 0, fmt.Errorf("reading the count of shard set %q: %w", set, err)
	}
	for _, en := range entries {
		var r shardCountRecord
		if json.Unmarshal(en, &r) == nil && r.ShardCount > 0 {
			return r.ShardCount, nil
		}
	}
	return 0, nil
}

// RetryFleetShardCount is FleetShardCount, tried again after a backoff while the store does
// not answer, until ctx ends (then it returns 0 and ctx's error).
func (c *Candidate) RetryFleetShardCount(ctx context.Context, set string, count int) (int, error) {
	retry := newBackoff(100*time.Millisecond, min(5*time.Second, c.cfg.TTL))
	for {
		n, err := c.FleetShardCount(ctx, set, count)
		if err == nil {
			return n, nil
		}
		c.log().Warn("cannot read or publish a shard set's count yet; its shards wait", zap.Error(err), zap.String("set", set))
		if !retry.wait(ctx) {
			return 0, ctx.Err()
		}
	}
}
