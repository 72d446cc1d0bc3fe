package elector

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Election is one named election as seen by one candidate: it campaigns for the key, holds
// it, notices losing it, resigns it, and observes who else holds it.
//
// State flows one way: the campaign loop reads the store and publishes immutable Terms; the
// hot path (Enter, Check) loads the newest Term and reads the clock, and never waits on the
// store.
type Election struct {
	c    *Candidate
	name string

	term     atomic.Pointer[Term]
	inflight atomic.Int64 // admitted gated requests that have not finished
	// drainers counts the drains waiting for inflight to reach zero, and drainedMu guards
	// drained, closed and replaced when it does while one waits: a request's Exit pays
	// for the wake-up only then (see drain).
	drainers  atomic.Int32
	drainedMu sync.Mutex
	drained   chan struct{}
	// markKeys holds the MarkKeys of this instance's latest terms, newest first, so that
	// a forwarded request can be told from a forged one even when it arrives after the
	// term it was forwarded to has ended (it is then refused, not forwarded again).
	markKeys atomic.Pointer[[]termMarkKey]

	mu        sync.Mutex         // serialises publishing and the fields below
	changed   chan struct{}      // closed and replaced on every published change
	endTerm   context.CancelFunc // ends the Context of the term this instance holds
	handing   int64              // token of the term being handed over: it holds the key without admitting
	holdUntil time.Time          // campaign no sooner than this (after a resign)
	// standAsideFor names the instance a transfer goes to; until it is done (or times
	// out) this instance does not campaign.
	standAsideFor string
	// resignReason is the reason published when a resign lets go of the key.
	resignReason string
	// prev is the last term held by someone else that this instance saw, and settling
	// the token of this instance's own term while it waits for prev to be over.
	prev     observedTerm
	settling int64
	// own is this instance's latest term, which its next term may follow.
	own ownTerm
	// releasingAgain is the token of a released term whose key reappeared and is being
	// released once more (see releaseAgainLocked).
	releasingAgain int64
	// vacated is the vacancy the campaign loop's watch showed last, for the read that
	// follows it (campaign loop only).
	vacated *Observation
	// lastLease is the lease of the campaign loop's current pass (campaign loop only).
	lastLease *lease
	// campaign is the newest campaign request this instance sent: the record it wrote
	// and when it sent it. A term it wins starts its heartbeat deadline from there.
	campaign struct {
		rec  Record
		sent time.Time
	}
	// writeMu serialises this instance's heartbeats, and guards encoded.
	writeMu sync.Mutex
	encoded recordCodec
	// decoded is the last holder's record observe decoded; e.mu guards it.
	decoded recordCodec
	// releasing is the token of this instance's term whose release has begun: that term
	// admits nothing any more (see Term.Releasing).
	releasing int64
	// letGo is the token of the newest term of this instance's that it released: a watch
	// may still replay earlier writes of that term's key (its heartbeats), which must not
	// make the term look held again.
	letGo int64
	// transferHere is the intent of a transfer to this instance while it is pending:
	// winning the key completes it, and that intent is then cleared so that the others
	// campaign again.
	transferHere []byte
	// intentSeen is the election's intent as this instance's watch of it last reported
	// it (nil: none), and intentChanged is closed and replaced at every report.
	intentSeen    []byte
	intentChanged chan struct{}

	fs electionFailsafe
	// errands is what this instance does with the errands it is asked (errand.go).
	errands errandSlot

	// other is the newest term held by another instance, and ownPast the newest of this
	// instance's that ended, for the history (see history.go).
	other, ownPast lastOther
	namedPrev      named
	// heard is the latest acknowledgement of a term's end that this instance read, and
	// ending why this instance let go of its own latest term that it let go of or saw
	// end (what its release or acknowledgement says).
	heard, ending endOfTerm

	// announced is the lease under which this candidate last announced itself, and
	// announcedValue what it announced (campaign loop only).
	announced      LeaseID
	announcedValue []byte
	// layer4 is the layer-4 address this candidate announces (see SetLayer4Address).
	layer4 atomic.Pointer[string]
	// fleetTTL is the largest TTL (a time.Duration) another candidate of the election
	// announced, and ttlMismatch the candidates whose TTL differs from this one's that
	// were logged (id and TTL).
	fleetTTL    atomic.Int64
	ttlMismatch sync.Map
	// registry is the view of the election's candidates (see registry.go).
	registry registryView
	// leaderless is set while the view lists candidates none of which can lead, once
	// that has been logged.
	leaderless atomic.Bool
	// shared is the set's registry this election announces itself in and reads, if it
	// shares one (sharedregistry.go).
	shared atomic.Pointer[sharedMember]
	// placement is the election's own ranking of the candidates, if it has one
	// (placement.go).
	placement atomic.Pointer[placement]
	// moveLog sums up the moves of the shard set the election is a shard of, if any
	// (movelog.go).
	moveLog atomic.Pointer[MoveLog]

	users     int // guarded by c.mu
	startOnce sync.Once
	stopOnce  sync.Once
	cancel    context.CancelFunc
	done      chan struct{}
	resync    chan struct{} // buffered: asks the loop to read the key again now
	// following is the campaign loop's current follow, while it has one (follower.go).
	following atomic.Pointer[follower]
}

