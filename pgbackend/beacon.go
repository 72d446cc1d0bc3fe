package pgbackend

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/internal/beacon"
)

// Grouped heartbeats (elector.HeartbeatGrouper). A heartbeat of a grouped election's key
// (a shard set's, <group>.<n>) that rewrites the value last written sets its lease's beat
// instead of the key's rev: one UPDATE of one lease row per renewal for all the keys the
// lease holds in the group, however many. What makes that as safe as a rewrite of each key:
//   - The beat comes from <prefix>next(), like every revision, and a read of a grouped key
//     takes GREATEST(the key's rev, its lease's beat) as the revision of its last write,
//     so a beat is a write of every key its lease holds, to a watch (groupwatch.go), to a
//     vacancy (the vacated trigger keeps the lease's beat with the deleted key) and to
//     Expire.
//   - Expire of a grouped key locks its holder's lease row (FOR SHARE) and refuses when
//     the beat is above the revision the follower saw: the lock waits for a beat on its
//     way, or makes the beat wait until the delete has committed.
//   - A heartbeat is answered true only if its key was still its term's (same token, same
//     lease, same value) in a snapshot taken after the beat was written, by a statement
//     of its own (READ COMMITTED takes one per statement), so that a delete that
//     committed while the beat waited for the lease's row lock is seen; false only if the
//     key certainly was not; otherwise the key is rewritten as before. That statement
//     locks the keys it answers held (FOR KEY SHARE), so that no delete of one commits
//     between the read and the beat's commit and keeps an older beat in the vacancy.

// GroupHeartbeats implements elector.HeartbeatGrouper.
func (b *Backend) GroupHeartbeats(name string) {
	b.groups.Join(name, func() *group { return newGroup(b, name) })
}

// groupOf returns the group of election whose heartbeats this backend writes as beacons,
// nil if it has none or the schema had no beat column when it started (see probeColumns).
// Reads and Expire of a grouped key take the beacon into account either way (beatOf).
func (b *Backend) groupOf(election string) *group {
	if b.noBeat.Load() {
		return nil
	}
	return b.groups.Of(election)
}

// beatOf is the SQL for the beat of the lease or vacated row named alias. Without the
// column when this backend started, it reads the row as JSON: NULL (which GREATEST
// ignores) while the column is missing, the beat once Schema's statements have added it.
// An instance started before that migration must still see the beacons of those started
// after: they no longer rewrite their keys, and an instance blind to their beacons would
// take a live key for silent and expire it. The column is looked up when the statement
// is planned, after the statement's lock on the table; ALTER TABLE waits for that lock,
// so no beacon can be written between the look and the statement's end.
func (b *Backend) beatOf(alias string) string {
	if b.noBeat.Load() {
		return fmt.Sprintf("(to_jsonb(%s) ->> 'beat')::bigint", alias)
	}
	return alias + ".beat"
}

// group is the elections named <name>.<anything> whose heartbeats share a beacon, and the
// reads that serve their watches.
type group struct {
	b      *Backend
	name   string
	prefix string // name + "."

	mu    sync.Mutex
	beats beacon.Batcher[beatKey]
	// held is, per lease of this backend, the group's keys the lease held at its last
	// beacon, and those it won since: how many heartbeats a beacon waits for.
	held map[elector.LeaseID]map[string]bool

	keys       *feed[groupKeys]
	lastKeys   atomic.Int64 // how many keys the last read of keys found
	keyNews    keyNews      // the keys notifications named since that read
	view       keyView      // the keys as the reads so far left them (groupkeys.go)
	intents    *feed[map[string]intentRow]
	candidates *feed[map[string][]elector.CandidateEntry]
}

