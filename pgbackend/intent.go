package pgbackend

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
)

// Announce implements elector.Backend: the row is bound to the lease and goes with it.
func (b *Backend) Announce(ctx context.Context, election, id string, value []byte, lease elector.LeaseID) error {
	if err := b.ready(ctx); err != nil {
		return err
	}
	if value == nil {
		value = []byte{}
	}
	tag, err := b.pool.Exec(ctx, fmt.Sprintf(`
INSERT INTO %[1]s (election, id, lease, value)
SELECT $1, $2, id, $4 FROM %[2]s WHERE id = $3 AND expires_at > clock_timestamp()
ON CONFLICT (election, id) DO UPDATE SET lease = EXCLUDED.lease, value = EXCLUDED.value`,
		b.names.candidates, b.names.leases), election, id, int64(lease), value)
	if isForeignKeyViolation(err) || (err == nil && tag.RowsAffected() == 0) {
		return elector.ErrLeaseNotFound
	}
	return b.describe(err)
}

// Candidates implements elector.Backend.
func (b *Backend) Candidates(ctx context.Context, election string) ([]elector.CandidateEntry, error) {
	if err := b.ready(ctx); err != nil {
		return nil, err
	}
	list, _, err := b.readCandidates(ctx, election)
	return list, err
}

// readCandidates lists the election's live candidates, and how long the first of their
// leases to expire has left by the server's clock (0 if there are none).
func (b *Backend) readCandidates(ctx context.Context, election string) ([]elector.CandidateEntry, time.Duration, error) {
	rows, err := b.pool.Query(ctx, fmt.Sprintf(`
SELECT c.id, c.value, extract(epoch FROM l.expires_at - clock_timestamp())::float8
FROM %[1]s c JOIN %[2]s l ON l.id = c.lease
WHERE c.election = $1 AND l.expires_at > clock_timestamp()
ORDER BY c.id`, b.names.candidates, b.names.leases), election)
	if err != nil {
		return nil, 0, b.describe(err)
	}
	defer rows.Close()
	list := []elector.CandidateEntry{}
	var soonest float64
	for rows.Next() {
		var (
			en        elector.CandidateEntry
			remaining float64
		)
		if err := rows.Scan(&en.ID, &en.Value, &remaining); err != nil {
			return nil, 0, b.describe(err)
		}
		list = append(list, en)
		if len(list) == 1 || remaining < soonest {
			soonest = remaining
		}
	}
	if len(list) == 0 {
		return list, 0, b.describe(rows.Err())
	}
	// Never 0, which would say that nothing expires.
	return list, max(time.Millisecond, time.Duration(soonest*float64(time.Second))), b.describe(rows.Err())
}

// WatchCandidates implements elector.Backend, as WatchIntent: read the registry again on a
// notification about it, a poll interval after the first of the listed candidates' leases
// was due to expire (nothing is written then), and at least every third poll interval
// (every poll interval with DisableListen), and report the list when it differs from the
// last one reported. The notification only says that something changed: what is
// reported is what the read finds.
//
// This watch polls less than the others: every election of every instance runs one, and
// what it serves (see elector's registry.go) can do with a view that is a few seconds
// late when a notification was lost. A lease that ran out is seen a poll interval late:
// a read right at its expiry would find it renewed nearly always, and read again a poll
// interval later for nothing.
func (b *Backend) WatchCandidates(ctx context.Context, election string) <-chan elector.CandidatesChange {
	g := b.groupOf(election)
	out := make(chan elector.CandidatesChange, 1)
	put := func(c elector.CandidatesChange) bool { return send(ctx, out, c) }
	if g != nil {
		out = make(chan elector.CandidatesChange, groupWatchBuffer)
		put = func(c elector.CandidatesChange) bool { return offer(out, c) }
	}
	var last []elector.CandidateEntry // nil until the first report
	// see reports list if it differs from the last one reported.
	see := func(list []elector.CandidateEntry) bool {
		if last == nil || !slices.EqualFunc(list, last, sameEntry) {
			if !put(elector.CandidatesChange{Candidates: list}) {
				return false
			}
			last = list
		}
		return true
	}
	broken := func(err error) { put(elector.CandidatesChange{Err: err}) }
	if g != nil {
		g.candidates.follow(ctx, broken, func(lists map[string][]elector.CandidateEntry) bool {
			list := lists[election]
			if list == nil {
				list = []elector.CandidateEntry{}
			}
			return see(list)
		}, func() { close(out) })
		return out
	}
	var due time.Time // when the timer alone makes the next read
	b.follow(ctx, topic{election, candidatesTopic}, broken,
		func(ctx context.Context, why wakeup) (time.Duration, bool) {
			if !why.asked && time.Now().Before(due) {
				return time.Until(due), true
			}
			if last != nil && why.asked && !settle(ctx, candidatesSettle) {
				return 0, false
			}
			list, soonest, err := b.readCandidates(ctx, election)
			if err != nil {
				if ctx.Err() == nil {
					send(ctx, out, elector.CandidatesChange{Err: err})
				}
				return 0, false
			}
			if !see(list) {
				return 0, false
			}
			next := b.candidatesPace(soonest)
			due = time.Now().Add(next)
			return next, true
		}, func() { close(out) })
	return out
}

