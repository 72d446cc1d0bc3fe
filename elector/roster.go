package elector

import (
	"bytes"
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
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

// baseInfo is what this candidate announces in every election, healthy and not held off.
func (c *Candidate) baseInfo() CandidateInfo {
	info := CandidateInfo{ID: c.cfg.ID, URL: c.cfg.URL, Healthy: true, Priority: c.Priority(),
		Preempt: c.Preempts(), Boot: c.boot, TTL: c.cfg.TTL}
	if f := c.cfg.Failsafe; f != nil {
		info.Failsafe = f.URL
	}
	return info
}

// info is what this candidate announces in e now.
func (e *Election) info() CandidateInfo {
	now := e.c.now()
	e.mu.Lock()
	until := e.holdUntil
	e.mu.Unlock()
	info := e.c.baseInfo()
	info.Healthy = !until.After(now)
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
	if m := e.shared.Load(); m != nil {
		list, err := m.reg.candidates(ctx, m.shard)
		if err == nil {
			e.fleetTTL.Store(max(e.fleetTTL.Load(), m.reg.fleetTTL.Load()))
		}
		return list, err
	}
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
	noteTTLs(e.c, e.name, list, &e.fleetTTL, &e.ttlMismatch)
}

// noteTTLs raises fleetTTL to the largest TTL in list, and logs each mismatch (as
// candidate and TTL) that mismatches has not seen, for the election (or shard set) named
// name.
func noteTTLs(self *Candidate, name string, list []CandidateInfo, fleetTTL *atomic.Int64, mismatches *sync.Map) {
	for _, c := range list {
		if c.TTL <= 0 || c.ID == self.cfg.ID && c.Boot == self.boot {
			continue
		}
		for {
			cur := fleetTTL.Load()
			if int64(c.TTL) <= cur || fleetTTL.CompareAndSwap(cur, int64(c.TTL)) {
				break
			}
		}
		if c.TTL == self.cfg.TTL {
			continue
		}
		if _, seen := mismatches.LoadOrStore(c.ID+"/"+c.TTL.String(), true); !seen {
			self.log().Error("candidates of one election use different ttls; every instance must use the same, and until they do this one waits out unseen terms with the largest",
				zap.String("election", name), zap.String("instance_id", c.ID), zap.Duration("their_ttl", c.TTL),
				zap.String("self", self.cfg.ID), zap.Duration("ttl", self.cfg.TTL))
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
	if m := e.shared.Load(); m != nil {
		_ = m.reg.announce(ctx, l, e, m.shard)
		return
	}
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
