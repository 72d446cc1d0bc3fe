package pgbackend

import (
	"context"
	"fmt"
)

// AppendHistory implements elector.Backend: one statement adds the entry, ordered by the
// store's rising counter, and deletes those beyond the newest keep. Two appends at the same
// moment each trim by what they saw, which may leave one entry too many until the next.
func (b *Backend) AppendHistory(ctx context.Context, election string, entry []byte, keep int) error {
	if err := b.ready(ctx); err != nil {
		return err
	}
	if entry == nil {
		entry = []byte{}
	}
	_, err := b.pool.Exec(ctx, fmt.Sprintf(`
WITH ins AS (INSERT INTO %[1]s (election, seq, entry) VALUES ($1, %[2]s(), $2))
DELETE FROM %[1]s WHERE election = $1 AND seq NOT IN
	(SELECT seq FROM %[1]s WHERE election = $1 ORDER BY seq DESC LIMIT GREATEST($3::int - 1, 0))`,
		b.names.history, b.names.next), election, entry, keep)
	return b.describe(err)
}

// History implements elector.Backend.
func (b *Backend) History(ctx context.Context, election string) ([][]byte, error) {
	if err := b.ready(ctx); err != nil {
		return nil, err
	}
	rows, err := b.pool.Query(ctx, fmt.Sprintf(`SELECT entry FROM %s WHERE election = $1 ORDER BY seq`, b.names.history), election)
	if err != nil {
		return nil, b.describe(err)
	}
	defer rows.Close()
	list := [][]byte{}
	for rows.Next() {
		var entry []byte
		if err := rows.Scan(&entry); err != nil {
			return nil, b.describe(err)
		}
		list = append(list, entry)
	}
	return list, b.describe(rows.Err())
}
