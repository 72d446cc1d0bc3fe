package elector

import (
	"context"
	"sync"
)

// Batcher is what a store adds to Backend to serve many elections in one request: a shard
// set's thousands of shards are each an election, and one request per shard for every claim,
// release and expiry is what stops a set at a few hundred shards (see BENCHMARKS.md).
//
// Each call is the batched form of the Backend call it names, with the same meaning for
// every election in the batch, as if that call had been made for each of them alone: each
// election keeps its own compare-and-swap, its own result and its own strictly increasing
// tokens, and one election's failed guard never undoes another's write. A batch is not
// atomic as a whole: the store may split it into several requests (etcd bounds the
// operations of one transaction), so when a call returns an error, any part of it may
// have taken effect, and the caller reads again, as it does after any Backend error.
// Elections of one batch may get the same token: tokens of different elections are
// unrelated. A batch names each election at most once.
//
// Because each election's outcome is exactly the single call's, instances that campaign
// one election at a time and instances that campaign in batches can share elections
// without giving one a second holder: the store's compare-and-swap decides either way.
// The conformance suite in elector/electortest (RunBatch) checks these rules.
type Batcher interface {
	// CampaignAll is Campaign for each of claims, all bound to lease. The observations
	// come in the order of claims. It fails (ErrLeaseNotFound, or another error) and creates
	// nothing if lease is gone.
	CampaignAll(ctx context.Context, claims []Claim, lease LeaseID) ([]Observation, error)
	// ReleaseAll is Release for each of terms, all held under lease, each acknowledged for
	// why.
	ReleaseAll(ctx context.Context, terms []HeldTerm, lease LeaseID, why string) error
	// ExpireAll is Expire for each of terms; it reports, in their order, which keys it
	// deleted.
	ExpireAll(ctx context.Context, terms []HeldTerm) ([]bool, error)
}

// ClaimBatcher is a Batcher whose CampaignAll may carry the claims that a shard set's
// shards make one by one (each asked when its own loop gets there), batched with the claims
// asked meanwhile. That takes a store whose batch holds no lock that another instance's
// claim of the same keys waits for: etcd applies a transaction at once. On a store whose
// batch is one transaction that holds the keys' row locks until it ends (PostgreSQL),
// instances claiming overlapping keys in batches wait for each other's whole batch, and a
// start of 1,024 shards took minutes instead of seconds (BENCHMARKS.md §12), so it claims
// one key per request there.
type ClaimBatcher interface {
	Batcher
	// BatchesClaims says nothing; it marks the store as one whose batched claims take no
	// lock across the batch.
	BatchesClaims()
}

// Claim is one election a batched campaign tries to win, with the value its key gets.
type Claim struct {
	Election string
	Value    []byte
}

// HeldTerm names one election's term in a batch: its token and, for ExpireAll, the store
// revision of the observation in which the caller saw the key last.
type HeldTerm struct {
	Election string
	Token    int64
	Rev      int64
}

// Batched is b's Batcher: b itself when its store batches, or else one that makes one
// Backend call per election, so that a caller has one way to write many elections
// whatever the store.
func Batched(b Backend) Batcher {
	if bb, ok := b.(Batcher); ok {
		return bb
	}
	return oneByOne{b}
}

// oneByOne is the Batcher of a store that cannot batch: one request per election.
type oneByOne struct{ b Backend }

func (o oneByOne) CampaignAll(ctx context.Context, claims []Claim, lease LeaseID) ([]Observation, error) {
	out := make([]Observation, len(claims))
	for i, c := range claims {
		obs, err := o.b.Campaign(ctx, c.Election, c.Value, lease)
		if err != nil {
			return nil, err
		}
		out[i] = obs
	}
	return out, nil
}

func (o oneByOne) ReleaseAll(ctx context.Context, terms []HeldTerm, lease LeaseID, why string) error {
	for _, t := range terms {
		if err := o.b.Release(ctx, t.Election, t.Token, lease, why); err != nil {
			return err
		}
	}
	return nil
}

