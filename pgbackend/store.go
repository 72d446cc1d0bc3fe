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
	m := b.mark("")
	var id, granted int64
	err := b.pool.QueryRow(ctx, fmt.Sprintf(`
WITH gc AS (DELETE FROM %[1]s WHERE expires_at <= clock_timestamp())
INSERT INTO %[1]s (id, ttl_ms, expires_at)
VALUES (%[2]s($2), $1::bigint, clock_timestamp() + $1::bigint * interval '1 millisecond')
RETURNING id, ttl_ms`, b.names.leases, b.names.fenced), ms, b.floor()).Scan(&id, &granted)
	if err != nil {
		return 0, 0, b.describe(err)
	}
	if err := b.granted(m, id); err != nil {
		return 0, 0, err
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
	if err := b.owedRewind(); err != nil {
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
	_, _, readWhy, _ := b.ackWhy(nil, "")
	for attempt := 0; ; attempt++ {
		m := b.mark(election)
		var (
			token, prev  int64
			prevReleased bool
			prevWhy      string
		)
		err := b.pool.QueryRow(ctx, b.campaignSQL(readWhy), election, value, int64(lease), b.floor()).Scan(&token, &prev, &prevReleased, &prevWhy)
		switch {
		case err == nil:
			return b.won(m, election, value, lease, token, prev, prevReleased, prevWhy)
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
			b.remember(election, reported{r.obs, r.rowRev})
			return r.obs, nil
		}
	}
}

// campaignSQL is Campaign's statement, with the acknowledgement's why read as readWhy (see
// ackWhy); its arguments are the election, the value, the lease and the token floor. It
// returns no row when the key is held. A key inserted anew follows the term last deleted
// (read after the insert, see fenceSchema); one taken over from an expired lease follows
// the term that held it.
func (b *Backend) campaignSQL(readWhy string) string {
	return fmt.Sprintf(`
WITH cur AS (SELECT lease, token FROM %[1]s WHERE name = $1),
dead AS (
	DELETE FROM %[2]s WHERE id IN (SELECT lease FROM cur) AND expires_at <= clock_timestamp()
	RETURNING id
),
tok AS (SELECT %[3]s($4) AS v FROM %[2]s WHERE id = $3 AND expires_at > clock_timestamp()),
won AS (
	INSERT INTO %[1]s AS e (name, value, lease, token, rev)
	SELECT $1, $2, $3, v, v FROM tok
	ON CONFLICT (name) DO UPDATE
		SET value = EXCLUDED.value, lease = EXCLUDED.lease, token = EXCLUDED.token, rev = EXCLUDED.rev
		WHERE e.lease IN (SELECT id FROM dead)
	RETURNING token, COALESCE(CASE WHEN e.xmax = 0 THEN %[4]s($1) ELSE (SELECT token FROM cur) END, 0) AS prev
)
SELECT won.token, won.prev, a.token IS NOT NULL, COALESCE(%[6]s, '')
FROM won LEFT JOIN %[5]s a
	ON a.election = $1 AND a.token = won.prev AND a.expires_at > clock_timestamp()`,
		b.names.elections, b.names.leases, b.names.fenced, b.names.prev, b.names.acks, readWhy)
}

// won is the observation of a campaign for election that won term token (mark m taken
// before it was sent), and notes what it wrote.
func (b *Backend) won(m fenceMark, election string, value []byte, lease elector.LeaseID, token, prev int64, prevReleased bool, prevWhy string) (elector.Observation, error) {
	h := &elector.Holder{Value: value, Lease: lease, Token: token}
	if err := b.checkFence(m, election, token, h); err != nil {
		return elector.Observation{}, err
	}
	o := elector.Observation{Revision: token, Holder: h, Prev: prev, PrevReleased: prev != 0 && prevReleased}
	if o.PrevReleased {
		o.PrevWhy = prevWhy
	}
	b.remember(election, reported{o, token})
	b.noteWritten(election, token, lease, value)
	if g := b.groupOf(election); g != nil {
		g.holding(lease, election)
	}
	return o, nil
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
	b.remember(election, reported{r.obs, r.rowRev})
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
	// rowRev is the revision of the key's last write: the held row's, or, when vacant,
	// that of the last write before the key went (0 if unknown). An Update that rewrites
	// the same value still changes it.
	rowRev int64
	// last is, when vacant, the key as its last write left it: the row whose lease
	// expired, or the one the vacated trigger saved when the row was deleted; nil if
	// unknown. lastAt is a revision below obs.Revision at which a watch can report last
	// before the vacancy (see Watch).
	last   *elector.Holder
	lastAt int64
}

// read reads the key and (if lease is not 0) whether lease is alive, in one statement. Its
// revision comes from the sequence, so each read's is higher than any revision before it.
func (b *Backend) read(ctx context.Context, election string, lease elector.LeaseID) (reading, error) {
	m := b.mark(election)
	var name string
	r, err := scanReading(b.pool.QueryRow(ctx, b.readSQL(b.groups.Of(election) != nil, false), election, int64(lease)), &name)
	if err != nil {
		return reading{}, b.describe(err)
	}
	return b.checkedReading(m, election, r)
}

// readSQL is the statement of read, whose arguments are the election and the lease, or,
// with many, of a read of the keys of many elections (an array) and lease 0, a row each.
// Its first column names the election. grouped says whether the elections are in a group.
func (b *Backend) readSQL(grouped, many bool) string {
	// A grouped key was last written by its own write or its lease's beacon, whichever
	// came last (beacon.go), whether or not this backend writes beacons itself.
	keyRev, vacatedRev := "e.rev", "v.rev"
	if grouped {
		keyRev = fmt.Sprintf("GREATEST(e.rev, (SELECT %s FROM %s lb WHERE lb.id = e.lease))", b.beatOf("lb"), b.names.leases)
		vacatedRev = fmt.Sprintf("GREATEST(v.rev, %s)", b.beatOf("v"))
	}
	names := "(VALUES ($1::text)) AS n (name)"
	if many {
		names = "unnest($1::text[]) AS n (name)"
	}
	return fmt.Sprintf(`
SELECT n.name, %[3]s(), e.value, e.lease, e.token, %[5]s, l.id IS NOT NULL,
	extract(epoch FROM l.expires_at - clock_timestamp())::float8,
	EXISTS (SELECT 1 FROM %[2]s WHERE id = $2 AND expires_at > clock_timestamp()),
	v.value, v.lease, v.token, %[6]s,
	CASE WHEN l.id IS NULL THEN %[3]s() END
FROM %[7]s
LEFT JOIN %[1]s e ON e.name = n.name
LEFT JOIN %[2]s l ON l.id = e.lease AND l.expires_at > clock_timestamp()
LEFT JOIN %[4]s v ON v.name = n.name AND e.name IS NULL`,
		b.names.elections, b.names.leases, b.names.next, b.names.vacated, keyRev, vacatedRev, names)
}

// scanReading turns a row of readSQL's statement into a reading; the row's election goes
// to name.
func scanReading(row pgx.Row, name *string) (reading, error) {
	var (
		rev                  int64
		value, lastValue     []byte
		holder, tok, rowRev  *int64
		lastLease, lastToken *int64
		lastRev, vacantRev   *int64
		remainingSec         *float64
		live, alive          bool
	)
	err := row.Scan(name, &rev, &value, &holder, &tok, &rowRev, &live, &remainingSec, &alive,
		&lastValue, &lastLease, &lastToken, &lastRev, &vacantRev)
	if err != nil {
		return reading{}, err
	}
	r := reading{obs: elector.Observation{Revision: rev}, leaseAlive: alive}
	switch {
	case holder != nil && live:
		r.obs.Holder = &elector.Holder{Value: value, Lease: elector.LeaseID(*holder), Token: *tok}
		r.remaining = time.Duration(max(0, *remainingSec) * float64(time.Second))
		r.rowRev = *rowRev
		return r, nil
	case holder != nil: // the row is still there, its lease expired
		r.last = &elector.Holder{Value: value, Lease: elector.LeaseID(*holder), Token: *tok}
		r.rowRev = *rowRev
	case lastLease != nil: // the row was deleted
		r.last = &elector.Holder{Value: lastValue, Lease: elector.LeaseID(*lastLease), Token: *lastToken}
		r.rowRev = *lastRev
	}
	// Both revisions come from one statement; which of the two the server computed
	// first does not matter, only that the vacancy gets the higher.
	r.lastAt, r.obs.Revision = min(rev, *vacantRev), max(rev, *vacantRev)
	return r, nil
}

// checkedReading is r, a reading of election by a statement sent after m, once its
// revision is checked against the fence (checkFence): of the holder's write when held,
// of the last write before the vacancy when vacant.
func (b *Backend) checkedReading(m fenceMark, election string, r reading) (reading, error) {
	if r.obs.Holder != nil {
		return r, b.checkFence(m, election, r.obs.Revision, r.obs.Holder)
	}
	return r, b.checkFence(m, election, r.lastAt, nil)
}

// Release implements elector.Backend: one statement deletes the key if it is still term
// token's and records the acknowledgement.
//
// The acknowledgement is written whether or not the key was still this term's (see
// elector.Backend.Release); the data-modifying CTE runs either way.
func (b *Backend) Release(ctx context.Context, election string, token int64, lease elector.LeaseID, why string) error {
	if err := b.ready(ctx); err != nil {
		return err
	}
	col, val, _, args := b.ackWhy([]any{election, token, int64(lease)}, why)
	_, err := b.pool.Exec(ctx, b.releaseSQL(col, val, true), args...)
	return b.describe(err)
}

// releaseSQL is Release's statement, with the acknowledgement's why written as col and
// val say (see ackWhy); its arguments are the election, the token, the lease and the why.
// With gc it also deletes the expired acknowledgements, which a batch of releases does
// once, not once per election: each time reads every acknowledgement alive, as many as
// the shards released within a ttl.
func (b *Backend) releaseSQL(col, val string, gc bool) string {
	clear := ""
	if gc {
		clear = fmt.Sprintf(",\ngc AS (DELETE FROM %s WHERE expires_at <= statement_timestamp())", b.names.acks)
	}
	return fmt.Sprintf(`
WITH d AS (DELETE FROM %[1]s WHERE name = $1 AND token = $2 RETURNING lease)%[7]s
INSERT INTO %[3]s (election, token, expires_at%[5]s)
SELECT $1, $2, clock_timestamp() + COALESCE((SELECT ttl_ms FROM %[2]s WHERE id = $3), %[4]d) * interval '1 millisecond'%[6]s
ON CONFLICT DO NOTHING`, b.names.elections, b.names.leases, b.names.acks, defaultAckTTL.Milliseconds(), col, val, clear)
}

// Expire implements elector.Backend: every write of the key gives it a new rev, and every
// observation's revision is at least that of the writes it saw; of a grouped key's
// beacon too (beacon.go).
func (b *Backend) Expire(ctx context.Context, election string, token, rev int64) (bool, error) {
	if err := b.ready(ctx); err != nil {
		return false, err
	}
	tag, err := b.pool.Exec(ctx, b.expireSQL(election), election, token, rev)
	if err != nil {
		return false, b.describe(err)
	}
	return tag.RowsAffected() == 1, nil
}

// expireSQL is Expire's statement for election; its arguments are the election, the
// token and the revision.
func (b *Backend) expireSQL(election string) string {
	if g := b.groups.Of(election); g != nil {
		// Its holder's beacon counts as a write of the key, even where this backend
		// writes none: another instance may (beatOf).
		return g.expireSQL()
	}
	return fmt.Sprintf(`DELETE FROM %s WHERE name = $1 AND token = $2 AND rev <= $3`, b.names.elections)
}

// defaultAckTTL is how long an acknowledgement lives when its holder's lease is already
// gone: long enough for any successor to read it.
const defaultAckTTL = time.Minute

// Acknowledge implements elector.Backend. The acknowledgement lives for the holder's TTL,
// even if the holder's lease is revoked meanwhile; Released deletes it when it reads it,
// and expired ones are cleared by the next acknowledgement.
func (b *Backend) Acknowledge(ctx context.Context, election string, token int64, lease elector.LeaseID, why string) error {
	if err := b.ready(ctx); err != nil {
		return err
	}
	col, val, _, args := b.ackWhy([]any{election, token, int64(lease)}, why)
	_, err := b.pool.Exec(ctx, fmt.Sprintf(`
WITH gc AS (DELETE FROM %[1]s WHERE expires_at <= statement_timestamp())
INSERT INTO %[1]s (election, token, expires_at%[4]s)
SELECT $1, $2, clock_timestamp() + COALESCE((SELECT ttl_ms FROM %[2]s WHERE id = $3), %[3]d) * interval '1 millisecond'%[5]s
ON CONFLICT DO NOTHING`, b.names.acks, b.names.leases, defaultAckTTL.Milliseconds(), col, val), args...)
	return b.describe(err)
}

// Released implements elector.Backend: it consumes the acknowledgement. A lease past its
// expires_at counts as gone: it can no longer be renewed, so its holder's own deadline has
// passed too. With lease 0 only the acknowledgement counts.
func (b *Backend) Released(ctx context.Context, election string, token int64, lease elector.LeaseID) (bool, string, error) {
	if err := b.ready(ctx); err != nil {
		return false, "", err
	}
	var (
		released bool
		why      string
	)
	_, _, readWhy, _ := b.ackWhy(nil, "")
	err := b.pool.QueryRow(ctx, fmt.Sprintf(`
WITH a AS (DELETE FROM %[1]s a WHERE election = $1 AND token = $2 AND expires_at > clock_timestamp() RETURNING %[3]s AS why)
SELECT EXISTS (SELECT 1 FROM a)
	OR ($3::bigint <> 0 AND NOT EXISTS (SELECT 1 FROM %[2]s WHERE id = $3 AND expires_at > clock_timestamp())),
	COALESCE((SELECT why FROM a), '')`,
		b.names.acks, b.names.leases, readWhy), election, token, int64(lease)).Scan(&released, &why)
	if err != nil {
		return false, "", b.describe(err)
	}
	return released, why, nil
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
