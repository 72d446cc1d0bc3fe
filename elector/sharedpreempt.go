package elector

import (
	"context"
	"sync"
	"time"
)

// A shard set's elections ask to lead the shards placement gives them (preempt) from one
// loop per set, not a loop per shard: the set looks at its shards whenever its registry
// view, a shard's term or a shard's intent changes (and every TTL in case a watch is
// broken), and runs a shard's preempt only while that shard has one to ask for. Each
// shard's ask is the one a loop of its own would make (askToLead).

// preemptQueue is what the set's preempt loop has yet to look at: the shards whose term or
// intent changed, or all of them after a change of the registry view, a member that joined
// or a TTL gone by. A start changes thousands of terms; each is looked at once per pass, not
// every shard once per change.
type preemptQueue struct {
	mu    sync.Mutex
	kick  chan struct{}
	all   bool
	dirty map[string]struct{}
}

func newPreemptQueue() *preemptQueue { return &preemptQueue{kick: make(chan struct{}, 1)} }

// add queues shard, or every shard when shard is ""; it never blocks.
func (q *preemptQueue) add(shard string) {
	q.mu.Lock()
	if shard == "" {
		q.all = true
	} else if !q.all {
		if q.dirty == nil {
			q.dirty = map[string]struct{}{}
		}
		q.dirty[shard] = struct{}{}
	}
	q.mu.Unlock()
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

// take empties the queue: all, or the shards queued since the last take.
func (q *preemptQueue) take() (all bool, dirty map[string]struct{}) {
	q.mu.Lock()
	defer q.mu.Unlock()
	all, dirty = q.all, q.dirty
	q.all, q.dirty = false, nil
	return all, dirty
}

// kickPreempts asks the set's loop to look at shard again ("" for every shard).
func (r *sharedRegistry) kickPreempts(shard string) { r.preempts.add(shard) }

// followPreempts is the set's preempt loop, for as long as ctx lasts.
func (r *sharedRegistry) followPreempts(ctx context.Context) {
	ttl := r.c.cfg.TTL
	t := time.NewTimer(ttl)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.preempts.kick:
		case <-t.C:
			r.preempts.add("") // priorities and settled terms change without an event
			<-r.preempts.kick
		}
		t.Reset(ttl)
		r.startPreempts(r.preempts.take())
	}
}

// startPreempts starts the preempt of each member looked at (every member when all) that
// has one to ask for and none on its way. Whether one has is looked at without the set's
// lock: while the registry's watch is broken, it reads the store.
func (r *sharedRegistry) startPreempts(all bool, dirty map[string]struct{}) {
	type member struct {
		shard string
		e     *Election
		run   *memberRun
	}
	r.mu.Lock()
	var idle []member
	consider := func(shard string, e *Election) {
		if m := r.runs[shard]; m != nil && !m.preempting {
			idle = append(idle, member{shard, e, m})
		}
	}
	if all {
		idle = make([]member, 0, len(r.members))
		for shard, e := range r.members {
			consider(shard, e)
		}
	} else {
		for shard := range dirty {
			if e := r.members[shard]; e != nil {
				consider(shard, e)
			}
		}
	}
	r.mu.Unlock()
	for _, m := range idle {
		if !m.e.wantsToPreempt(m.run.ctx) {
			continue
		}
		r.mu.Lock()
		if m.run.preempting || r.runs[m.shard] != m.run {
			r.mu.Unlock()
			continue
		}
		m.run.preempting = true
		r.mu.Unlock()
		r.c.loops.Add(1)
		go func() {
			defer r.c.loops.Done()
			m.e.preemptWhileWanted(m.run.ctx)
			r.mu.Lock()
			m.run.preempting = false
			r.mu.Unlock()
			r.kickPreempts(m.shard) // something may have changed while it asked
		}()
	}
}

// wantsToPreempt reports whether e would ask to lead now, as the preempt loop looks
// before it asks. It reads no store.
func (e *Election) wantsToPreempt(ctx context.Context) bool {
	return ctx.Err() == nil && e.preempts() && !e.otherIntentPending() && e.outranksLeader(ctx)
}

// preemptWhileWanted asks to lead for as long as e wants to, as the preempt loop does,
// and returns once it no longer does (or ctx ends).
func (e *Election) preemptWhileWanted(ctx context.Context) {
	for e.wantsToPreempt(ctx) {
		if asked, ok := e.askToLead(ctx); !asked || !ok {
			return
		}
	}
}
