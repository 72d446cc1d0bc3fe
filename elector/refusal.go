package elector

import (
	"errors"
	"time"
)

// The refusals of the handover requests (Transfer, RequestResign), so that a caller can
// tell a request that cannot be honoured from a store that failed. ErrNotCandidate is one
// of them too.
var (
	// ErrNeverLeads: the target of a transfer has priority 0.
	ErrNeverLeads = errors.New("has priority 0, so it never leads")
	// ErrTargetOut: the target of a transfer does not campaign now (it is held off after
	// a resign or a step-down, unhealthy, or leaving): the leader would let go and nobody
	// would take over.
	ErrTargetOut = errors.New("does not campaign now")
	// ErrNoLeader: a resign was asked while no leader of the election is known.
	ErrNoLeader = errors.New("no leader is known")
	// ErrTransferTimeout: the target of a transfer did not lead within the timeout.
	ErrTransferTimeout = errors.New("the target did not lead in time")
	// ErrTransferSuperseded: another handover request (a transfer to another instance,
	// asked at about the same moment) replaced this transfer's in the store, and the
	// fleet follows that one.
	ErrTransferSuperseded = errors.New("another handover request replaced it")
)

// HoldOff is how long this instance still stays out of the election after a resign or a
// step-down, and whether it is leaving it for good (a graceful stop). Zero when it is free
// to campaign.
func (e *Election) HoldOff() (left time.Duration, leaving bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	d := e.holdUntil.Sub(e.c.now())
	if d > forever/2 {
		return 0, true
	}
	return max(d, 0), false
}

// Preempts reports whether this candidate takes leadership from a leader of lower priority.
func (c *Candidate) Preempts() bool { return c.prio.preempt.Load() }
