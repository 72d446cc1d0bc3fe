package elector

import "context"

// A shard set's elections share one fleet of candidates but each prefers another of them,
// so that the shards spread over the fleet. Such an election has a placement: a ranking of
// the candidates of its own, which takes the place of the plain priority wherever
// priorities decide who goes first (yieldToHigher) and whom a leader hands over to
// (preempt). Every instance computes the ranking itself, from the ids and priorities its
// view of the registry lists, so placement needs no coordinator and no store write; the
// store still decides who holds a key (the campaign is a compare-and-swap), and a handover
// is the usual graceful transfer. A preferred candidate asks for its shard only while it
// is the best-ranked live, healthy candidate: the shard then moves once, to where it
// belongs, rather than through every candidate that outranks its current leader.

// Ranking scores candidate id, of priority priority (above 0), in one election: the
// highest score is the preferred leader. It must give every instance the same answer for
// the same arguments.
type Ranking func(id string, priority int) float64

// placement is an election's ranking and the move slots it shares with its set.
type placement struct {
	rank Ranking
	// moves bounds how many of the set's elections ask for a transfer at once: a move
	// holds one slot (a buffered channel shared by the set) while its transfer runs.
	moves chan struct{}
}

// SetPlacement gives the election a ranking of its own (see Ranking): its preferred
// candidate, while live and healthy, campaigns first and asks any other leader for a
// graceful transfer, as a candidate that preempts does, whatever the candidate's own
// preempt setting. moves, if not nil, is a buffered channel that the elections of one set
// share: its capacity bounds how many of their transfers run at once, so that an instance
// joining a fleet draws its shards a few at a time. Call it before Start.
func (e *Election) SetPlacement(rank Ranking, moves chan struct{}) {
	e.placement.Store(&placement{rank: rank, moves: moves})
	e.kick()
}

// ranksAbove reports whether candidate a ranks above candidate b in the election: by the
// placement's ranking when it has one, else by priority. Priority 0 ranks below everyone.
func (e *Election) ranksAbove(a, b CandidateInfo) bool {
	p := e.placement.Load()
	if p == nil || a.Priority <= 0 || b.Priority <= 0 {
		return a.Priority > b.Priority
	}
	return p.rank(a.ID, a.Priority) > p.rank(b.ID, b.Priority)
}

// self is this candidate as the registry would list it, for ranksAbove.
func (e *Election) self() CandidateInfo {
	return CandidateInfo{ID: e.c.cfg.ID, Priority: int(e.c.prio.rank.Load())}
}

// lastHolderOfPlaced is, for an election with a placement, the other instance that held the
// key last, which a candidate about to campaign for the vacant key does not wait for
// whatever the registry says of it: it let the key go (a shutdown hands over every shard at
// once, and its registry entry may not say "leaving" yet), or it vanished. Waiting for it
// would hold each shard a step per such candidate. Should it campaign again after all (a
// resign without hold-off, a restart), the store decides, and placement moves the shard
// back to it by a transfer. "" for an election without a placement.
func (e *Election) lastHolderOfPlaced() string {
	if e.placement.Load() == nil {
		return ""
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.other.rec.ID
}

// preempts reports whether this candidate asks leaders it outranks to hand over.
func (e *Election) preempts() bool {
	return e.c.prio.preempt.Load() || e.placement.Load() != nil
}

// moveSlot waits for one of the set's move slots and returns the function that frees it;
// it returns false when ctx ends first. An election without a placement, or a set
// without a bound, needs no slot.
func (e *Election) moveSlot(ctx context.Context) (func(), bool) {
	p := e.placement.Load()
	if p == nil || p.moves == nil {
		return func() {}, true
	}
	select {
	case p.moves <- struct{}{}:
		return func() { <-p.moves }, true
	case <-ctx.Done():
		return nil, false
	}
}
