// Package electionstatus is an election as an instance reports it: the admin API's GET /leader/, read by `caddy leader status` and the status page.
package electionstatus

import (
	"context"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
)

// Of is election e as GET /leader/ reports it at now. It reads the store's registry of
// candidates: one request, bounded by ctx and the election's request timeout; a failed read
// leaves Candidates empty and says why in CandidatesError.
func Of(ctx context.Context, e *elector.Election, now time.Time) Election {
	return withCandidates(ctx, statusOf(e, now), e)
}

// Local is election e as Of reports it, without the store's registry of candidates: this
// instance's own view, which asks the store nothing and so answers at once even when the
// store does not.
func Local(e *elector.Election, now time.Time) Election {
	return statusOf(e, now)
}

// Election is one election as GET /leader/ reports it.
type Election struct {
	// Election is the election's name.
	Election string `json:"election"`
	// Self is this instance's instance_id.
	Self string `json:"self"`
	// Role is leader, settling (holds the key and waits for the previous term to be proven
	// over), handing_over, follower, or candidate (no leader known); see RoleLeader.
	Role string `json:"role"`
	// LeaderID is the current leader's instance_id; empty while none is known.
	LeaderID string `json:"leader_id,omitempty"`
	// LeaderURL is the current leader's advertise URL; empty while none is known.
	LeaderURL string `json:"leader_url,omitempty"`
	// Token is the fencing token of the current term; 0 while no leader is known.
	Token int64 `json:"token,omitempty"`
	// TermStart is when the current term began.
	TermStart time.Time `json:"term_start,omitzero"`
	// LeaseRemaining is how long this instance's lease deadline is ahead, in seconds.
	LeaseRemaining float64 `json:"lease_remaining_seconds"`
	// LastContact is when etcd last confirmed this instance's lease.
	LastContact time.Time `json:"last_etcd_contact,omitzero"`
	// InFlight counts the gated requests this instance admitted that are still running.
	InFlight int64 `json:"in_flight"`
	// Healthy is what the leader_health handler and the leader_candidate matcher test: this
	// instance takes part and its lease is live. A held-off instance is healthy.
	Healthy bool `json:"healthy"`
	// Priority is this instance's priority option; 0 never leads.
	Priority int `json:"priority"`
	// Preempt is this instance's preempt option.
	Preempt bool `json:"preempt,omitempty"`
	// HoldOff is how long this instance still stays out of the election after a resign or
	// a step-down, in seconds; 0 when it is free to campaign.
	HoldOff float64 `json:"hold_off_seconds"`
	// Leaving is set while this instance leaves the election (a graceful stop).
	Leaving bool `json:"leaving,omitempty"`
	// Reason says why the last change of this election's state happened.
	Reason string `json:"reason"`
	// Changed is when that change happened.
	Changed time.Time `json:"changed_at"`
	// Candidates are the election's live candidates, this instance included, as the
	// store's registry lists them: the whole fleet, seen from any instance.
	Candidates []Candidate `json:"candidates"`
	// CandidatesError says why the registry could not be read; Candidates is then empty.
	CandidatesError string `json:"candidates_error,omitempty"`
	// Failsafe is the election's failsafe state; absent when failsafe is off.
	Failsafe *elector.FailsafeStatus `json:"failsafe,omitempty"`
}

// Candidate is one live candidate of an election as GET /leader/ reports it.
type Candidate struct {
	// ID is the candidate's instance_id.
	ID string `json:"id"`
	// URL is the candidate's advertise URL.
	URL string `json:"url,omitempty"`
	// Healthy means what it means for this instance (see Election.Healthy): the
	// candidate takes part (its registry entry lives with its lease) and is not leaving. A
	// held-off candidate is healthy.
	Healthy bool `json:"healthy"`
	// Priority is the candidate's priority option; 0 never campaigns.
	Priority int `json:"priority"`
	// Preempt is the candidate's preempt option.
	Preempt bool `json:"preempt,omitempty"`
	// HoldOffUntil is when the candidate's hold-off ends, while it is held off.
	HoldOffUntil time.Time `json:"hold_off_until,omitzero"`
	// Leaving is set while the candidate leaves the election (a graceful stop).
	Leaving bool `json:"leaving,omitempty"`
}

// withCandidates adds the election's live candidates to s, reading the store's registry.
func withCandidates(ctx context.Context, s Election, e *elector.Election) Election {
	list, err := e.Candidates(ctx)
	s.Candidates = []Candidate{}
	if err != nil {
		s.CandidatesError = err.Error()
		return s
	}
	for _, c := range list {
		s.Candidates = append(s.Candidates, Candidate{ID: c.ID, URL: c.URL, Healthy: !c.Leaving, Priority: c.Priority,
			Preempt: c.Preempt, HoldOffUntil: c.HoldOffUntil, Leaving: c.Leaving})
	}
	return s
}

func statusOf(e *elector.Election, now time.Time) Election {
	t := e.Term()
	var fs *elector.FailsafeStatus
	if st := e.Failsafe(); st.Enabled {
		fs = &st
	}
	holdOff, leaving := e.HoldOff()
	return Election{
		Failsafe:       fs,
		Election:       t.Election,
		Self:           t.Self,
		Role:           RoleOf(t, now),
		LeaderID:       t.Leader.ID,
		LeaderURL:      t.Leader.URL,
		Token:          t.Token,
		TermStart:      t.Leader.Since,
		LeaseRemaining: e.Candidate().LeaseRemaining().Seconds(),
		LastContact:    e.Candidate().LastContact(),
		InFlight:       e.InFlight(),
		Healthy:        e.Healthy(),
		Priority:       e.Candidate().Priority(),
		Preempt:        e.Candidate().Preempts(),
		HoldOff:        holdOff.Seconds(),
		Leaving:        leaving,
		Reason:         t.Reason,
		Changed:        t.At,
	}
}