func newElection(c *Candidate, name string) *Election {
	e := &Election{
		c:       c,
		name:    name,
		changed: make(chan struct{}),
		done:    make(chan struct{}),
		resync:  make(chan struct{}, 1),
		drained: make(chan struct{}),

		intentChanged: make(chan struct{}),

		registry: newRegistryView(),
	}
	e.fs.unknownUntil = c.now().Add(c.cfg.TTL)
	e.term.Store(&Term{Election: name, Self: c.cfg.ID, Reason: "starting", At: c.now(), end: ended})
	return e
}

// Name is the election's name.
func (e *Election) Name() string { return e.name }

// Candidate is the candidate taking part in this election.
func (e *Election) Candidate() *Candidate { return e.c }

// Term returns the newest snapshot of the election.
func (e *Election) Term() *Term { return e.term.Load() }

// Changed returns a channel that is closed at the next change of the election's Term.
func (e *Election) Changed() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.changed
}

// Start makes the election campaign (as soon as the candidate has a lease). Idempotent.
func (e *Election) Start() {
	e.startOnce.Do(func() {
		// Close waits for the loop, so it is registered under the same lock that Close
		// takes to mark the candidate closed.
		e.c.mu.Lock()
		defer e.c.mu.Unlock()
		if e.c.closed {
			return
		}
		ctx, cancel := context.WithCancel(e.c.ctx)
		e.mu.Lock()
		e.cancel = cancel
		e.mu.Unlock()
		// A shard set's watches keep this election's view of the registry and, where
		// the store can watch the set's intents at once, its intents.
		shared := e.shared.Load()
		if shared != nil {
			shared.reg.join(ctx, e, shared.shard)
		} else {
			e.c.loops.Add(1)
			go func() {
				defer e.c.loops.Done()
				e.followRegistry(ctx)
			}()
		}
		if shared == nil || !shared.reg.followsIntents() {
			e.c.loops.Add(1)
			go func() {
				defer e.c.loops.Done()
				e.followIntents(ctx)
			}()
		}
		e.c.loops.Add(1) // run counts it done when it ends (it may park and go on later)
		go e.run(ctx)
		if shared == nil { // else the set's loop asks (sharedpreempt.go)
			e.c.loops.Add(1)
			go func() {
				defer e.c.loops.Done()
				e.preempt(ctx)
			}()
		}
	})
}

// kick asks the campaign loop to read the key again without waiting for the watch.
func (e *Election) kick() {
	select {
	case e.resync <- struct{}{}:
	default:
	}
	if f := e.following.Load(); f != nil {
		f.wake()
	}
}

// heldOff reports whether this instance must stay out of the election now, and for how
// long at most (forever while it stands aside for a transfer, which kick ends).
func (e *Election) heldOff() (time.Duration, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.standAsideFor != "" {
		return forever, true
	}
	d := e.holdUntil.Sub(e.c.now())
	return d, d > 0
}
