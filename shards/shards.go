// Package shards maps keys to the shards of a shard set and places each shard on one
// instance of the fleet, the same way on every instance and without a coordinator.
//
// A key's shard is FNV-1a (64 bits) of the key's bytes, modulo the number of shards:
// reproducible in any language, and the same on every instance and every release. A shard's
// preferred owner is found by weighted rendezvous hashing (highest random weight): every
// live candidate gets a score for the shard from its id, the shard's number and its
// priority, and the highest score wins. When a candidate joins or leaves, only the shards
// whose winner changed move, about 1/n of them, each to or from that candidate; no
// other shard moves.
package shards

import (
	"math"
	"strconv"
)

// FNV-1a 64-bit parameters (the same as Go's hash/fnv, Python's fnvhash, ...).
const (
	fnvOffset uint64 = 14695981039346656037
	fnvPrime  uint64 = 1099511628211
)

// Hash is FNV-1a (64 bits) of key's bytes.
func Hash(key string) uint64 {
	h := fnvOffset
	for i := 0; i < len(key); i++ {
		h ^= uint64(key[i])
		h *= fnvPrime
	}
	return h
}

// Of is the shard of key in a set of count shards: Hash(key) mod count. count is above 0.
func Of(key string, count int) int {
	return int(Hash(key) % uint64(count))
}

// Score is the rendezvous score of the candidate id (of priority weight) for shard: the
// candidate with the highest score is the shard's preferred owner. A weight of 0 or less
// scores -Inf: such a candidate owns nothing. Weights scale a candidate's share: one of
// priority 2 is preferred for about twice as many shards as one of priority 1.
//
// The score is weight / -ln(u), with u = (mix(Hash(id + "/" + shard)) >> 11 + 0.5) / 2^53,
// a number in (0, 1); mix is MurmurHash3's 64-bit finalizer, which FNV-1a needs here
// because ids that differ only in their last bytes would otherwise score alike.
func Score(id string, shard int, weight int) float64 {
	if weight <= 0 {
		return math.Inf(-1)
	}
	var buf [20]byte
	h := fnvOffset
	for i := 0; i < len(id); i++ {
		h = (h ^ uint64(id[i])) * fnvPrime
	}
	h = (h ^ '/') * fnvPrime
	for _, b := range strconv.AppendInt(buf[:0], int64(shard), 10) {
		h = (h ^ uint64(b)) * fnvPrime
	}
	u := (float64(mix(h)>>11) + 0.5) / (1 << 53)
	return float64(weight) / -math.Log(u)
}

// mix is MurmurHash3's fmix64.
func mix(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// Candidate is one instance that may own shards.
type Candidate struct {
	// ID is the instance's id.
	ID string
	// Weight is its priority: 0 or less owns nothing.
	Weight int
}

// Owner is the preferred owner of shard among candidates: the one with the highest Score
// (ties, which need equal 53-bit hashes, go to the smaller id). It is "" when no candidate
// has a weight above 0.
func Owner(shard int, candidates []Candidate) string {
	best, owner := math.Inf(-1), ""
	for _, c := range candidates {
		s := Score(c.ID, shard, c.Weight)
		if s > best || s == best && owner != "" && c.ID < owner {
			best, owner = s, c.ID
		}
	}
	return owner
}

// Placement is the preferred owner of every shard of a set of count shards.
func Placement(count int, candidates []Candidate) []string {
	owners := make([]string, count)
	for s := range owners {
		owners[s] = Owner(s, candidates)
	}
	return owners
}
