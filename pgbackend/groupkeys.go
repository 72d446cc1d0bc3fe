package pgbackend

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
)

// A group's keys are read whole now and then. In between, a read takes
// the rows of the keys that notifications named since the last read, and the leases the
// held keys are under (a beacon changes its lease's beat, and so the revision every key
// of that lease reports, without a write to a key's row); every other key is as the last
// read left it. A read is whole
//   - when nothing has been read yet, or the last read failed;
//   - when the listener is not LISTENing, or may have lost notifications (it wakes every
//     watch then; see listener.wakeAll): a change then reaches no watch by name;
//   - once wholeReadsEvery (or the poll interval, if longer) has passed since the last
//     whole read: a change that sent no notification (one made with the triggers
//     disabled, as a logical replica's apply does) is found that late at most;
//   - when notifications named more keys than a quarter of the group (one scan costs
//     less), or a held key's lease is gone (its delete cascades to its keys, whose
//     notifications may not have come yet).
// A watch that joins names its key, so the read that serves it first reads that key after
// the watch began, as a read of its own would have.
//
// At 4,096 shards on five instances, each owner's beacon made every instance read all
// 4,096 rows again: about 30,000 rows a second per instance, and 43 % of an idle
// instance's CPU (BENCHMARKS.md §12); and whole reads at every poll interval (a third of
// the ttl) were still a quarter of it.

// groupKeys is one read of a group's keys: as read does for one key, the revision of the
// read (rev), one below it for a vacancy's last write (lastAt), and each key that is held,
// whose lease expired, or that was deleted (in the vacated table), by name.
type groupKeys struct {
	rev, lastAt int64
	keys        map[string]groupKey
	// changed lists the keys this read may have found changed since the last one,
	// unless whole: then any key may have (see feed.changed).
	changed []string
	whole   bool
}

// changedKeys is the keys feed's changed.
func changedKeys(k groupKeys) ([]string, bool) { return k.changed, k.whole }

type groupKey struct {
	holder    elector.Holder
	rowRev    int64 // of its last write or its lease's beacon, whichever is later
	live      bool  // held: its lease is alive
	remaining time.Duration
	// held says whether the key's row is in the elections table, under holder.Lease,
	// whose beat counts in rowRev, rather than in the vacated one; keyRev is the
	// revision of that row's last write.
	held   bool
	keyRev int64
}

// sameAs reports whether key k, present or not (ok), is as key was (present or not:
// wasOK) in every respect that a watch's report of it depends on (see news): who holds it,
// whether that holder's lease is alive, and the revision of its last write or beacon.
func (k groupKey) sameAs(ok bool, was groupKey, wasOK bool) bool {
	return ok == wasOK && k.live == was.live && k.rowRev == was.rowRev &&
		k.holder.Token == was.holder.Token && k.holder.Lease == was.holder.Lease
}

// reading is the read of election's key that r holds, as read would have returned it.
func (k groupKeys) reading(election string) reading {
	r := reading{obs: elector.Observation{Revision: k.rev}}
	key, ok := k.keys[election]
	switch {
	case ok && key.live:
		h := key.holder
		r.obs.Holder, r.remaining, r.rowRev = &h, key.remaining, key.rowRev
		return r
	case ok:
		h := key.holder
		r.last, r.rowRev = &h, key.rowRev
	}
	r.lastAt = k.lastAt
	return r
}

// keyNews gathers the elections of a group that notifications named since the last read
// of its keys.
type keyNews struct {
	mu    sync.Mutex
	names map[string]struct{}
	all   bool // read them all: notifications may have been lost
}

// mostNamedKeys bounds the names kept: a flood of notifications (forged ones too) makes the
// next read whole instead.
const mostNamedKeys = 1024

// mark records that election's key may have changed (every key's if all).
func (n *keyNews) mark(election string, all bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.all {
		return
	}
	if all || len(n.names) >= mostNamedKeys {
		n.all, n.names = true, nil
		return
	}
	if n.names == nil {
		n.names = map[string]struct{}{}
	}
	n.names[election] = struct{}{}
}

// take returns what was marked since the last take and forgets it.
func (n *keyNews) take() (names []string, all bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	names = make([]string, 0, len(n.names))
	for name := range n.names {
		names = append(names, name)
	}
	all = n.all
	n.names, n.all = nil, false
	return names, all
}

// wholeReadsEvery is how often a group's keys are read whole while the listener is
// LISTENing (see above).
const wholeReadsEvery = 10 * time.Second