func (o oneByOne) ExpireAll(ctx context.Context, terms []HeldTerm) ([]bool, error) {
	out := make([]bool, len(terms))
	for i, t := range terms {
		deleted, err := o.b.Expire(ctx, t.Election, t.Token, t.Rev)
		if err != nil {
			return nil, err
		}
		out[i] = deleted
	}
	return out, nil
}

// Interface guard.
var _ Batcher = oneByOne{}

// HeartbeatBatcher is implemented by a store that carries the heartbeats of many
// elections in one request: a shard set's held keys, all rewritten at every renewal. The
// elections of a set whose store has it are kept alive by one loop per set and lease
// (sharedbeat.go), not a loop per held shard.
type HeartbeatBatcher interface {
	// UpdateAll is Update for each of updates; the results come in their order. A
	// failure of one update fails that one alone.
	UpdateAll(ctx context.Context, updates []KeyUpdate) []UpdateResult
}

// KeyUpdate is one Update of a batch: the term token's key of election gets value.
type KeyUpdate struct {
	Election string
	Token    int64
	Value    []byte
}

// UpdateResult is what Update returned for one KeyUpdate.
type UpdateResult struct {
	Updated bool
	Err     error
}

// UpdateEach makes each of updates with update (a Backend's Update, say), one request
// each, at most parallel at once: a HeartbeatBatcher's way with the updates it cannot
// batch, and the conformance suite's with a store that has none.
func UpdateEach(ctx context.Context, updates []KeyUpdate, parallel int, update func(ctx context.Context, election string, token int64, value []byte) (bool, error)) []UpdateResult {
	out := make([]UpdateResult, len(updates))
	turns := make(chan struct{}, max(parallel, 1))
	var wg sync.WaitGroup
	for i, u := range updates {
		turns <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-turns; wg.Done() }()
			out[i].Updated, out[i].Err = update(ctx, u.Election, u.Token, u.Value)
		}()
	}
	wg.Wait()
	return out
}

// ReadBatcher is what a store adds to Backend to read many elections in one request. A
// shard set's shards read at the same moments: at a start, every shard this instance is
// not preferred for reads its key before it yields, and every shard it wins reads its
// failsafe roster before it admits (twice: to prove no older term rides a failsafe, and
// to retire the roster). One request per shard made a cold start of 4,096 shards take
// three times as long as the proof it waits for (BENCHMARKS.md §12).
//
// Each call is the batched form of the Backend call it names: for every election, the
// answer that call would have given at some moment between the call's start and its end.
// A batch need not be read at one moment (etcd splits it over requests). A batch names
// each election at most once.
type ReadBatcher interface {
	// ObserveAll is Observe for each of elections; the observations come in their order.
	ObserveAll(ctx context.Context, elections []string) ([]Observation, error)
	// HistoryAll is History for each of elections, in their order.
	HistoryAll(ctx context.Context, elections []string) ([][][]byte, error)
}

// BatchedReads is b's ReadBatcher: b itself when its store batches reads, or else one that
// makes one Backend call per election.
func BatchedReads(b Backend) ReadBatcher {
	if rb, ok := b.(ReadBatcher); ok {
		return rb
	}
	return oneByOne{b}
}

func (o oneByOne) ObserveAll(ctx context.Context, elections []string) ([]Observation, error) {
	return ReadEach(ctx, elections, o.b.Observe)
}

func (o oneByOne) HistoryAll(ctx context.Context, elections []string) ([][][]byte, error) {
	return ReadEach(ctx, elections, o.b.History)
}

// ReadEach calls read (a Backend's Observe or History, say) for each of elections, one
// after the other, and stops at the first error: a ReadBatcher's way with a store that
// reads one election per request.
func ReadEach[Out any](ctx context.Context, elections []string, read func(context.Context, string) (Out, error)) ([]Out, error) {
	out := make([]Out, len(elections))
	for i, name := range elections {
		var err error
		if out[i], err = read(ctx, name); err != nil {
			return nil, err
		}
	}
	return out, nil
}

var _ ReadBatcher = oneByOne{}
