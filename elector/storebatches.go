package elector

import (
	"context"
	"time"
)

// storeBatches are a candidate's store calls that go in batches where the store has a
// Batcher (groupCommit): the releases of its elections (a shard set's SIGTERM hands
// hundreds of shards over at once), and, where the store is a ClaimBatcher, the claims of
// a set's shards (a set's start claims hundreds at once); where it is a ReadBatcher, a
// set's reads of its keys and failsafe rosters (a start reads thousands at once).
type storeBatches struct {
	releases  groupCommit[releaseCall, struct{}]
	claims    groupCommit[claimCall, Observation]
	observes  groupCommit[string, Observation]
	histories groupCommit[string, [][]byte]
}

type releaseCall struct {
	term  HeldTerm
	lease LeaseID
	why   string
}

type claimCall struct {
	claim Claim
	lease LeaseID
	// sending, if not nil, is called as the claim's request is sent.
	sending func()
}

// newStoreBatches returns b's batches; timeout bounds each read or claim from the moment
// its request is sent.
func newStoreBatches(b Backend, timeout time.Duration) *storeBatches {
	s := &storeBatches{
		releases: groupCommit[releaseCall, struct{}]{
			single: func(ctx context.Context, r releaseCall) (struct{}, error) {
				return struct{}{}, b.Release(ctx, r.term.Election, r.term.Token, r.lease, r.why)
			},
			joins:    func(first, next releaseCall) bool { return next.lease == first.lease && next.why == first.why },
			election: func(r releaseCall) string { return r.term.Election },
		},
		observes:  readCommit(b.Observe, timeout),
		histories: readCommit(b.History, timeout),
		claims: groupCommit[claimCall, Observation]{
			single: func(ctx context.Context, c claimCall) (Observation, error) {
				return b.Campaign(ctx, c.claim.Election, c.claim.Value, c.lease)
			},
			joins:    func(first, next claimCall) bool { return next.lease == first.lease },
			election: func(c claimCall) string { return c.claim.Election },
			// A claim that waited for the batches before its own must not give up on a
			// request that was never late: its answer would be lost, and the term it won
			// would wait a whole ttl for a predecessor it could have named (at a SIGTERM
			// of an owner of 800 shards, 66 of the shards taken waited so).
			timeout: timeout,
			sending: func(c claimCall) {
				if c.sending != nil {
					c.sending()
				}
			},
		},
	}
	if rb, ok := b.(ReadBatcher); ok {
		s.observes.batch, s.histories.batch = rb.ObserveAll, rb.HistoryAll
	}
	if bb, ok := b.(Batcher); ok {
		s.releases.batch = func(ctx context.Context, rs []releaseCall) ([]struct{}, error) {
			terms := make([]HeldTerm, len(rs))
			for i, r := range rs {
				terms[i] = r.term
			}
			return make([]struct{}, len(rs)), bb.ReleaseAll(ctx, terms, rs[0].lease, rs[0].why)
		}
	}
	if bb, ok := b.(ClaimBatcher); ok {
		s.claims.batch = func(ctx context.Context, cs []claimCall) ([]Observation, error) {
			claims := make([]Claim, len(cs))
			for i, c := range cs {
				claims[i] = c.claim
			}
			return bb.CampaignAll(ctx, claims, cs[0].lease)
		}
	}
	return s
}

// release is Backend.Release, batched with the releases asked for meanwhile.
func (s *storeBatches) release(ctx context.Context, election string, token int64, lease LeaseID, why string) error {
	_, err := s.releases.call(ctx, releaseCall{term: HeldTerm{Election: election, Token: token}, lease: lease, why: why})
	return err
}

// batchesClaims reports whether claims go in batches (the store is a ClaimBatcher).
func (s *storeBatches) batchesClaims() bool { return s.claims.batch != nil }

// claim is Backend.Campaign, batched with the claims asked for meanwhile; sending, if not
// nil, is called as its request is sent.
func (s *storeBatches) claim(ctx context.Context, election string, value []byte, lease LeaseID, sending func()) (Observation, error) {
	return s.claims.call(ctx, claimCall{claim: Claim{Election: election, Value: value}, lease: lease, sending: sending})
}

// readCommit is the groupCommit of a read of one election's key or history (read), each
// request bounded by timeout from when it is sent: any two reads may share a batch.
func readCommit[Out any](read func(context.Context, string) (Out, error), timeout time.Duration) groupCommit[string, Out] {
	return groupCommit[string, Out]{
		single:   read,
		joins:    func(string, string) bool { return true },
		election: func(name string) string { return name },
		timeout:  timeout,
		most:     readsPerBatch,
	}
}

// readsPerBatch is how many reads one batch carries at most: a few requests' worth on etcd
// (100 gets each, 4 at once), one statement on PostgreSQL, each well within a request's
// timeout on a loaded store.
const readsPerBatch = 400