// keyView is the group's keys as the reads so far left them; only the keys feed's
// goroutine reads and writes it (its reads run one at a time), and a watch looks at what
// a read returned before the next read begins.
type keyView struct {
	keys      groupKeys // nil keys: the next read is whole
	leases    []int64   // the leases of its held keys
	wholeRead time.Time // when the last whole read began
	// wholeSQL reads the group's keys ($1: its prefix), namedSQL the keys named ($1) and
	// the leases ($2).
	wholeSQL, namedSQL string
}

func newKeyView(n names) keyView {
	return keyView{
		wholeSQL: keysSQL(n, `starts_with(e.name, $1)`, `starts_with(v.name, $1)`, ""),
		namedSQL: keysSQL(n, `e.name = ANY($1)`, `v.name = ANY($1)`, `l.id = ANY($2)`),
	}
}

// readKeys reads the group's keys (see above for which) and returns them all, with how
// long until the first held key's lease expires by the server's clock (0: none is held).
func (g *group) readKeys(ctx context.Context) (groupKeys, time.Duration, error) {
	names, all := g.keyNews.take()
	v := &g.view
	every := max(time.Duration(g.b.poll.Load()), wholeReadsEvery)
	if all || v.keys.keys == nil || !g.b.listener.listening() || time.Since(v.wholeRead) >= every ||
		len(names) > len(v.keys.keys)/4 {
		return g.readWhole(ctx)
	}
	soonest, changed, whole, err := g.readNamed(ctx, names)
	switch {
	case err != nil:
		v.keys = groupKeys{}
		return groupKeys{}, 0, err
	case whole:
		return g.readWhole(ctx)
	}
	k := v.keys
	k.changed, k.whole = changed, false
	return k, soonest, nil
}

// keysSQL is a read of keys: the two revisions, and a key's name, value, lease, token and
// revision with its lease's beat, liveness and time left, for each held key that matches
// (a condition on e.name) and each vacated one (on v.name; deleted, kept by the vacated
// trigger: no beat, and a revision that is the later of its last write and its lease's
// last beacon); and, if leases is not empty, a row for each lease it selects (on l.id),
// without a name.
func keysSQL(n names, held, vacated, leases string) string {
	sql := fmt.Sprintf(`
WITH rv AS MATERIALIZED (SELECT %[4]s() AS a, %[4]s() AS b)
SELECT rv.a, rv.b, k.name, k.value, k.lease, k.token, k.rev, k.beat, k.live, k.remaining
FROM rv LEFT JOIN (
	SELECT e.name, e.value, e.lease, e.token, e.rev, l.beat,
		l.expires_at > clock_timestamp() AS live,
		extract(epoch FROM l.expires_at - clock_timestamp())::float8 AS remaining
	FROM %[1]s e JOIN %[2]s l ON l.id = e.lease
	WHERE %[5]s
	UNION ALL
	SELECT v.name, v.value, v.lease, v.token, GREATEST(v.rev, v.beat), NULL, false, 0
	FROM %[3]s v
	WHERE %[6]s AND NOT EXISTS (SELECT 1 FROM %[1]s e WHERE e.name = v.name)`, n.elections, n.leases, n.vacated, n.next, held, vacated)
	if leases != "" {
		sql += fmt.Sprintf(`
	UNION ALL
	SELECT NULL, NULL, l.id, NULL, NULL, l.beat, l.expires_at > clock_timestamp(),
		extract(epoch FROM l.expires_at - clock_timestamp())::float8
	FROM %s l WHERE %s`, n.leases, leases)
	}
	return sql + `
) k ON true`
}

// readWhole reads every key of the group, in one statement, as read reads one: the held
// keys with their leases, the vacated ones of the names not held, and two revisions.
func (g *group) readWhole(ctx context.Context) (groupKeys, time.Duration, error) {
	b := g.b
	g.view.keys = groupKeys{}
	if err := b.ready(ctx); err != nil {
		return groupKeys{}, 0, err
	}
	began := time.Now()
	highest, terms := b.markGroup(g.prefix)
	rows, err := b.pool.Query(ctx, g.view.wholeSQL, g.prefix)
	if err != nil {
		return groupKeys{}, 0, b.describe(err)
	}
	// As many keys as the last read found, most likely: no growing the map key by key.
	k := groupKeys{keys: make(map[string]groupKey, g.lastKeys.Load())}
	if err := g.scanKeys(rows, &k, nil, fenceMark{highest: highest}, terms); err != nil {
		return groupKeys{}, 0, err
	}
	soonest, leases, _, _ := leasesOf(k.keys, nil)
	k.whole = true
	g.lastKeys.Store(int64(len(k.keys)))
	g.view.keys, g.view.leases, g.view.wholeRead = k, leases, began
	return k, soonest, nil
}

