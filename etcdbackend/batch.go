package etcdbackend

import (
	"context"
	"slices"

	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"

	"github.com/caddyleader/caddy-leader/elector"
)

// batchElections is how many elections one batched request carries. Each election is a
// transaction of its own nested in the request's, so that each keeps its own
// compare-and-swap; etcd lets a transaction hold 128 operations (--max-txn-ops, the
// default) and counts a nested transaction's operations against what its parent leaves (a
// campaign's has 5), so 100 keep clear of the limit, and a request of 100 small keys far
// below --max-request-bytes.
const batchElections = 100

// CampaignAll implements elector.Batcher: Campaign's transaction for each claim, nested,
// batchElections to a request (one unconditional transaction, see commit), several
// requests at once (inChunks).
func (b *Backend) CampaignAll(ctx context.Context, claims []elector.Claim, lease elector.LeaseID) ([]elector.Observation, error) {
	cli, err := b.client(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]elector.Observation, len(claims))
	err = inChunks(len(claims), func(start, end int) error {
		chunk := claims[start:end]
		ops := make([]clientv3.Op, len(chunk))
		for i, c := range chunk {
			ops[i] = clientv3.OpTxn(b.campaignTxn(c.Election, c.Value, lease))
		}
		resp, at, err := b.commit(ctx, cli, nil, ops, nil)
		if err != nil {
			return err
		}
		for i, c := range chunk {
			sub := resp.Responses[i].GetResponseTxn()
			if out[start+i], err = b.campaigned(at, c.Election, c.Value, lease, resp.Header.Revision, sub.GetSucceeded(), sub.GetResponses()); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ReleaseAll implements elector.Batcher: Release's transaction for each term, nested,
// batchElections to a request, each request's acknowledgements under one lease.
func (b *Backend) ReleaseAll(ctx context.Context, terms []elector.HeldTerm, lease elector.LeaseID, why string) error {
	cli, err := b.client(ctx)
	if err != nil {
		return err
	}
	// The requests go at once: a leaving instance's releases are the successors' wait,
	// and etcd commits requests that arrive together in one write of its log.
	var g errgroup.Group
	for chunk := range slices.Chunk(terms, batchElections) {
		g.Go(func() error {
			return b.acknowledged(ctx, cli, lease, why, func(ack func(string, int64) clientv3.Op) error {
				ops := make([]clientv3.Op, len(chunk))
				for i, t := range chunk {
					ops[i] = clientv3.OpTxn(b.releaseTxn(t.Election, t.Token, ack))
				}
				_, _, err := b.commit(ctx, cli, nil, ops, nil)
				return err
			})
		})
	}
	return g.Wait()
}

// ExpireAll implements elector.Batcher: Expire's guarded delete for each term, nested,
// batchElections to a request. In a group, each key's guard reads its holder's beacon
// first, as Expire does.
func (b *Backend) ExpireAll(ctx context.Context, terms []elector.HeldTerm) ([]bool, error) {
	cli, err := b.client(ctx)
	if err != nil {
		return nil, err
	}
	deleted := make([]bool, len(terms))
	type guarded struct {
		term int // index in terms
		op   clientv3.Op
	}
	var deletes []guarded
	for i, t := range terms {
		guards, ok, err := b.expireGuards(ctx, cli, t.Election, t.Token, t.Rev)
		if err != nil {
			return nil, err
		}
		if ok {
			deletes = append(deletes, guarded{i, clientv3.OpTxn(guards, []clientv3.Op{clientv3.OpDelete(b.Key(t.Election))}, nil)})
		}
	}
	for chunk := range slices.Chunk(deletes, batchElections) {
		ops := make([]clientv3.Op, len(chunk))
		for i, g := range chunk {
			ops[i] = g.op
		}
		resp, _, err := b.commit(ctx, cli, nil, ops, nil)
		if err != nil {
			return nil, err
		}
		for i, g := range chunk {
			deleted[g.term] = resp.Responses[i].GetResponseTxn().GetSucceeded()
		}
	}
	return deleted, nil
}

// Interface guard.
// BatchesClaims implements elector.ClaimBatcher: a transaction is applied at once.
func (b *Backend) BatchesClaims() {}

var _ elector.ClaimBatcher = (*Backend)(nil)
