package pgbackend

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/caddyleader/caddy-leader/elector"
)

// Every request below is one statement in autocommit: no transaction spans two round
// trips, nothing is kept in the session, so a pooler in transaction mode may send each to
// any server connection. Times come from clock_timestamp() (the server's clock when the
// statement runs, not when its transaction began), so that a row lock waited for does not
// make a statement judge a lease by a stale now().

// Grant implements elector.Backend. The TTL is kept to the millisecond. Expired leases are
// deleted on the way (with everything bound to them), so the table holds only live ones and
// those that expired since the last grant.
func (b *Backend) Grant(ctx context.Context, ttl time.Duration) (elector.LeaseID, time.Duration, error) {
	if err := b.ready(ctx); err != nil {
		return 0, 0, err
	}
	ms := int64(math.Ceil(float64(ttl) / float64(time.Millisecond)))
	var id, granted int64
	err := b.pool.QueryRow(ctx, fmt.Sprintf(`
WITH gc AS (DELETE FROM %[1]s WHERE expires_at <= clock_timestamp())
INSERT INTO %[1]s (id, ttl_ms, expires_at)
VALUES (%[2]s(), $1::bigint, clock_timestamp() + $1::bigint * interval '1 millisecond')
RETURNING id, ttl_ms`, b.names.leases, b.names.next), ms).Scan(&id, &granted)
	if err != nil {
		return 0, 0, b.describe(err)
	}
	g := time.Duration(granted) * time.Millisecond
	if p := g / 3; p > 0 && p < time.Duration(b.poll.Load()) {
		b.poll.Store(int64(p))
	}
	return elector.LeaseID(id), g, nil
}

