package pgbackend

import (
	"context"
	"fmt"

	"github.com/caddyleader/caddy-leader/elector"
)

// ObserveAll implements elector.ReadBatcher: Observe's statement over an array of the
// elections, a row each, in one statement for the grouped elections and one for the
// others. A shard set's start reads thousands of keys at once; one statement each, or
// even pipelined statements, took the server longer than a request's timeout.
func (b *Backend) ObserveAll(ctx context.Context, elections []string) ([]elector.Observation, error) {
	if err := b.ready(ctx); err != nil {
		return nil, err
	}
	var grouped, alone []string
	marks := make(map[string]fenceMark, len(elections))
	for _, election := range elections {
		if b.groups.Of(election) != nil {
			grouped = append(grouped, election)
		} else {
			alone = append(alone, election)
		}
		marks[election] = b.mark(election)
	}
	seen := make(map[string]elector.Observation, len(elections))
	for _, part := range []struct {
		names   []string
		grouped bool
	}{{grouped, true}, {alone, false}} {
		if len(part.names) == 0 {
			continue
		}
		if err := b.readMany(ctx, part.names, part.grouped, marks, seen); err != nil {
			return nil, err
		}
	}
	out := make([]elector.Observation, len(elections))
	for i, election := range elections {
		o, ok := seen[election]
		if !ok {
			return nil, fmt.Errorf("pgbackend: a read of %d keys did not answer for %q", len(elections), election)
		}
		out[i] = o
	}
	return out, nil
}

// readMany reads the keys of names (all grouped, or none) in one statement into seen,
// each checked against its mark.
func (b *Backend) readMany(ctx context.Context, names []string, grouped bool, marks map[string]fenceMark, seen map[string]elector.Observation) error {
	rows, err := b.pool.Query(ctx, b.readSQL(grouped, true), names, int64(0))
	if err != nil {
		return b.describe(err)
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		r, err := scanReading(rows, &name)
		if err != nil {
			return b.describe(err)
		}
		if r, err = b.checkedReading(marks[name], name, r); err != nil {
			return err
		}
		b.remember(name, reported{r.obs, r.rowRev})
		seen[name] = r.obs
	}
	return b.describe(rows.Err())
}

// HistoryAll implements elector.ReadBatcher: one statement reads every election's history.
func (b *Backend) HistoryAll(ctx context.Context, elections []string) ([][][]byte, error) {
	if err := b.ready(ctx); err != nil {
		return nil, err
	}
	rows, err := b.pool.Query(ctx, fmt.Sprintf(`SELECT election, entry FROM %s WHERE election = ANY($1) ORDER BY election, seq`, b.names.history), elections)
	if err != nil {
		return nil, b.describe(err)
	}
	defer rows.Close()
	byElection := make(map[string][][]byte, len(elections))
	for rows.Next() {
		var election string
		var entry []byte
		if err := rows.Scan(&election, &entry); err != nil {
			return nil, b.describe(err)
		}
		byElection[election] = append(byElection[election], entry)
	}
	if err := rows.Err(); err != nil {
		return nil, b.describe(err)
	}
	out := make([][][]byte, len(elections))
	for i, election := range elections {
		out[i] = byElection[election]
		if out[i] == nil {
			out[i] = [][]byte{}
		}
	}
	return out, nil
}

// Interface guard.
var _ elector.ReadBatcher = (*Backend)(nil)
