package pgbackend

import (
	"context"
	"crypto/sha256"
	"fmt"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/internal/beacon"
)

// The elector's heartbeat rewrites the election key with the same record, and the record
// holds the term's mark key (a secret: it signs forwarded requests). A server that logs
// statements (log_statement = mod, or all) logs their parameters too, in full by default:
// every heartbeat would put the secret in the log, ttl/3 apart. So the value goes over the
// wire only when it changes (a campaign, a handover mark); a rewrite of the value this
// backend wrote last for the term sends its SHA-256 instead, which tells nothing of it.

// wrote is the last value a backend wrote to an election's key: its term, the term's
// lease, and the value's digest.
type wrote struct {
	token  int64
	lease  elector.LeaseID
	digest [sha256.Size]byte
}

// noteWritten records that value is the key's value in term token, as this backend wrote
// it; lease is the term's, or 0 when the caller does not know it (the lease noted for the
// term stays).
func (b *Backend) noteWritten(election string, token int64, lease elector.LeaseID, value []byte) {
	b.wroteMu.Lock()
	defer b.wroteMu.Unlock()
	if w, ok := b.wrote[election]; ok && w.token == token && lease == 0 {
		lease = w.lease
	}
	b.wrote[election] = wrote{token: token, lease: lease, digest: sha256.Sum256(value)}
}

// wroteLast returns value's digest and, if this backend wrote value last in term token,
// the term's lease (0 if it did not, or does not know the lease).
func (b *Backend) wroteLast(election string, token int64, value []byte) ([sha256.Size]byte, elector.LeaseID, bool) {
	d := sha256.Sum256(value)
	b.wroteMu.Lock()
	defer b.wroteMu.Unlock()
	w, ok := b.wrote[election]
	if !ok || w.token != token || w.digest != d {
		return d, 0, false
	}
	return d, w.lease, true
}

// Update implements elector.Backend: only while the key is still term token's and its
// lease alive. Rewriting the value this backend wrote last sends only its digest: the row
// gets a new revision, which watchers report as a write, if its value still has that
// digest; if not (an operator changed it by hand), the value is written in full. Such a
// rewrite of a grouped election's key (a heartbeat) writes its lease's beacon instead,
// where the beacon can answer (beacon.go).
func (b *Backend) Update(ctx context.Context, election string, token int64, value []byte) (bool, error) {
	if err := b.ready(ctx); err != nil {
		return false, err
	}
	if digest, lease, same := b.wroteLast(election, token, value); same {
		if g := b.groupOf(election); g != nil && lease != 0 {
			answer, err := g.beat(ctx, election, token, lease, digest)
			if updated, decided := answer.Decided(); decided || err != nil {
				return updated && err == nil, err
			}
		}
	}
	return b.rewrite(ctx, election, token, value)
}

// UpdateAll implements elector.HeartbeatBatcher: the heartbeats of a group's keys join
// their lease's next beacon together, so one transaction answers them all (beacon.go); an
// update the beacon cannot answer is Update's statement, rewriteParallel at once.
func (b *Backend) UpdateAll(ctx context.Context, updates []elector.KeyUpdate) []elector.UpdateResult {
	if err := b.ready(ctx); err != nil {
		out := make([]elector.UpdateResult, len(updates))
		for i := range out {
			out[i].Err = err
		}
		return out
	}
	return beacon.UpdateAll(ctx, updates, func(u elector.KeyUpdate) *beacon.Batch[beatKey] {
		if digest, lease, same := b.wroteLast(u.Election, u.Token, u.Value); same {
			if g := b.groupOf(u.Election); g != nil && lease != 0 {
				return g.addBeat(u.Election, u.Token, lease, digest)
			}
		}
		return nil
	}, b.rewrite, rewriteParallel)
}

// rewriteParallel is how many of UpdateAll's own statements are on their way at once.
const rewriteParallel = 8

// rewrite is Update without a beacon: the key's row, if it is still term token's and its
// lease alive.
func (b *Backend) rewrite(ctx context.Context, election string, token int64, value []byte) (bool, error) {
	const live = `name = $1 AND token = $2 AND lease IN (SELECT id FROM %[2]s WHERE expires_at > clock_timestamp())`
	if digest, _, same := b.wroteLast(election, token, value); same {
		tag, err := b.pool.Exec(ctx, fmt.Sprintf(`UPDATE %[1]s SET rev = %[3]s() WHERE `+live+` AND sha256(value) = $3`,
			b.names.elections, b.names.leases, b.names.next), election, token, digest[:])
		if err != nil || tag.RowsAffected() == 1 {
			return err == nil, b.describe(err)
		}
	}
	tag, err := b.pool.Exec(ctx, fmt.Sprintf(`UPDATE %[1]s SET value = $3, rev = %[3]s() WHERE `+live,
		b.names.elections, b.names.leases, b.names.next), election, token, value)
	if err != nil {
		return false, b.describe(err)
	}
	if tag.RowsAffected() != 1 {
		return false, nil
	}
	b.noteWritten(election, token, 0, value)
	return true, nil
}
