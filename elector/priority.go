package elector

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// Priorities rank the candidates of a fleet, as Patroni's failover_priority does: when
// several are free to take a vacant key, the highest wins, because each waits before
// campaigning by a short step per live, healthy candidate of higher priority that the
// store's registry lists, as the election's view of it has them (registry.go). The campaign
// is still a compare-and-swap: waiting decides who tries first, never who may hold the key.
// A candidate of priority 0 never campaigns; it only follows (Patroni's nofailover). With preempt, a healthy candidate of higher priority
// than the leader asks it for a graceful transfer, through the same intent as
// Election.Transfer; it never takes the key by force. It does not replace a request that is
// pending in the store (another instance's transfer, a resign): the store keeps one intent,
// and the one replaced would never be acted on. Two asked at the same moment still replace
// one another; the Transfer of the one replaced sees it and returns ErrTransferSuperseded,
// and its candidate looks again once the other is done.

// DefaultPriority is the priority of a candidate whose Config.Priority is 0.
const DefaultPriority = 1

// NeverLead, as Config.Priority, makes a candidate that never campaigns: it follows,
// forwards and redirects, and is listed with priority 0.
const NeverLead = -1

// priority is a candidate's current rank and whether it preempts lower-ranked leaders.
type priority struct {
	rank    atomic.Int64 // the effective priority: 0 never campaigns
	preempt atomic.Bool
}

func effectivePriority(p int) int64 {
	switch {
	case p == 0:
		return DefaultPriority
	case p < 0:
		return 0
	}
	return int64(p)
}

// SetPriority changes the candidate's priority (as Config.Priority) and whether it preempts
// a leader of lower priority, without starting a new candidacy; every election announces the
// change at once. A leader whose new priority is 0 keeps its term until it ends (resign it
// to hand over now).
func (c *Candidate) SetPriority(p int, preempt bool) {
	old := c.prio.rank.Swap(effectivePriority(p))
	oldPreempt := c.prio.preempt.Swap(preempt)
	if old == effectivePriority(p) && oldPreempt == preempt {
		return
	}
	for _, e := range c.Elections() {
		e.kick()
	}
}

// Priority is the candidate's effective priority: 0 when it never campaigns.
func (c *Candidate) Priority() int { return int(c.prio.rank.Load()) }

// priorityStep is how long a candidate yields to each live candidate of higher priority
// before it campaigns for a vacant key: long enough for one that noticed the vacancy at the
// same moment to get its campaign to the store first.
func priorityStep(ttl time.Duration) time.Duration {
	return min(max(ttl/4, 100*time.Millisecond), time.Second)
}

// yieldToHigher is called before a campaign by a candidate that is free to campaign (not
// held off, priority above 0). If the registry lists live, healthy candidates
// of higher priority than this one and the key is vacant, it waits a step for each of them,
// and returns false so that the campaign goes ahead (one of them most likely holds the key by
// then, and the campaign only reads it). It returns an observation and true when it found the
// key held: no campaign is needed. A store request that fails does not end the yield: a
// failed read of the registry counts from the view, a failed read or watch of the key
// waits the whole wait. Only a candidate with neither a view nor a registry read
// campaigns at once, having nobody to count. The one exception is a shard of a set whose
// read of the key fails: it returns that error (the only one yieldToHigher returns), and
// its pass reads again after a backoff rather than campaign, a write, blind.
//
// A yield that follows a vacancy its watch showed (vacated) watches from there instead of
// reading the key again.
//
// The election's view of the registry answers whether anyone ranks higher, without a store
// request. One that does yield reads the registry to count (but a shard of a set, whose
// view is the set's shared one, while its watch is live), as it waits a step anyway:
// every candidate then counts the registry as the store has it after the vacancy, not in
// views that each may lag it differently (a leader that stays out after its release says
// so before it: announceStandingOut).
func (e *Election) yieldToHigher(ctx context.Context, vacated *Observation) (Observation, bool, error) {
	skip := e.lastHolderOfPlaced()
	list, err := e.knownCandidates(ctx)
	if err != nil {
		return Observation{}, false, nil
	}
	higher := e.higher(list, skip)
	if higher == 0 {
		return Observation{}, false, nil
	}
	// A shard of a set counts from its set's view while the view's watch is live: the
	// set's thousands of shards would otherwise read the registry back to back, and on
	// a store with a request budget (Kubernetes) spend it on reads.
	if _, live := e.registry.get(); e.shared.Load() == nil || !live {
		if fresh, err := e.Candidates(ctx); err == nil {
			higher = e.higher(fresh, skip)
		}
	}
	if higher == 0 {
		return Observation{}, false, nil
	}
	wait := time.Duration(higher) * priorityStep(e.c.cfg.TTL)
	// The vacancy this instance's watch just showed is as good as a read: the watch
	// from there shows whoever takes the key since.
	var obs Observation
	if vacated != nil {
		obs = *vacated
	} else {
		obs, err = e.readKey(ctx)
		if err == nil && obs.Holder != nil {
			return obs, true, nil
		}
	}
	if err != nil {
		if e.shared.Load() != nil {
			// A shard's failed read fails the pass, which reads again after a backoff: a
			// campaign in its place would be a write, which the store serializes, of a
			// key most likely held (at a set's start, thousands of them kept etcd slow).
			return Observation{}, false, err
		}
		sleepCtx(ctx, wait)
		return Observation{}, false, nil
	}
	// The yield watches the key: the moment one that ranks higher takes it, this candidate
	// knows its leader (a request it forwards waits for that), instead of up to a step per
	// higher candidate later. A broken watch still waits out the wait.
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for o := range e.watch(wctx, obs) {
		if o.Err != nil {
			break
		}
		if o.Holder != nil {
			return o, true, nil
		}
	}
	<-wctx.Done()
	return Observation{}, false, nil
}