// readNamed reads the keys named and the leases of the held ones into the view, and
// returns the keys that may have changed: those named, and those whose lease's beat or
// liveness did. It reports whole if the view cannot be brought up to date that way: a
// held key's lease is gone.
func (g *group) readNamed(ctx context.Context, names []string) (soonest time.Duration, changed []string, whole bool, err error) {
	b := g.b
	if err := b.ready(ctx); err != nil {
		return 0, nil, false, err
	}
	highest, terms := b.markElections(names)
	rows, err := b.pool.Query(ctx, g.view.namedSQL, names, g.view.leases)
	if err != nil {
		return 0, nil, false, b.describe(err)
	}
	v := &g.view.keys
	for _, name := range names {
		delete(v.keys, name) // found again below if it is still there
	}
	leases := map[elector.LeaseID]leaseRow{}
	if err := g.scanKeys(rows, v, leases, fenceMark{highest: highest}, terms); err != nil {
		return 0, nil, false, err
	}
	soonest, ids, beaten, ok := leasesOf(v.keys, leases)
	if !ok {
		return 0, nil, true, nil
	}
	g.view.leases = ids
	return soonest, append(names, beaten...), false, nil
}

// leaseRow is a lease as a read of keys found it.
type leaseRow struct {
	beat      int64
	live      bool
	remaining time.Duration
}

// scanKeys reads rows of keyColumns into k (and, if leases is not nil, the leases found
// into leases), checking each live holder against the fencing marks taken before the
// statement was sent (m, and terms by election). It closes rows.
func (g *group) scanKeys(rows interface {
	Next() bool
	Scan(...any) error
	Err() error
	Close()
}, k *groupKeys, leases map[elector.LeaseID]leaseRow, m fenceMark, terms map[string]int64) error {
	b := g.b
	defer rows.Close()
	for rows.Next() {
		var (
			a, c      int64
			name      *string
			value     []byte
			lease     *int64
			token     *int64
			rev       *int64
			beat      *int64
			live      *bool
			remaining *float64
		)
		if err := rows.Scan(&a, &c, &name, &value, &lease, &token, &rev, &beat, &live, &remaining); err != nil {
			return b.describe(err)
		}
		k.rev, k.lastAt = max(a, c), min(a, c)
		var l leaseRow
		if beat != nil {
			l = leaseRow{beat: *beat, live: *live}
			if l.live {
				l.remaining = time.Duration(max(0, *remaining) * float64(time.Second))
			}
			if leases != nil {
				leases[elector.LeaseID(*lease)] = l
			}
		}
		if name == nil {
			continue // a lease alone, or no key at all: the one row of the revisions
		}
		key := groupKey{holder: elector.Holder{Value: value, Lease: elector.LeaseID(*lease), Token: *token}, keyRev: *rev, rowRev: *rev}
		if beat != nil {
			key.held, key.live, key.remaining, key.rowRev = true, l.live, l.remaining, max(*rev, l.beat)
			if key.live {
				if err := b.checkFence(fenceMark{highest: m.highest, term: terms[*name]}, *name, a, &key.holder); err != nil {
					return err
				}
			}
		}
		k.keys[*name] = key
	}
	if err := rows.Err(); err != nil {
		return b.describe(err)
	}
	return b.checkFence(m, "", k.lastAt, nil)
}

// leasesOf brings the held keys of keys up to date with leases (when not nil) and returns
// how long until the first of their leases expires (0: none is held), the leases they are
// under, and the keys whose lease's beat or liveness changed; ok is false if one of those
// leases is not in leases.
func leasesOf(keys map[string]groupKey, leases map[elector.LeaseID]leaseRow) (soonest time.Duration, ids []int64, beaten []string, ok bool) {
	under := map[elector.LeaseID]bool{}
	for name, key := range keys {
		if !key.held {
			continue
		}
		if leases != nil {
			l, found := leases[key.holder.Lease]
			if !found {
				return 0, nil, nil, false
			}
			rowRev := max(key.keyRev, l.beat)
			if key.live != l.live || key.rowRev != rowRev {
				beaten = append(beaten, name)
			}
			key.live, key.remaining, key.rowRev = l.live, l.remaining, rowRev
			keys[name] = key
		}
		if key.live && (soonest == 0 || key.remaining < soonest) {
			soonest = max(key.remaining, time.Millisecond)
		}
		if !under[key.holder.Lease] {
			under[key.holder.Lease] = true
			ids = append(ids, int64(key.holder.Lease))
		}
	}
	return soonest, ids, beaten, true
}