func newGroup(b *Backend, name string) *group {
	g := &group{b: b, name: name, prefix: name + ".", held: map[elector.LeaseID]map[string]bool{}, view: newKeyView(b.names)}
	g.beats = beacon.Batcher[beatKey]{Mu: &g.mu, Send: g.sendBeacon, Done: b.ctx.Done(), Go: func(f func()) {
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			f()
		}()
	}}
	g.keys = &feed[groupKeys]{b: b, topic: topic{name, groupKeysTopic}, read: g.readKeys, pace: b.keyPace, mark: g.keyNews.mark,
		changed: changedKeys}
	g.intents = &feed[map[string]intentRow]{b: b, topic: topic{name, groupIntentsTopic}, read: g.readIntents, pace: b.keyPace}
	g.candidates = &feed[map[string][]elector.CandidateEntry]{b: b, topic: topic{name, groupCandidatesTopic}, read: g.readCandidates,
		pace: b.candidatesPace, settle: candidatesSettle}
	return g
}

// holding notes that lease won election's key.
func (g *group) holding(lease elector.LeaseID, election string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.held[lease] == nil {
		g.held[lease] = map[string]bool{}
	}
	g.held[lease][election] = true
}

// beatKey is one heartbeat waiting in a batch: the term and the value's digest.
type beatKey struct {
	token  int64
	digest [sha256.Size]byte
}

// beaconTimeout bounds one write of a beacon.
const beaconTimeout = 5 * time.Second

// beat answers a heartbeat of election's term token, held under lease with a value of
// digest, with a beacon.
func (g *group) beat(ctx context.Context, election string, token int64, lease elector.LeaseID, digest [sha256.Size]byte) (beacon.Answer, error) {
	return g.addBeat(election, token, lease, digest).Wait(ctx, election)
}

// addBeat adds a heartbeat of election's term token, held under lease, to the lease's next
// beacon and returns its batch.
func (g *group) addBeat(election string, token int64, lease elector.LeaseID, digest [sha256.Size]byte) *beacon.Batch[beatKey] {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.beats.Add(lease, election, beatKey{token: token, digest: digest}, func() int { return len(g.held[lease]) })
}

// sendBeacon writes batch's beacon and answers its heartbeats.
func (g *group) sendBeacon(batch *beacon.Batch[beatKey]) {
	answers, err := g.writeBeacon(batch.Lease, batch.Keys)
	g.mu.Lock()
	defer g.mu.Unlock()
	batch.Resolve(answers, err)
}

