package pgbackend

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/caddyleader/caddy-leader/jobs"
)

// <prefix>jobs keeps one row per job and election: the job's record (jobs.Store), bound to
// no lease and to no election row, so that it outlives every term and instance. Only an
// operator deletes rows; an election's row may come and go under them.
func jobsSchema(n names) string {
	return fmt.Sprintf(`
CREATE TABLE IF NOT EXISTS %[1]s (
	election text NOT NULL,
	job text NOT NULL,
	value bytea NOT NULL,
	PRIMARY KEY (election, job)
);
`, n.jobs)
}

// JobRecord implements jobs.Store.
func (b *Backend) JobRecord(ctx context.Context, election, job string) ([]byte, error) {
	if err := b.ready(ctx); err != nil {
		return nil, err
	}
	var value []byte
	err := b.pool.QueryRow(ctx, fmt.Sprintf(`SELECT value FROM %s WHERE election = $1 AND job = $2`, b.names.jobs),
		election, job).Scan(&value)
	if isNoRows(err) {
		return nil, nil
	}
	return value, b.jobsErr(err)
}

// PutJobRecord implements jobs.Store with one statement, in autocommit as every other: the
// record is written if the election's row holds token under a live lease, checked on the
// row locked FOR SHARE until the write commits. The lock is what makes check and write one:
// a takeover (the campaign's ON CONFLICT UPDATE), a release or an expiry (DELETE), and a
// revoke (its cascade) must lock the row too, so each comes wholly before this statement
// (which then finds the row changed or gone, as READ COMMITTED re-reads a row it waited
// for) or wholly after its write. FOR KEY SHARE would not do: the campaign changes no key
// column, and its lock does not wait for that one. A heartbeat waits for the write, which
// holds the lock for one statement.
func (b *Backend) PutJobRecord(ctx context.Context, election, job string, token int64, value []byte) (bool, error) {
	if err := b.ready(ctx); err != nil {
		return false, err
	}
	if value == nil {
		value = []byte{}
	}
	tag, err := b.pool.Exec(ctx, fmt.Sprintf(`
WITH held AS (
	SELECT 1 FROM %[2]s e
	WHERE e.name = $1 AND e.token = $3
		AND EXISTS (SELECT 1 FROM %[3]s l WHERE l.id = e.lease AND l.expires_at > clock_timestamp())
	FOR SHARE
)
INSERT INTO %[1]s (election, job, value) SELECT $1, $2, $4 FROM held
ON CONFLICT (election, job) DO UPDATE SET value = EXCLUDED.value`,
		b.names.jobs, b.names.elections, b.names.leases), election, job, token, value)
	if err != nil {
		return false, b.jobsErr(err)
	}
	return tag.RowsAffected() == 1, nil
}

// jobsErr describes err, and what to do when the table is missing: a schema managed by
// hand (Config.SkipSchema) that Schema's statements of this release have not been run on.
// Elections work on without it.
func (b *Backend) jobsErr(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" {
		err = fmt.Errorf("table %s is missing: run pgbackend.Schema's statements again (skip_schema): %w", b.names.jobs, err)
	}
	return b.describe(err)
}

var _ jobs.Store = (*Backend)(nil)