// higher counts the live, healthy candidates of list, other than this one and skip, that
// rank above it.
func (e *Election) higher(list []CandidateInfo, skip string) int {
	self, n := e.self(), 0
	for _, c := range list {
		if c.ID != self.ID && c.ID != skip && c.Healthy && !c.Leaving && e.ranksAbove(c, self) {
			n++
		}
	}
	return n
}

// preempt runs while the election does, when the candidate preempts: whenever another
// instance leads a settled term with a lower priority than this one, this one is healthy
// and free to campaign, and no other request is pending, it asks for a transfer to itself.
// A transfer that fails (the leader is cut off, the store is down) is asked again after a
// TTL.
func (e *Election) preempt(ctx context.Context) {
	ttl := e.c.cfg.TTL
	for {
		changed, registry, intents := e.Changed(), e.registry.changes(), e.intentChanges()
		if e.wantsToPreempt(ctx) {
			asked, ok := e.askToLead(ctx)
			if !ok {
				return
			}
			if asked {
				continue
			}
		}
		// Priorities change without a change of term (a reload, a peer that joins): look
		// again when the registry changes, and every TTL in case its watch is broken. A
		// pending request ends with a change of the intent.
		timer := time.NewTimer(ttl)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-changed:
		case <-registry:
		case <-intents:
		case <-timer.C:
		}
		timer.Stop()
	}
}

// askToLead asks the leader for a transfer to this instance, once it has a move slot and
// unless the store holds another request: this instance's view of the intent may lag the
// store, and the store keeps one request, so replacing one would leave it undone. It
// reports whether it asked, and ok false once ctx ended.
func (e *Election) askToLead(ctx context.Context) (asked, ok bool) {
	free, ok := e.moveSlot(ctx)
	if !ok {
		return false, false
	}
	if pending, err := e.readIntent(ctx); err != nil || e.notOwnIntent(pending) {
		free()
		return false, true
	}
	t, ttl := e.Term(), e.c.cfg.TTL
	msg := "asking a leader of lower priority to hand over"
	if e.placement.Load() != nil {
		msg = "asking the leader to hand over: placement prefers this instance"
	}
	e.logMove(msg, zap.String("election", e.name), zap.String("leader", t.Leader.ID), zap.Int("priority", e.c.Priority()))
	// Only if no request is pending: another instance's preempt, or an operator's
	// transfer, asked between the read above and this write is not replaced.
	changed := e.intentChanges()
	err := e.transfer(ctx, e.c.cfg.ID, 2*ttl, true)
	free()
	switch {
	case errors.Is(err, errIntentPending):
		// Ask again once the watch shows that request (the preempt then waits for it to
		// be done) or a ttl has passed.
		e.c.log().Info("another handover request is pending; following it", zap.String("election", e.name))
		select {
		case <-changed:
		case <-time.After(ttl):
		case <-ctx.Done():
			return true, false
		}
	case errors.Is(err, ErrTransferSuperseded):
		// Another instance asked at the same moment, and the fleet follows its request:
		// look again once it is done.
		e.c.log().Info("another handover request replaced this preempt's; following it", zap.String("election", e.name))
	case err != nil && ctx.Err() == nil:
		e.c.log().Warn("preempting the leader failed; asking again later", zap.String("election", e.name), zap.Error(err))
		if !sleepCtx(ctx, ttl) {
			return true, false
		}
	}
	return true, true
}

// outranksLeader reports whether another instance leads a settled term, this one is healthy
// and free to campaign, and the leader's announced priority is lower than this one's.
func (e *Election) outranksLeader(ctx context.Context) bool {
	t := e.Term()
	mine := e.c.prio.rank.Load()
	if mine == 0 || t.Holds() || !t.LeaderKnown() || t.Leader.HandingOver || !t.Settled(e.c.now()) {
		return false
	}
	if _, held := e.heldOff(); held || !e.Healthy() {
		return false
	}
	list, err := e.knownCandidates(ctx)
	if err != nil {
		return false
	}
	if e.placement.Load() != nil && e.higher(list, "") > 0 {
		return false // the shard belongs to another: it moves once, to that one
	}
	for _, c := range list {
		if c.ID == t.Leader.ID {
			return e.ranksAbove(e.self(), c)
		}
	}
	return false // a leader that is not in the registry has no known priority
}

// checkTransferTarget refuses a transfer to a candidate that never campaigns, or that does
// not campaign now (at now, by this host's wall clock): the leader would let go to nobody.
func checkTransferTarget(list []CandidateInfo, to string, now time.Time) error {
	for _, c := range list {
		if c.ID != to {
			continue
		}
		switch left := c.HoldOffUntil.Sub(now); {
		case c.Priority == 0:
			return fmt.Errorf("%q %w", to, ErrNeverLeads)
		case c.Leaving:
			return fmt.Errorf("%q %w: it is leaving the election", to, ErrTargetOut)
		case left > 0:
			return fmt.Errorf("%q %w: it is held off for another %s after a resign or a step-down (resign it with a hold-off of 0 to clear that, or transfer once it ends)",
				to, ErrTargetOut, left.Round(time.Second))
		case !c.Healthy:
			return fmt.Errorf("%q %w: it stays out of the election while its service is unhealthy", to, ErrTargetOut)
		}
	}
	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