// Renew implements elector.Backend. A lease whose expires_at has passed cannot be renewed
// even if no one has deleted its row yet: it is gone.
func (b *Backend) Renew(ctx context.Context, id elector.LeaseID) (time.Duration, error) {
	if err := b.ready(ctx); err != nil {
		return 0, err
	}
	var ms int64
	err := b.pool.QueryRow(ctx, fmt.Sprintf(`
UPDATE %s SET expires_at = clock_timestamp() + ttl_ms * interval '1 millisecond'
WHERE id = $1 AND expires_at > clock_timestamp()
RETURNING ttl_ms`, b.names.leases), int64(id)).Scan(&ms)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, elector.ErrLeaseNotFound
	}
	if err != nil {
		return 0, b.describe(err)
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// Revoke implements elector.Backend: the rows bound to the lease go with it (ON DELETE
// CASCADE).
func (b *Backend) Revoke(ctx context.Context, id elector.LeaseID) error {
	if err := b.ready(ctx); err != nil {
		return err
	}
	_, err := b.pool.Exec(ctx, fmt.Sprintf(`DELETE FROM %s WHERE id = $1`, b.names.leases), int64(id))
	return b.describe(err)
}

// Campaign implements elector.Backend with one statement: delete the holder's lease if it
// has expired, then insert the key, or take it over if its lease was just deleted.
//
// Deleting the expired lease is what makes a takeover safe against a renewal in flight:
// the DELETE locks the lease row and re-checks expires_at against the clock after any
// concurrent UPDATE (a renewal) has committed, so either the renewal wins and the key stays
// held, or the delete wins and the renewal finds no lease. A holder is never told its lease
// was renewed while its key is being taken.
//
// A losing campaign reads the key in a second statement (a plain read): the row that beat
// this one may have committed after this statement's snapshot began.
func (b *Backend) Campaign(ctx context.Context, election string, value []byte, lease elector.LeaseID) (elector.Observation, error) {
	if err := b.ready(ctx); err != nil {
		return elector.Observation{}, err
	}
	for attempt := 0; ; attempt++ {
		var token int64
		err := b.pool.QueryRow(ctx, fmt.Sprintf(`
WITH cur AS (SELECT lease FROM %[1]s WHERE name = $1),
dead AS (
	DELETE FROM %[2]s WHERE id IN (SELECT lease FROM cur) AND expires_at <= clock_timestamp()
	RETURNING id
),
tok AS (SELECT %[3]s() AS v FROM %[2]s WHERE id = $3 AND expires_at > clock_timestamp())
INSERT INTO %[1]s AS e (name, value, lease, token, rev)
SELECT $1, $2, $3, v, v FROM tok
ON CONFLICT (name) DO UPDATE
	SET value = EXCLUDED.value, lease = EXCLUDED.lease, token = EXCLUDED.token, rev = EXCLUDED.rev
	WHERE e.lease IN (SELECT id FROM dead)
RETURNING token`, b.names.elections, b.names.leases, b.names.next), election, value, int64(lease)).Scan(&token)
		switch {
		case err == nil:
			o := elector.Observation{Revision: token, Holder: &elector.Holder{Value: value, Lease: lease, Token: token}}
			b.remember(election, o)
			return o, nil
		case isForeignKeyViolation(err):
			return elector.Observation{}, elector.ErrLeaseNotFound // revoked meanwhile
		case !errors.Is(err, pgx.ErrNoRows):
			return elector.Observation{}, b.describe(err)
		}
		r, err := b.read(ctx, election, lease)
		if err != nil {
			return elector.Observation{}, err
		}
		if !r.leaseAlive {
			return elector.Observation{}, elector.ErrLeaseNotFound
		}
		// Vacant again already (released between the two statements): try once more,
		// rather than report a vacancy that nobody would campaign for.
		if r.obs.Holder != nil || attempt == 2 {
			b.remember(election, r.obs)
			return r.obs, nil
		}
	}
}

// Observe implements elector.Backend. A key whose lease has expired is vacant, whether or
// not its row has been deleted yet.
func (b *Backend) Observe(ctx context.Context, election string) (elector.Observation, error) {
	if err := b.ready(ctx); err != nil {
		return elector.Observation{}, err
	}
	r, err := b.read(ctx, election, 0)
	if err != nil {
		return elector.Observation{}, err
	}
	b.remember(election, r.obs)
	return r.obs, nil
}

// reading is one read of an election's key.
type reading struct {
	obs elector.Observation
	// remaining is how long the holder's lease has left by the server's clock; zero
	// when vacant.
	remaining time.Duration
	// leaseAlive says whether the lease asked about is alive.
	leaseAlive bool
	// rowRev is the revision of the key's last write (0 when vacant): an Update that
	// rewrites the same value still changes it.
	rowRev int64
}

// read reads the key and (if lease is not 0) whether lease is alive, in one statement. Its
// revision comes from the sequence, so each read's is higher than any revision before it.
func (b *Backend) read(ctx context.Context, election string, lease elector.LeaseID) (reading, error) {
	var (
		rev          int64
		value        []byte
		holder, tok  *int64
		rowRev       *int64
		remainingSec *float64
		alive        bool
	)
	err := b.pool.QueryRow(ctx, fmt.Sprintf(`
SELECT %[3]s(), e.value, e.lease, e.token, e.rev,
	extract(epoch FROM l.expires_at - clock_timestamp())::float8,
	EXISTS (SELECT 1 FROM %[2]s WHERE id = $2 AND expires_at > clock_timestamp())
FROM (VALUES (1)) AS one (x)
LEFT JOIN (%[1]s e JOIN %[2]s l ON l.id = e.lease AND l.expires_at > clock_timestamp()) ON e.name = $1`,
		b.names.elections, b.names.leases, b.names.next), election, int64(lease)).
		Scan(&rev, &value, &holder, &tok, &rowRev, &remainingSec, &alive)
	if err != nil {
		return reading{}, b.describe(err)
	}
	r := reading{obs: elector.Observation{Revision: rev}, leaseAlive: alive}
	if holder != nil {
		r.obs.Holder = &elector.Holder{Value: value, Lease: elector.LeaseID(*holder), Token: *tok}
		r.remaining = time.Duration(max(0, *remainingSec) * float64(time.Second))
		r.rowRev = *rowRev
	}
	return r, nil
}

// Update implements elector.Backend: only while the key is still term token's and its
// lease alive.
func (b *Backend) Update(ctx context.Context, election string, token int64, value []byte) (bool, error) {
	if err := b.ready(ctx); err != nil {
		return false, err
	}
	tag, err := b.pool.Exec(ctx, fmt.Sprintf(`
UPDATE %[1]s SET value = $3, rev = %[3]s()
WHERE name = $1 AND token = $2
	AND lease IN (SELECT id FROM %[2]s WHERE expires_at > clock_timestamp())`,
		b.names.elections, b.names.leases, b.names.next), election, token, value)
	if err != nil {
		return false, b.describe(err)
	}
	return tag.RowsAffected() == 1, nil
}

// Release implements elector.Backend: one statement deletes the key if it is still term
// token's and records the acknowledgement.
//
// The acknowledgement is written whether or not the key was still this term's (see
// elector.Backend.Release); the data-modifying CTE runs either way.
func (b *Backend) Release(ctx context.Context, election string, token int64, lease elector.LeaseID) error {
	if err := b.ready(ctx); err != nil {
		return err
	}
	_, err := b.pool.Exec(ctx, fmt.Sprintf(`
WITH d AS (DELETE FROM %[1]s WHERE name = $1 AND token = $2 RETURNING lease),
gc AS (DELETE FROM %[3]s WHERE expires_at <= clock_timestamp())
INSERT INTO %[3]s (election, token, expires_at)
SELECT $1, $2, clock_timestamp() + COALESCE((SELECT ttl_ms FROM %[2]s WHERE id = $3), %[4]d) * interval '1 millisecond'
ON CONFLICT DO NOTHING`, b.names.elections, b.names.leases, b.names.acks, defaultAckTTL.Milliseconds()), election, token, int64(lease))
	return b.describe(err)
}

// defaultAckTTL is how long an acknowledgement lives when its holder's lease is already
// gone: long enough for any successor to read it.
const defaultAckTTL = time.Minute

// Acknowledge implements elector.Backend. The acknowledgement lives for the holder's TTL,
// even if the holder's lease is revoked meanwhile; Released deletes it when it reads it,
// and expired ones are cleared by the next acknowledgement.
func (b *Backend) Acknowledge(ctx context.Context, election string, token int64, lease elector.LeaseID) error {
	if err := b.ready(ctx); err != nil {
		return err
	}
	_, err := b.pool.Exec(ctx, fmt.Sprintf(`
WITH gc AS (DELETE FROM %[1]s WHERE expires_at <= clock_timestamp())
INSERT INTO %[1]s (election, token, expires_at)
SELECT $1, $2, clock_timestamp() + COALESCE((SELECT ttl_ms FROM %[2]s WHERE id = $3), %[3]d) * interval '1 millisecond'
ON CONFLICT DO NOTHING`, b.names.acks, b.names.leases, defaultAckTTL.Milliseconds()), election, token, int64(lease))
	return b.describe(err)
}

// Released implements elector.Backend: it consumes the acknowledgement. A lease past its
// expires_at counts as gone: it can no longer be renewed, so its holder's own deadline has
// passed too. With lease 0 only the acknowledgement counts.
func (b *Backend) Released(ctx context.Context, election string, token int64, lease elector.LeaseID) (bool, error) {
	if err := b.ready(ctx); err != nil {
		return false, err
	}
	var released bool
	err := b.pool.QueryRow(ctx, fmt.Sprintf(`
WITH a AS (DELETE FROM %[1]s WHERE election = $1 AND token = $2 AND expires_at > clock_timestamp() RETURNING 1)
SELECT EXISTS (SELECT 1 FROM a)
	OR ($3::bigint <> 0 AND NOT EXISTS (SELECT 1 FROM %[2]s WHERE id = $3 AND expires_at > clock_timestamp()))`,
		b.names.acks, b.names.leases), election, token, int64(lease)).Scan(&released)
	if err != nil {
		return false, b.describe(err)
	}
	return released, nil
}

func isForeignKeyViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23503"
}

// describe adds what the caller needs to know to an error, and makes sure it carries no
// password.
func (b *Backend) describe(err error) error {
	if err == nil {
		return nil
	}
	if b.ctx.Err() != nil {
		return ErrClosed
	}
	return redactErr(fmt.Errorf("postgres: %w", err), b.cfg)
}

func isNoRows(err error) bool { return errors.Is(err, pgx.ErrNoRows) }
