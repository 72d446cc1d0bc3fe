package elector

import (
	"bytes"
	"context"
	"encoding/json"
	"time"

	"go.uber.org/zap"
)

// The roster is the store's registry of live candidates: each one announces itself in each
// of its elections under its lease (so its entry goes when it does), with what an operator
// needs to see the whole fleet from any instance: where to reach it and whether it is fit
// to lead.

// CandidateInfo is what a candidate announces about itself in an election.
type CandidateInfo struct {
	// ID is the candidate's instance id.
	ID string `json:"id"`
	// URL is the candidate's advertise URL; may be empty.
	URL string `json:"url,omitempty"`
	// Healthy is false while the candidate stays out of the election: it resigned with a
	// hold-off, stepped down for an unhealthy service, or is leaving.
	Healthy bool `json:"healthy"`
	// Priority ranks the candidate (see priority.go): 0 never campaigns.
	Priority int `json:"priority"`
	// Failsafe is the URL of the candidate's failsafe endpoint; empty without failsafe.
	Failsafe string `json:"failsafe,omitempty"`
	// Preempt is set on a candidate that takes leadership from a leader of lower priority.
	Preempt bool `json:"preempt,omitempty"`
	// HoldOffUntil is when the candidate's hold-off ends (its wall clock), while it is held
	// off after a resign or a step-down; zero otherwise.
	HoldOffUntil time.Time `json:"hold_off_until,omitzero"`
	// Leaving is set on a candidate that is leaving the election (a graceful stop).
	Leaving bool `json:"leaving,omitempty"`
	// Boot names this candidate's process: random at every start, so that a roster, a
	// confirmation or a fence never mistakes another process under the same id (a new VM
	// with the old hostname, a rescheduled pod) for this one.
	Boot string `json:"boot,omitempty"`
	// TTL is the lease TTL this candidate asks for. Every instance of an election must
	// use the same; one that waits out a term it never saw uses the largest it knows of.
	TTL time.Duration `json:"ttl,omitempty"`
	// Layer4 is the address (host:port) at which peers reach this candidate's layer-4
	// services of the election when it leads (see Election.SetLayer4Address); may be empty.
	Layer4 string `json:"layer4,omitempty"`
}

// info is what this candidate announces in e now.
func (e *Election) info() CandidateInfo {
	now := e.c.now()
	e.mu.Lock()
	until := e.holdUntil
	e.mu.Unlock()
	info := CandidateInfo{ID: e.c.cfg.ID, URL: e.c.cfg.URL, Healthy: !until.After(now), Priority: e.c.Priority(),
		Preempt: e.c.Preempts(), Boot: e.c.boot, TTL: e.c.cfg.TTL}
	if f := e.c.cfg.Failsafe; f != nil {
		info.Failsafe = f.URL
	}
	switch left := until.Sub(now); {
	case left > forever/2:
		info.Leaving = true
	case left > 0:
		// Rounded to the second so that the announced value stays the same while the
		// hold-off lasts; Round(0) drops the monotonic reading, which JSON cannot carry.
		info.HoldOffUntil = now.Add(left).Round(0).Truncate(time.Second)
	}
	info.Layer4 = e.layer4Address()
	return info
}

func (i CandidateInfo) encode() []byte {
	b, _ := json.Marshal(i) // strings and bools always marshal
	return b
}

// Candidates lists the live candidates of the election as the store has them, sorted by
// id. An entry whose value this plugin did not write is listed with its id only. It blocks
// for one store request at most.
func (e *Election) Candidates(ctx context.Context) ([]CandidateInfo, error) {
	rctx, cancel := context.WithTimeout(ctx, e.c.requestTimeout)
	defer cancel()
	entries, err := e.c.cfg.Backend.Candidates(rctx, e.name)
	if err != nil {
		return nil, err
	}
	list := decodeCandidates(entries)
	e.noteTTLs(list)
	return list, nil
}

// noteTTLs remembers the largest TTL the candidates in list announced, and logs an error,
// once per candidate and TTL, for each that differs from this one's: a term held under a
// longer TTL than the one a successor waits with could still admit when it starts.
func (e *Election) noteTTLs(list []CandidateInfo) {
	for _, c := range list {
		if c.TTL <= 0 || c.ID == e.c.cfg.ID && c.Boot == e.c.boot {
			continue
		}
		for {
			cur := e.fleetTTL.Load()
			if int64(c.TTL) <= cur || e.fleetTTL.CompareAndSwap(cur, int64(c.TTL)) {
				break
			}
		}
		if c.TTL == e.c.cfg.TTL {
			continue
		}
		if _, seen := e.ttlMismatch.LoadOrStore(c.ID+"/"+c.TTL.String(), true); !seen {
			e.c.log().Error("candidates of one election use different ttls; every instance must use the same, and until they do this one waits out unseen terms with the largest",
				zap.String("election", e.name), zap.String("instance_id", c.ID), zap.Duration("their_ttl", c.TTL),
				zap.String("self", e.c.cfg.ID), zap.Duration("ttl", e.c.cfg.TTL))
		}
	}
}

// waitTTL is the TTL with which this instance, holding lease l, waits out a term it cannot
// account for: the largest of its own, the one the store granted and any that another
// candidate announced.
func (e *Election) waitTTL(l *lease) time.Duration {
	return max(e.c.cfg.TTL, l.granted, time.Duration(e.fleetTTL.Load()))
}

// announce records this candidate as live under lease l, once per lease and again whenever
// what it announces changes (the campaign loop calls it on every pass, and a resign or the
// end of a hold-off makes a pass).
func (e *Election) announce(ctx context.Context, l *lease) {
	value := e.info().encode()
	if e.announced == l.id && bytes.Equal(e.announcedValue, value) {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, e.c.requestTimeout)
	defer cancel()
	if err := e.c.cfg.Backend.Announce(rctx, e.name, e.c.cfg.ID, value, l.id); err == nil {
		e.announced, e.announcedValue = l.id, value
	}
}
