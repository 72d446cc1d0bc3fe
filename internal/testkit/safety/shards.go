package safety

import (
	"fmt"
	"slices"
	"time"
)

// CheckShards applies Check's rule to each shard's arrivals on its own, for a fleet with a
// shard set (see fleet.Config.Shards): every shard is an election with its own terms and
// tokens, so one shard's term says nothing of another's. The report sums the shards'
// stale, wrong-token, double and late arrivals; its Takeover is the slowest shard's, among
// those whose term changed after the fault. A shard's term at the fault is the newest that
// had arrived before it; a shard with no arrival before the fault counts as moved for no
// term. Arrivals without a shard are counted as unstamped. OldLastAdmit is the latest
// admission of a term at the fault that instance faulted served (any instance's, if
// faulted is empty): the fault's target must stop by its lease deadline, while a shard
// another instance owned may move later, and gracefully, as placement settles. When struck
// names shards, only their terms count there: a fault that struck those shards' keys and
// only slowed the instance's links leaves its other shards' leases renewable, so their
// last admission is not bounded by the fault.
func CheckShards(name string, results []Outcome, log []Arrival, faultAt, loadEnd time.Time, faulted string, struck ...int) Report {
	rep := Check(name, results, nil, 0, time.Time{}, time.Time{})
	rep.Takeover = -1
	byShard := map[int][]Arrival{}
	before := map[int]int64{} // each shard's newest token to arrive before the fault
	servedBy := map[int64]string{}
	for _, a := range log {
		if a.Shard < 0 {
			rep.Unstamp++
			rep.problem("request %s (served by %q) arrived without a shard", a.ReqID, a.ServedBy)
			continue
		}
		byShard[a.Shard] = append(byShard[a.Shard], a)
		servedBy[a.Token] = a.ServedBy
		if a.At.Before(faultAt) {
			before[a.Shard] = max(before[a.Shard], a.Token)
		}
	}
	list := make([]int, 0, len(byShard))
	for shard := range byShard {
		list = append(list, shard)
	}
	slices.Sort(list)
	for _, shard := range list {
		r := Check(name, nil, byShard[shard], before[shard], faultAt, loadEnd)
		rep.Shards++
		rep.ShardTerms += len(r.Terms)
		rep.Stale += r.Stale
		rep.StaleWrong += r.StaleWrong
		rep.Wrong += r.Wrong
		rep.Double += r.Double
		rep.DoubleSpan = max(rep.DoubleSpan, r.DoubleSpan)
		rep.Late += r.Late
		rep.Overlap = max(rep.Overlap, r.Overlap)
		rep.Unstamp += r.Unstamp
		for _, p := range r.Problems {
			rep.problem("shard %d: %s", shard, p)
		}
		if before[shard] != 0 && r.Takeover >= 0 {
			rep.ShardsMoved++
			rep.Takeover = max(rep.Takeover, r.Takeover)
			if (faulted == "" || servedBy[before[shard]] == faulted) && (len(struck) == 0 || slices.Contains(struck, shard)) {
				rep.OldLastAdmit = max(rep.OldLastAdmit, r.OldLastAdmit)
			}
		}
	}
	if !faultAt.IsZero() {
		rep.NoLeader = longestSilence(log, faultAt, loadEnd)
	}
	return rep
}

// problem keeps the first few offending arrivals, for the test's error.
func (r *Report) problem(format string, args ...any) {
	if len(r.Problems) < 10 {
		r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
	}
}
