package pgbackend

import (
	"fmt"
	"strings"
	"sync"

	"go.uber.org/zap"

	"github.com/caddyleader/caddy-leader/elector"
)

// Fencing tokens, lease ids and revisions all come from <prefix>next(): the WAL timeline
// in the top bits, a sequence below. In one cluster's history that only rises, a failover
// to an asynchronous standby included. It goes back when the history is replaced:
// pg_upgrade and a dump restored into a new cluster start again at timeline 1, a
// logical-replication cutover does not carry the sequence, and a restore from a backup
// brings back an older sequence. A new term would then get a token below one already used,
// and a resource that refuses tokens below the highest it has seen (the fencing recipe)
// would refuse every write for good.
//
// Two marks keep the generator above what was handed out:
//   - in the store: <prefix>fenced(floor), which lease grants and campaigns use, compares
//     the next value with the highest token and lease id the tables hold (and with floor).
//     If it is not above them, the generator went back: the sequence is moved past the
//     mark plus fenceSlack, so that values the lost history handed out after the tables'
//     newest are skipped too. The tables travel with every upgrade, dump and replication
//     of the data; no extra row is written, so campaigns take no lock of their own.
//   - in every instance's memory: the highest value this backend was answered, and the
//     highest token it saw hold each election. An answer below what was seen before its
//     request was sent is a rewind (a restore from an older backup brings back an older
//     sequence and older rows, which the store's own mark cannot tell from the present):
//     the request fails with elector.ErrStoreRewound, and so does the next Renew, which
//     makes the elector give its lease up (stop admitting) and campaign again. Its next
//     grant and campaign pass what it saw as floor, so the new term's token is above.
//
// docs/postgres.md gives the operator's procedure for upgrades and restores.

// fenceSlack is how far past the mark the generator moves when it went back: more values
// than any instance hands out in years (a read takes one), far fewer than the 2^40 of one
// timeline.
const fenceSlack = 1 << 32

// fenceSchema is the DDL of the store's mark: <prefix>fenced(floor) and <prefix>prev(name),
// the token of the election's last deleted term (read with a snapshot of its own, after
// the campaign's insert, so that a term deleted while the campaign ran is not missed).
func fenceSchema(n names) string {
	return fmt.Sprintf(`
CREATE OR REPLACE FUNCTION %[1]s(floor bigint) RETURNS bigint LANGUAGE plpgsql VOLATILE AS $f$
DECLARE
	-- The mark first: every value it holds was handed out before v is. The other way
	-- round, a value handed out after v, by a grant or campaign running alongside, could
	-- be in it, and v would look behind when it is not.
	mark bigint := greatest(floor, (SELECT max(token) FROM %[4]s), (SELECT max(token) FROM %[5]s),
		(SELECT max(id) FROM %[6]s));
	v bigint := %[2]s();
BEGIN
	IF v <= mark THEN
		PERFORM setval('%[3]s', (SELECT last_value FROM %[3]s) + (mark - v) + %[8]d);
		v := %[2]s();
	END IF;
	RETURN v;
END
$f$;
CREATE OR REPLACE FUNCTION %[7]s(election text) RETURNS bigint LANGUAGE plpgsql VOLATILE AS $f$
BEGIN
	RETURN (SELECT token FROM %[5]s WHERE name = election);
END
$f$;
`, n.fenced, n.next, n.seq, n.elections, n.vacated, n.leases, n.prev, fenceSlack)
}

// seen is what a backend was answered: the generator's highest value and, per election,
// the highest token seen holding it.
type seen struct {
	mu      sync.Mutex
	highest int64
	terms   map[string]int64
	// renewOwed is set when a rewind was detected by a request other than Renew: the
	// lease being renewed was granted in the old history, so the next Renew reports it.
	renewOwed bool
	// warned is set once the rewind was logged; a grant above the mark clears it.
	warned bool
}

// fenceMark is what a request knew when it was sent.
type fenceMark struct{ highest, term int64 }

// mark is taken before a request is sent; its answer is checked against it.
func (b *Backend) mark(election string) fenceMark {
	b.seen.mu.Lock()
	defer b.seen.mu.Unlock()
	return fenceMark{highest: b.seen.highest, term: b.seen.terms[election]}
}

// markGroup is mark for a read of every election whose name begins with prefix: what
// was seen before it was sent, with the terms of those elections by name.
func (b *Backend) markGroup(prefix string) (highest int64, terms map[string]int64) {
	b.seen.mu.Lock()
	defer b.seen.mu.Unlock()
	terms = map[string]int64{}
	for election, token := range b.seen.terms {
		if strings.HasPrefix(election, prefix) {
			terms[election] = token
		}
	}
	return b.seen.highest, terms
}

// markElections is markGroup for the elections named.
func (b *Backend) markElections(names []string) (highest int64, terms map[string]int64) {
	b.seen.mu.Lock()
	defer b.seen.mu.Unlock()
	terms = make(map[string]int64, len(names))
	for _, election := range names {
		if token, ok := b.seen.terms[election]; ok {
			terms[election] = token
		}
	}
	return b.seen.highest, terms
}

// floor is the value that the next lease id and token must exceed.
func (b *Backend) floor() int64 {
	b.seen.mu.Lock()
	defer b.seen.mu.Unlock()
	return b.seen.highest
}

// checkFence records v, a value of the generator answered to a request sent at m, and h,
// the holder of election it reported (if any), and reports a rewind if either is below
// what was seen before m.
func (b *Backend) checkFence(m fenceMark, election string, v int64, h *elector.Holder) error {
	s := &b.seen
	s.mu.Lock()
	defer s.mu.Unlock()
	var err error
	switch {
	case v < m.highest:
		err = fmt.Errorf("postgres handed out %d after %d had been seen (its sequence or WAL timeline went back): %w",
			v, m.highest, elector.ErrStoreRewound)
	case h != nil && h.Token < m.term:
		err = fmt.Errorf("election %q is held in term %d after term %d had been seen: %w",
			election, h.Token, m.term, elector.ErrStoreRewound)
	default:
		s.highest = max(s.highest, v)
		if h != nil {
			s.highest = max(s.highest, h.Token)
			if h.Token > s.terms[election] {
				s.terms[election] = h.Token
			}
		}
		return nil
	}
	s.renewOwed = true
	if !s.warned {
		s.warned = true
		b.cfg.Logger.Error("PostgreSQL went back in time: a pg_upgrade, a restore from a backup or into a new cluster, "+
			"or a cutover to another server, without the fencing tokens moved on; what this instance learned before is void, "+
			"so it gives its lease up, stops admitting and campaigns again above the highest token it saw. "+
			"See docs/postgres.md (upgrades and restores)", zap.String("election", election), zap.Error(err))
	}
	return b.describe(err)
}

// granted records a lease id granted above the floor: the generator is past the mark
// again, and a later rewind is worth another ERROR.
func (b *Backend) granted(m fenceMark, id int64) error {
	if err := b.checkFence(m, "", id, nil); err != nil {
		return err
	}
	b.seen.mu.Lock()
	b.seen.warned = false
	b.seen.mu.Unlock()
	return nil
}

// owedRewind returns the rewind a Renew must report, once.
func (b *Backend) owedRewind() error {
	b.seen.mu.Lock()
	defer b.seen.mu.Unlock()
	if !b.seen.renewOwed {
		return nil
	}
	b.seen.renewOwed = false
	return b.describe(fmt.Errorf("the lease was granted before PostgreSQL went back in time: %w", elector.ErrStoreRewound))
}