// writeBeacon writes lease's beacon and answers the heartbeats of keys with it: in one
// transaction, READ COMMITTED whatever the server's default (each statement then reads a
// snapshot taken when it starts), it sets the lease's beat if the lease is alive, then
// reads the group's keys the lease holds, in a statement of its own, after the beat
// holds the lease's row lock: a delete of a key that committed before is seen, and a
// guarded Expire not yet committed waits for the beat and then finds it. The read locks
// the keys it answers held (FOR KEY SHARE): a delete of one that comes later waits for
// the beat to commit, and its vacated trigger then keeps this beat. A key already locked
// by a delete not yet committed (an operator's, whose trigger read the beat before this
// one) is answered Unknown: its heartbeat rewrites the key, which waits for the delete's
// end without holding the lease's row. So the vacated key keeps a beat no older than any
// heartbeat answered held. One round trip.
func (g *group) writeBeacon(lease elector.LeaseID, keys map[string]beatKey) (map[string]beacon.Answer, error) {
	ctx, cancel := context.WithTimeout(g.b.ctx, beaconTimeout)
	defer cancel()
	n := g.b.names
	batch := &pgx.Batch{}
	batch.Queue(`BEGIN ISOLATION LEVEL READ COMMITTED`)
	batch.Queue(fmt.Sprintf(`UPDATE %[1]s SET beat = %[2]s() WHERE id = $1 AND expires_at > clock_timestamp() RETURNING beat`,
		n.leases, n.next), int64(lease))
	batch.Queue(fmt.Sprintf(`
WITH locked AS MATERIALIZED (
	SELECT name, token, sha256(value) AS digest FROM %[1]s WHERE lease = $1 AND starts_with(name, $2)
	FOR KEY SHARE SKIP LOCKED
)
SELECT e.name, k.token, k.digest FROM %[1]s e LEFT JOIN locked k USING (name)
WHERE e.lease = $1 AND starts_with(e.name, $2)`, n.elections), int64(lease), g.prefix)
	if !g.b.cfg.DisableListen {
		// The group's watches look at once, as they do when a key is written.
		batch.Queue(`SELECT pg_notify($1, $2)`, n.channel, g.name+"/b")
	}
	batch.Queue(`COMMIT`)
	m := g.b.mark("")
	results := g.b.pool.SendBatch(ctx, batch)
	defer results.Close()
	if _, err := results.Exec(); err != nil {
		return nil, g.b.describe(err)
	}
	var beat int64
	alive := true
	if err := results.QueryRow().Scan(&beat); isNoRows(err) {
		alive = false
	} else if err != nil {
		return nil, g.b.describe(err)
	}
	held := map[string]beatKey{}
	busy := map[string]bool{} // found, but locked by a delete or an update of its name
	rows, err := results.Query()
	if err != nil {
		return nil, g.b.describe(err)
	}
	for rows.Next() {
		var (
			name   string
			token  *int64
			digest []byte
		)
		if err := rows.Scan(&name, &token, &digest); err != nil {
			rows.Close()
			return nil, g.b.describe(err)
		}
		if token == nil {
			busy[name] = true
			continue
		}
		k := beatKey{token: *token}
		copy(k.digest[:], digest)
		held[name] = k
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, g.b.describe(err)
	}
	if !g.b.cfg.DisableListen {
		if _, err := results.Exec(); err != nil {
			return nil, g.b.describe(err)
		}
	}
	if _, err := results.Exec(); err != nil {
		return nil, g.b.describe(err)
	}
	if alive {
		if err := g.b.checkFence(m, "", beat, nil); err != nil {
			return nil, err
		}
	}
	answers := make(map[string]beacon.Answer, len(keys))
	for election, k := range keys {
		h, ok := held[election]
		switch {
		case alive && busy[election]:
			answers[election] = beacon.Unknown // being deleted: the key's rewrite waits for the outcome
		case !alive || !ok || h.token != k.token:
			answers[election] = beacon.Gone // the lease or the term is over
		case bytes.Equal(h.digest[:], k.digest[:]):
			answers[election] = beacon.Held
		default:
			answers[election] = beacon.Unknown // its value was changed by hand: write it
		}
	}
	g.mu.Lock()
	if alive {
		now := make(map[string]bool, len(held)+len(busy))
		for name := range held {
			now[name] = true
		}
		for name := range busy {
			now[name] = true
		}
		g.held[lease] = now
	} else {
		delete(g.held, lease)
	}
	g.mu.Unlock()
	return answers, nil
}

// expireSQL is Expire's statement for a key of the group: delete the key of term $2 if
// neither it nor its holder's beacon was written after $3. The holder's lease row is
// locked first (MATERIALIZED keeps the lock in a step of its own, before the delete): a
// beat on its way is waited for and then seen, and a beat that comes later waits for the
// delete to commit and then finds the key gone.
func (g *group) expireSQL() string {
	n := g.b.names
	return fmt.Sprintf(`
WITH holder AS MATERIALIZED (
	SELECT %[3]s AS beat FROM %[2]s l JOIN %[1]s e ON e.lease = l.id
	WHERE e.name = $1 AND e.token = $2
	FOR SHARE OF l
)
DELETE FROM %[1]s WHERE name = $1 AND token = $2 AND rev <= $3
	AND NOT EXISTS (SELECT 1 FROM holder WHERE beat > $3)`, n.elections, n.leases, g.b.beatOf("l"))
}

var (
	_ elector.HeartbeatGrouper = (*Backend)(nil)
	_ elector.HeartbeatBatcher = (*Backend)(nil)
	_ elector.IntentGrouper    = (*Backend)(nil)
)
