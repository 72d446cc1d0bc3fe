package electortest

import (
	"context"

	"github.com/caddyleader/caddy-leader/elector"
)

// BatchingClient is a Client whose store batches (elector.Batcher), as etcd's does: each
// batched call counts as one call of its own name (CampaignAll, ReleaseAll, ExpireAll),
// whatever the number of elections in it, and is applied election by election as the
// single calls are (their failures, set with Fail and LoseAnswer, included).
type BatchingClient struct{ *Client }

// BatchingClient returns a new, independent client of s that batches.
func (s *Store) BatchingClient() BatchingClient { return BatchingClient{s.Client()} }

// CampaignAll implements elector.Batcher.
func (c BatchingClient) CampaignAll(ctx context.Context, claims []elector.Claim, lease elector.LeaseID) ([]elector.Observation, error) {
	c.count("CampaignAll")
	out := make([]elector.Observation, len(claims))
	for i, claim := range claims {
		o, err := c.campaign(ctx, claim.Election, claim.Value, lease)
		if err != nil {
			return nil, err
		}
		out[i] = o
	}
	if err := c.answerLate(ctx); err != nil {
		return nil, err
	}
	return out, nil
}

// ReleaseAll implements elector.Batcher.
func (c BatchingClient) ReleaseAll(ctx context.Context, terms []elector.HeldTerm, lease elector.LeaseID, why string) error {
	c.count("ReleaseAll")
	for _, t := range terms {
		if err := c.release(ctx, t.Election, t.Token, lease, why); err != nil {
			return err
		}
	}
	return nil
}

// ExpireAll implements elector.Batcher.
func (c BatchingClient) ExpireAll(ctx context.Context, terms []elector.HeldTerm) ([]bool, error) {
	c.count("ExpireAll")
	out := make([]bool, len(terms))
	for i, t := range terms {
		deleted, err := c.expire(ctx, t.Election, t.Token, t.Rev)
		if err != nil {
			return nil, err
		}
		out[i] = deleted
	}
	return out, nil
}

// ObserveAll implements elector.ReadBatcher.
func (c BatchingClient) ObserveAll(ctx context.Context, elections []string) ([]elector.Observation, error) {
	c.count("ObserveAll")
	return elector.ReadEach(ctx, elections, c.observe)
}

// HistoryAll implements elector.ReadBatcher.
func (c BatchingClient) HistoryAll(ctx context.Context, elections []string) ([][][]byte, error) {
	c.count("HistoryAll")
	return elector.ReadEach(ctx, elections, c.history)
}

// UpdateAll implements elector.HeartbeatBatcher: one call, each update applied as Update
// applies it (its failures, set with Fail("Update"), included).
func (c BatchingClient) UpdateAll(ctx context.Context, updates []elector.KeyUpdate) []elector.UpdateResult {
	c.count("UpdateAll")
	out := make([]elector.UpdateResult, len(updates))
	for i, u := range updates {
		out[i].Updated, out[i].Err = c.update(ctx, u.Election, u.Token, u.Value)
	}
	return out
}

// BatchesClaims implements elector.ClaimBatcher: a batch is applied under the store's lock
// at once, as an etcd transaction is.
func (c BatchingClient) BatchesClaims() {}

// Interface guards.
var (
	_ elector.ClaimBatcher     = BatchingClient{}
	_ elector.HeartbeatBatcher = BatchingClient{}
)
