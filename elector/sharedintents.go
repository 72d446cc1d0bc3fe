package elector

import (
	"bytes"
	"context"
	"strings"
)

// A shard set's elections follow their intents through one watch of the whole set's
// (IntentGrouper), where the store has one, instead of a watch and a loop per shard. Each
// election still applies its own intents one after the other, in the store's order, as
// its own watch would have had it do; a goroutine applies them only while it has some to.

// memberIntents is what the set's intent watch has given one member to apply.
type memberIntents struct {
	ctx   context.Context // the member's campaign context
	last  []byte          // the intent last given to the member
	queue [][]byte        // given and not applied yet
	busy  bool            // a goroutine applies the queue
}

// followsIntents reports whether the set's watch of intents serves e (so e runs no watch
// of its own).
func (r *sharedRegistry) followsIntents() bool {
	_, ok := r.c.cfg.Backend.(IntentGrouper)
	return ok
}

// followIntents keeps the members' intents from one watch of the set's, watching again
// after a backoff whenever the watch breaks.
func (r *sharedRegistry) followIntents(ctx context.Context, ig IntentGrouper) {
	first := true // the first report of a watch
	followWatch(ctx, r.c.cfg.TTL,
		func(ctx context.Context) <-chan GroupIntents { return ig.WatchGroupIntents(ctx, r.group) },
		func(rep GroupIntents) bool { return rep.Err != nil },
		func(rep GroupIntents) {
			r.mu.Lock()
			defer r.mu.Unlock()
			if ctx.Err() == nil {
				r.applyLocked(rep, first)
			}
			first = false
		},
		func() { first = true })
}

// applyLocked gives the members what rep reports; first says that it is the first report
// of a watch. r.mu is held.
func (r *sharedRegistry) applyLocked(rep GroupIntents, first bool) {
	if rep.All {
		r.current = map[string][]byte{}
		for shard, m := range r.intents {
			if _, listed := rep.Intents[r.group+"."+shard]; !listed {
				r.giveLocked(shard, m, nil, false)
			}
		}
	}
	for name, value := range rep.Intents {
		shard, ok := strings.CutPrefix(name, r.group+".")
		if !ok {
			continue
		}
		if value == nil {
			delete(r.current, shard)
		} else {
			r.current[shard] = value
		}
		if m := r.intents[shard]; m != nil {
			// After the watch broke, an intent is applied again, as a member's own watch
			// would apply the first report of its next watch.
			r.giveLocked(shard, m, value, first && value != nil)
		}
	}
}

// giveLocked queues value for the member of shard, unless it is what the member was
// given last (and again is not set). r.mu is held.
func (r *sharedRegistry) giveLocked(shard string, m *memberIntents, value []byte, again bool) {
	if !again && bytes.Equal(m.last, value) && (m.last == nil) == (value == nil) {
		return
	}
	m.last = value
	m.queue = append(m.queue, value)
	if m.busy {
		return
	}
	m.busy = true
	e := r.members[shard]
	r.c.loops.Add(1)
	go func() {
		defer r.c.loops.Done()
		r.applyIntents(e, m)
	}()
}

// applyIntents applies m's queue to e, in order, until it is empty.
func (r *sharedRegistry) applyIntents(e *Election, m *memberIntents) {
	for {
		r.mu.Lock()
		if len(m.queue) == 0 || m.ctx.Err() != nil {
			m.queue, m.busy = nil, false
			r.mu.Unlock()
			return
		}
		value := m.queue[0]
		m.queue = m.queue[1:]
		r.mu.Unlock()
		e.noteIntent(value)
		e.applyIntent(m.ctx, value)
	}
}
