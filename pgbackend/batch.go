package pgbackend

import (
	"cmp"
	"context"
	"errors"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/caddyleader/caddy-leader/elector"
)

// batchElections is how many elections one batched round trip carries: the single calls'
// statements, queued in one pgx batch, which the server runs in one implicit transaction.
const batchElections = 200

// CampaignAll implements elector.Batcher: Campaign's statement for each claim, sent in
// batches of batchElections, each one round trip. The claims go in the order of their
// elections' names, so that two batches take the rows' locks in one order and never wait
// for each other in a cycle. A claim that finds its key held is then made as Campaign
// makes it, alone: it reads the holder (who may have committed after the batch's
// statement began), and campaigns again if the key is vacant by then. A batch that fails
// as a whole (its transaction is undone) on a deadlock or a serialization failure is made
// one claim at a time.
func (b *Backend) CampaignAll(ctx context.Context, claims []elector.Claim, lease elector.LeaseID) ([]elector.Observation, error) {
	if err := b.ready(ctx); err != nil {
		return nil, err
	}
	_, _, readWhy, _ := b.ackWhy(nil, "")
	sql := b.campaignSQL(readWhy)
	order := make([]int, len(claims))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(i, j int) int { return cmp.Compare(claims[i].Election, claims[j].Election) })
	out := make([]elector.Observation, len(claims))
	for chunk := range slices.Chunk(order, batchElections) {
		type answer struct {
			mark         fenceMark
			token, prev  int64
			prevReleased bool
			prevWhy      string
			err          error
		}
		answers := make([]answer, len(chunk))
		batch := &pgx.Batch{}
		for j, i := range chunk {
			c := claims[i]
			answers[j].mark = b.mark(c.Election)
			batch.Queue(sql, c.Election, c.Value, int64(lease), b.floor())
		}
		err := b.sendBatch(ctx, batch, func(results pgx.BatchResults) (first error) {
			for j := range chunk {
				a := &answers[j]
				a.err = results.QueryRow().Scan(&a.token, &a.prev, &a.prevReleased, &a.prevWhy)
				if a.err != nil && !errors.Is(a.err, pgx.ErrNoRows) && first == nil {
					first = a.err // no row is a held key; anything else, the batch's failure
				}
			}
			return first
		})
		switch {
		case isForeignKeyViolation(err):
			return nil, elector.ErrLeaseNotFound // revoked meanwhile
		case retryAlone(err):
			for _, i := range chunk {
				if out[i], err = b.Campaign(ctx, claims[i].Election, claims[i].Value, lease); err != nil {
					return nil, err
				}
			}
			continue
		case err != nil:
			return nil, b.describe(err)
		}
		for j, i := range chunk {
			c, a := claims[i], answers[j]
			if a.err == nil {
				out[i], err = b.won(a.mark, c.Election, c.Value, lease, a.token, a.prev, a.prevReleased, a.prevWhy)
			} else {
				out[i], err = b.Campaign(ctx, c.Election, c.Value, lease) // held: read it, as Campaign does
			}
			if err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// ReleaseAll implements elector.Batcher: Release's statement for each term, in batches
// of batchElections, each one round trip.
func (b *Backend) ReleaseAll(ctx context.Context, terms []elector.HeldTerm, lease elector.LeaseID, why string) error {
	if err := b.ready(ctx); err != nil {
		return err
	}
	col, val, _, _ := b.ackWhy(nil, why)
	first, rest := b.releaseSQL(col, val, true), b.releaseSQL(col, val, false)
	for chunk := range slices.Chunk(sortedTerms(terms), batchElections) {
		batch := &pgx.Batch{}
		for i, t := range chunk {
			_, _, _, args := b.ackWhy([]any{t.Election, t.Token, int64(lease)}, why)
			sql := rest
			if i == 0 {
				sql = first // clears the expired acknowledgements, once a batch
			}
			batch.Queue(sql, args...)
		}
		err := b.sendBatch(ctx, batch, func(results pgx.BatchResults) (first error) {
			for range chunk {
				if _, err := results.Exec(); err != nil && first == nil {
					first = err
				}
			}
			return first
		})
		if retryAlone(err) {
			for _, t := range chunk {
				if err := b.Release(ctx, t.Election, t.Token, lease, why); err != nil {
					return err
				}
			}
			continue
		}
		if err != nil {
			return b.describe(err)
		}
	}
	return nil
}

// ExpireAll implements elector.Batcher: Expire's statement for each term, in batches of
// batchElections, each one round trip.
func (b *Backend) ExpireAll(ctx context.Context, terms []elector.HeldTerm) ([]bool, error) {
	if err := b.ready(ctx); err != nil {
		return nil, err
	}
	index := make(map[string]int, len(terms))
	for i, t := range terms {
		index[t.Election] = i
	}
	deleted := make([]bool, len(terms))
	for chunk := range slices.Chunk(sortedTerms(terms), batchElections) {
		batch := &pgx.Batch{}
		for _, t := range chunk {
			batch.Queue(b.expireSQL(t.Election), t.Election, t.Token, t.Rev)
		}
		rows := make([]bool, len(chunk))
		err := b.sendBatch(ctx, batch, func(results pgx.BatchResults) (first error) {
			for j := range chunk {
				tag, err := results.Exec()
				if err != nil && first == nil {
					first = err
				}
				rows[j] = err == nil && tag.RowsAffected() == 1
			}
			return first
		})
		if retryAlone(err) {
			for j, t := range chunk {
				if rows[j], err = b.Expire(ctx, t.Election, t.Token, t.Rev); err != nil {
					return nil, err
				}
			}
			err = nil
		}
		if err != nil {
			return nil, b.describe(err)
		}
		for j, t := range chunk {
			deleted[index[t.Election]] = rows[j]
		}
	}
	return deleted, nil
}

// sendBatch sends batch, lets read take its results in order, and returns the batch's
// error: the first statement's error that read returns (one statement's error undoes the
// whole batch's transaction: nothing of it took effect), or the batch's own.
func (b *Backend) sendBatch(ctx context.Context, batch *pgx.Batch, read func(pgx.BatchResults) error) error {
	results := b.pool.SendBatch(ctx, batch)
	err := read(results)
	return cmp.Or(err, results.Close())
}

// retryAlone says whether a batch failed as a whole in a way that the same statements,
// sent one at a time, need not: its transaction was chosen to end a deadlock, or failed
// to serialize.
func retryAlone(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40P01" || pgErr.Code == "40001")
}

// sortedTerms is terms in the order of their elections' names (see CampaignAll).
func sortedTerms(terms []elector.HeldTerm) []elector.HeldTerm {
	sorted := slices.Clone(terms)
	slices.SortFunc(sorted, func(a, b elector.HeldTerm) int { return cmp.Compare(a.Election, b.Election) })
	return sorted
}

// Interface guard.
var _ elector.Batcher = (*Backend)(nil)