// candidatesPace is how long a watch of candidates waits for the timer alone, after a
// read whose first lease to expire had soonest left (0: none).
func (b *Backend) candidatesPace(soonest time.Duration) time.Duration {
	poll := time.Duration(b.poll.Load())
	next := poll
	if !b.cfg.DisableListen {
		next = 3 * poll
	}
	if soonest > 0 {
		next = min(next, soonest+poll)
	}
	return next
}

// candidatesSettle is how long a watch of the candidates waits before it reads again. The
// notifications come in bursts: every instance announces itself as a fleet starts, and in
// a handover the leaving leader announces that it leaves just as its successor campaigns.
// Waiting a moment makes one read of a burst, after the handover's own statements; the
// candidates' view lags the store by as much, which nothing it serves notices (a transfer
// to a candidate it does not list yet reads the store).
const candidatesSettle = 50 * time.Millisecond

// settle waits d; it returns false if ctx ended first.
func settle(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func sameEntry(x, y elector.CandidateEntry) bool {
	return x.ID == y.ID && bytes.Equal(x.Value, y.Value)
}

// SetIntent implements elector.Backend. Expired intents of other elections are deleted on
// the way.
func (b *Backend) SetIntent(ctx context.Context, election string, value []byte, ttl time.Duration) error {
	_, err := b.putIntent(ctx, election, value, ttl, "")
	return err
}

// CreateIntent implements elector.IntentCreator: the row is written only where none is,
// or where the one there has expired.
func (b *Backend) CreateIntent(ctx context.Context, election string, value []byte, ttl time.Duration) (bool, error) {
	return b.putIntent(ctx, election, value, ttl, fmt.Sprintf("WHERE %s.expires_at <= clock_timestamp()", b.names.intents))
}

// putIntent stores value as election's intent for ttl, over an intent already there only
// if it matches where (SQL, "" for any), and reports whether it stored it.
func (b *Backend) putIntent(ctx context.Context, election string, value []byte, ttl time.Duration, where string) (bool, error) {
	if err := b.ready(ctx); err != nil {
		return false, err
	}
	ms := int64(math.Ceil(float64(ttl) / float64(time.Millisecond)))
	tag, err := b.pool.Exec(ctx, fmt.Sprintf(`
WITH gc AS (DELETE FROM %[1]s WHERE expires_at <= clock_timestamp() AND election <> $1)
INSERT INTO %[1]s (election, value, rev, expires_at)
VALUES ($1, $2, %[2]s(), clock_timestamp() + $3::bigint * interval '1 millisecond')
ON CONFLICT (election) DO UPDATE
	SET value = EXCLUDED.value, rev = EXCLUDED.rev, expires_at = EXCLUDED.expires_at %[3]s`,
		b.names.intents, b.names.next, where), election, value, ms)
	if err != nil {
		return false, b.describe(err)
	}
	return tag.RowsAffected() == 1, nil
}

var _ elector.IntentCreator = (*Backend)(nil)

// ClearIntent implements elector.Backend.
func (b *Backend) ClearIntent(ctx context.Context, election string, value []byte) error {
	if err := b.ready(ctx); err != nil {
		return err
	}
	_, err := b.pool.Exec(ctx, fmt.Sprintf(`DELETE FROM %s WHERE election = $1 AND ($2::bytea IS NULL OR value = $2)`,
		b.names.intents), election, value)
	return b.describe(err)
}

// WatchIntent implements elector.Backend, as Watch does: read again on a notification, at
// the intent's expiry and every poll interval, and report what differs.
func (b *Backend) WatchIntent(ctx context.Context, election string) <-chan elector.IntentChange {
	g := b.groupOf(election)
	out := make(chan elector.IntentChange, 1)
	put := func(c elector.IntentChange) bool { return send(ctx, out, c) }
	if g != nil {
		out = make(chan elector.IntentChange, groupWatchBuffer)
		put = func(c elector.IntentChange) bool { return offer(out, c) }
	}
	seen := int64(-1) // the rev of the intent last reported; 0 for none
	see := func(in intentRow) bool {
		if in.rev != seen {
			if !put(elector.IntentChange{Value: in.value}) {
				return false
			}
			seen = in.rev
		}
		return true
	}
	broken := func(err error) { put(elector.IntentChange{Err: err}) }
	if g != nil {
		g.intents.follow(ctx, broken, func(rows map[string]intentRow) bool {
			return see(rows[election])
		}, func() { close(out) })
		return out
	}
	b.follow(ctx, topic{election, intentsTopic}, broken,
		func(ctx context.Context, _ wakeup) (time.Duration, bool) {
			var (
				in        intentRow
				remaining float64
			)
			err := b.pool.QueryRow(ctx, fmt.Sprintf(`
SELECT value, rev, extract(epoch FROM expires_at - clock_timestamp())::float8
FROM %s WHERE election = $1 AND expires_at > clock_timestamp()`, b.names.intents), election).
				Scan(&in.value, &in.rev, &remaining)
			if err != nil && !isNoRows(err) {
				if ctx.Err() == nil {
					send(ctx, out, elector.IntentChange{Err: b.describe(err)})
				}
				return 0, false
			}
			return time.Duration(max(0, remaining) * float64(time.Second)), see(in)
		}, func() { close(out) })
	return out
}

// intentRow is an election's live intent as read: its value and rev (nil and 0 when
// there is none).
type intentRow struct {
	value []byte
	rev   int64
}

// WatchGroupIntents implements elector.IntentGrouper from the group's feed of intents
// (one read of the whole set's): a first report lists every intent, then each read that
// finds some changed (a new rev, or gone) reports those. A reader that lets the buffer
// fill up has its watch ended, and watches again, which starts from a whole list.
func (b *Backend) WatchGroupIntents(ctx context.Context, group string) <-chan elector.GroupIntents {
	g := b.groups.Of(group + ".0")
	if g == nil {
		g = newGroup(b, group) // not grouped: a feed for this watch alone
	}
	out := make(chan elector.GroupIntents, groupWatchBuffer)
	var seen map[string]int64 // the rev of each intent last reported
	g.intents.follow(ctx, func(err error) { offer(out, elector.GroupIntents{Err: err}) },
		func(rows map[string]intentRow) bool {
			report := elector.GroupIntents{All: seen == nil, Intents: map[string][]byte{}}
			if seen == nil {
				seen = map[string]int64{}
			}
			for election, in := range rows {
				if rev, ok := seen[election]; !ok || rev != in.rev {
					report.Intents[election], seen[election] = in.value, in.rev
				}
			}
			for election := range seen {
				if _, ok := rows[election]; !ok {
					report.Intents[election] = nil
					delete(seen, election)
				}
			}
			if !report.All && len(report.Intents) == 0 {
				return true
			}
			return offer(out, report)
		}, func() { close(out) })
	return out
}
