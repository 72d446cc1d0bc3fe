package elector

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// A term of this instance may admit only once every term before it has certainly stopped
// admitting, and nothing that vouches for the term's end (its release, its
// acknowledgement, the retirement of an older roster) may be said before then either. What
// is still owed for that is one value, the term's proof, created when the term is won and
// carried, never re-derived, by every path a term can take:
//
//   - admission: the term is Settling while its proof is open (observe.go, Term.Leading);
//   - its end: Release and Acknowledge wait for the proof (handover.go), so an
//     acknowledgement vouches for every term before it, failsafe rides included;
//   - its successor in this process: a term that follows this instance's own term
//     inherits that term's proof, open or not (proofLocked);
//   - roster retirement: only a settled term writes over an older roster (failsafe_peer.go).
//
// A proof owes up to two things. Each is discharged in exactly one place and never owed
// again:
//
//   - owesHeartbeat: the term before (named by the store, or the last one seen), or terms
//     this instance never saw, may still admit on their last heartbeat. Discharged by that
//     term's acknowledgement, or once stoppedBy has passed on this host's clock (settle.go).
//   - owesFailsafe: an older term may still admit through a failsafe, while its roster's
//     members confirm it. Discharged once a member of the newest roster has promised to
//     confirm it no more and its last confirmation has run out, or the roster shows no
//     failsafe was possible (proveNoFailsafe).
type proof struct {
	// token is the term whose acknowledgement discharges the heartbeat obligation; 0 when
	// it is unknown (only the deadline can).
	token int64
	// stoppedBy is when the term before, and every term unseen before it, has certainly
	// stopped admitting on its heartbeat, on this host's clock.
	stoppedBy time.Time
	// fenceAs is the token of the term that first owed this proof: the newer term that a
	// fence names to the members of an older roster.
	fenceAs int64

	mu            sync.Mutex
	owesHeartbeat bool
	owesFailsafe  bool
	// reason is why the heartbeat obligation was discharged, for the published Term.
	reason string
	// noRoster is set when the failsafe proof found no roster with members in the
	// store: the term has nothing to retire (retireRoster).
	noRoster atomic.Bool
	proven   chan struct{} // closed once nothing is owed
}

// newProof returns the proof of term fenceAs, which owes a heartbeat proof for the term
// token (0: unknown) until stoppedBy when heartbeat is set, and a failsafe proof when
// failsafe is set.
func newProof(fenceAs, token int64, stoppedBy time.Time, heartbeat, failsafe bool) *proof {
	p := &proof{token: token, stoppedBy: stoppedBy, fenceAs: fenceAs,
		owesHeartbeat: heartbeat, owesFailsafe: failsafe, reason: "elected", proven: make(chan struct{})}
	if !heartbeat && !failsafe {
		close(p.proven)
	}
	return p
}

// owes reports what is still owed.
func (p *proof) owes() (heartbeat, failsafe bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.owesHeartbeat, p.owesFailsafe
}

// heartbeatProven discharges the heartbeat obligation, for reason.
func (p *proof) heartbeatProven(reason string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.owesHeartbeat {
		p.owesHeartbeat, p.reason = false, reason
		p.closeIfDoneLocked()
	}
}

// failsafeProven discharges the failsafe obligation.
func (p *proof) failsafeProven() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.owesFailsafe {
		p.owesFailsafe = false
		p.closeIfDoneLocked()
	}
}

func (p *proof) closeIfDoneLocked() {
	if !p.owesHeartbeat && !p.owesFailsafe {
		close(p.proven)
	}
}

// isProven reports whether nothing is owed any more.
func (p *proof) isProven() bool {
	select {
	case <-p.proven:
		return true
	default:
		return false
	}
}

// why is the reason the term may admit: how the heartbeat obligation was discharged.
func (p *proof) why() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reason
}

// wait blocks until nothing is owed, or until ctx ends; it reports whether nothing is. The
// heartbeat obligation is discharged here too once its deadline has passed on now's clock;
// the acknowledgement and the failsafe proof are someone else's to find (settle and
// proveNoFailsafe), which never stop looking while the candidate runs.
func (p *proof) wait(ctx context.Context, now func() time.Time) bool {
	for !p.isProven() {
		poll := 100 * time.Millisecond // the clock that counts may be a test's: poll it
		if heartbeat, _ := p.owes(); heartbeat {
			left := p.stoppedBy.Sub(now())
			if left <= 0 {
				p.heartbeatProven(p.timedOutReason())
				continue
			}
			poll = min(poll, left)
		}
		timer := time.NewTimer(poll)
		select {
		case <-ctx.Done():
			timer.Stop()
			return false
		case <-p.proven:
		case <-timer.C:
		}
		timer.Stop()
	}
	return true
}

// timedOutReason is why a term admits whose heartbeat obligation ran out by the deadline.
func (p *proof) timedOutReason() string {
	if p.token == 0 {
		return ReasonUnseenWaitedOut
	}
	return ReasonPredecessorTimedOut
}

// nothingOwed is the proof of a term that follows only proven terms and owes no failsafe
// proof.
var nothingOwed = newProof(0, 0, time.Time{}, false, false)
