package etcdbackend

import (
	"context"
	"fmt"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/caddyleader/caddy-leader/elector"
)

// A store restored from a snapshot without `etcdutl snapshot restore --bump-revision`
// starts again at the snapshot's revision: keys are created at revisions handed out
// before, so fencing tokens repeat or go backwards, and a watch started after a revision
// of the old history waits, silently, for a revision the new history may take long to
// reach. etcd says nothing about it to its clients; the only sign is the revision in
// every response header, which in one history never decreases.
//
// Not every header can be compared, though, nor with every revision. A linearizable read,
// and anything that goes through raft (writes, transactions, lease grants and revokes), is
// answered by a member that has applied everything committed before the request began, so
// its revision is at least every revision seen before the request was sent; not every one
// seen while it was under way (requests run concurrently, and a grant applied before a
// put may be answered after it). Each request therefore takes a mark when it starts and is
// compared with that. A lease keepalive or time-to-live, and a watch, are answered from
// whatever the member they reach has applied: a follower a few entries behind reports an
// older revision in a perfectly healthy cluster. Their headers only raise a suspicion,
// which a linearizable read then confirms or dismisses.
//
// A restore with --bump-revision keeps the revision rising, but brings back the keys of the
// snapshot, the election key of the term then current among them: its token is older than
// terms seen since. Tokens of one election only ever rise in one history, so an election
// key whose token is below one already seen is the same sign, from the keys' side.

// revisions is the highest store revision a Backend has seen, and what it does when the
// store goes back on it.
type revisions struct {
	mu      sync.Mutex
	highest int64
	// rewound is closed, and replaced, whenever a rewind is detected: it breaks the
	// backend's open watches, which would otherwise wait for the old history's revisions.
	rewound chan struct{}
	// renewOwed is set when a rewind was detected by a request other than Renew: the
	// lease being renewed was learned in the old history too, so the next Renew reports
	// the rewind (renewals are how the elector learns to give its lease up).
	renewOwed bool
	// epoch counts detected rewinds: an answer to a request sent before the last one is
	// compared with nothing (which history it comes from cannot be told).
	epoch uint64
	// terms holds, per election, the highest token seen, the revision it was seen at,
	// and the last older token reported.
	terms map[string]termsSeen
}

type termsSeen struct{ token, at, reported int64 }

// mark is what a request knew when it was sent.
type mark struct {
	highest int64
	epoch   uint64
}

// mark is taken before a request is sent; its answer is checked against it.
func (b *Backend) mark() mark {
	b.revs.mu.Lock()
	defer b.revs.mu.Unlock()
	return mark{highest: b.revs.highest, epoch: b.revs.epoch}
}

func newRevisions() revisions {
	return revisions{rewound: make(chan struct{}), terms: make(map[string]termsSeen)}
}

// rewoundError says which revisions disagreed.
func rewoundError(seen, now int64) error {
	return fmt.Errorf("etcd answered at revision %d after revision %d had been seen: %w", now, seen, elector.ErrStoreRewound)
}

// errRewoundElsewhere breaks a watch when another request detected a rewind.
var errRewoundElsewhere = fmt.Errorf("etcd watch abandoned: %w", elector.ErrStoreRewound)

// checked records the revision of an answer that is linearizable (see above) to a request
// sent at m, and reports a rewind if it is older than one seen before m. On a rewind it
// logs at ERROR, once, and takes the new revision as the highest, so that later answers
// are checked against the new history rather than reported again and again.
func (b *Backend) checked(m mark, h *pb.ResponseHeader) error {
	if h == nil {
		return nil
	}
	r := &b.revs
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case m.epoch != r.epoch:
		return nil // sent before the last rewind was detected: of either history
	case h.Revision >= m.highest:
		r.highest = max(r.highest, h.Revision)
		return nil
	}
	seen := m.highest
	r.highest = h.Revision
	r.epoch++
	clear(r.terms) // tokens of the old history say nothing about the new one's
	r.rewoundLocked()
	b.cfg.Logger.Error("etcd's revision went backwards: it was restored from a snapshot without --bump-revision, "+
		"or replaced by another cluster; leases, terms and watches learned before are void, so this instance gives up "+
		"its lease, stops admitting and campaigns again. Restore with `etcdutl snapshot restore --bump-revision "+
		"1000000000 --mark-compacted` so fencing tokens keep rising (see docs/operator-actions.md)",
		zap.Int64("seen_revision", seen), zap.Int64("revision", h.Revision),
		zap.String("cluster_id", fmt.Sprintf("%x", h.ClusterId)), zap.String("member_id", fmt.Sprintf("%x", h.MemberId)))
	return rewoundError(seen, h.Revision)
}

// rewoundLocked breaks open watches and owes Renew the news. r.mu is held.
func (r *revisions) rewoundLocked() {
	close(r.rewound)
	r.rewound = make(chan struct{})
	r.renewOwed = true
}

// checkTerm records the token of the holder of election's key as of revision rev, and
// reports a rewind if a newer term was seen at a revision no later than rev (for a request
// sent at m): in one
// history, the key at a later revision is never of an older term. Unlike a revision, the
// highest token is kept: every term the store starts from now on has a higher one, and
// until the old term's key is gone (its holder gives its lease up on the rewind, or the
// lease expires) it stays a stale term. It logs at ERROR once per stale term.
func (b *Backend) checkTerm(m mark, election string, rev int64, h *elector.Holder) error {
	if h == nil {
		return nil
	}
	r := &b.revs
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := r.terms[election]
	switch {
	case m.epoch != r.epoch:
		return nil // sent before the last rewind was detected: of either history
	case h.Token >= seen.token:
		r.terms[election] = termsSeen{token: h.Token, at: rev}
		return nil
	case rev < seen.at:
		return nil // an answer overtaken by a newer one
	}
	err := fmt.Errorf("election %q is held in term %d after term %d had been seen: %w", election, h.Token, seen.token, elector.ErrStoreRewound)
	if seen.reported == h.Token {
		return err
	}
	seen.reported = h.Token
	r.terms[election] = seen
	r.rewoundLocked()
	b.cfg.Logger.Error("etcd holds an election in a term older than one seen before: it was restored from a snapshot, "+
		"whose terms came back; that term is void, so this instance gives up its lease and campaigns again "+
		"(the stale key goes with its holder's lease)",
		zap.String("election", election), zap.Int64("token", h.Token), zap.Int64("seen_token", seen.token))
	return err
}

// termChecked returns o, or an error if checkTerm finds its holder's term stale.
func (b *Backend) termChecked(m mark, election string, o elector.Observation) (elector.Observation, error) {
	if err := b.checkTerm(m, election, o.Revision, o.Holder); err != nil {
		return elector.Observation{}, err
	}
	return o, nil
}

// confirmTimeout bounds the read that confirms a suspected rewind.
const confirmTimeout = 5 * time.Second

// loose checks the header of an answer, to a request sent at m, that a member may give
// from behind the cluster (a lease keepalive or time-to-live, a watch response). An older
// revision there is confirmed with a linearizable read before it counts as a rewind.
func (b *Backend) loose(ctx context.Context, cli *clientv3.Client, m mark, h *pb.ResponseHeader) error {
	if h == nil || h.Revision >= m.highest {
		return b.checked(m, h)
	}
	// Any key will do: the header is the point. The prefix is one that etcd users set up
	// for this plugin may read.
	m = b.mark()
	ctx, cancel := context.WithTimeout(ctx, confirmTimeout) // a watch's ctx has no deadline
	defer cancel()
	resp, err := cli.Get(leaderCtx(ctx), b.cfg.Prefix, clientv3.WithCountOnly())
	if err != nil {
		return b.describe(err)
	}
	return b.checked(m, resp.Header)
}

// watchStart returns what a watch from after afterRev needs: a channel closed at the
// next detected rewind, and an error if afterRev itself is of a history already left
// behind. A revision above every one this backend has seen may also come from another
// client that is simply ahead of it; a linearizable read tells the two apart.
func (b *Backend) watchStart(ctx context.Context, cli *clientv3.Client, afterRev int64) (<-chan struct{}, error) {
	rewound, ahead := b.watchRewound(afterRev)
	if ahead {
		m := b.mark()
		rctx, cancel := context.WithTimeout(ctx, confirmTimeout)
		resp, err := cli.Get(leaderCtx(rctx), b.cfg.Prefix, clientv3.WithCountOnly())
		cancel()
		if err != nil {
			return nil, b.describe(err)
		}
		if err := b.checked(m, resp.Header); err != nil {
			return nil, err
		}
		if resp.Header.Revision < afterRev {
			return nil, rewoundError(afterRev, resp.Header.Revision)
		}
		rewound, _ = b.watchRewound(afterRev)
	}
	return rewound, nil
}

// watchRewound returns the channel closed at the next detected rewind, and whether afterRev
// is above every revision this backend has seen.
func (b *Backend) watchRewound(afterRev int64) (<-chan struct{}, bool) {
	b.revs.mu.Lock()
	defer b.revs.mu.Unlock()
	return b.revs.rewound, afterRev > b.revs.highest
}

// takeRenewOwed reports, once, a rewind that Renew has yet to report.
func (b *Backend) takeRenewOwed() bool {
	b.revs.mu.Lock()
	defer b.revs.mu.Unlock()
	owed := b.revs.renewOwed
	b.revs.renewOwed = false
	return owed
}

// leaseFresh records that a lease was granted in the store's present history: no rewind
// detected before is owed to its renewals.
func (b *Backend) leaseFresh() {
	b.revs.mu.Lock()
	defer b.revs.mu.Unlock()
	b.revs.renewOwed = false
}
