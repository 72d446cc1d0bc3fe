package etcdbackend

import (
	"context"
	"fmt"
	"sync"

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
// Not every header can be compared, though. A linearizable read, and anything that goes
// through raft (writes, transactions, lease grants and revokes), is answered by a member
// that has applied everything committed before the request began, so its revision is at
// least every revision seen earlier. A lease keepalive or time-to-live, and a watch, are
// answered from whatever the member they reach has applied: a follower a few entries
// behind reports an older revision in a perfectly healthy cluster. Their headers only
// raise a suspicion, which a linearizable read then confirms or dismisses.

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
}

func newRevisions() revisions { return revisions{rewound: make(chan struct{})} }

// rewoundError says which revisions disagreed.
func rewoundError(seen, now int64) error {
	return fmt.Errorf("etcd answered at revision %d after revision %d had been seen: %w", now, seen, elector.ErrStoreRewound)
}

// errRewoundElsewhere breaks a watch when another request detected a rewind.
var errRewoundElsewhere = fmt.Errorf("etcd watch abandoned: %w", elector.ErrStoreRewound)

// checked records the revision of an answer that is linearizable (see above) and
// reports a rewind if it is older than one seen before. On a rewind it logs at ERROR,
// once, and takes the new revision as the highest, so that later answers are checked
// against the new history rather than reported again and again.
func (b *Backend) checked(h *pb.ResponseHeader) error {
	if h == nil {
		return nil
	}
	r := &b.revs
	r.mu.Lock()
	defer r.mu.Unlock()
	if h.Revision >= r.highest {
		r.highest = h.Revision
		return nil
	}
	seen := r.highest
	r.highest = h.Revision
	close(r.rewound)
	r.rewound = make(chan struct{})
	r.renewOwed = true
	b.cfg.Logger.Error("etcd's revision went backwards: it was restored from a snapshot without --bump-revision, "+
		"or replaced by another cluster; leases, terms and watches learned before are void, so this instance gives up "+
		"its lease, stops admitting and campaigns again. Restore with `etcdutl snapshot restore --bump-revision "+
		"1000000000 --mark-compacted` so fencing tokens keep rising (see docs/operator-actions.md)",
		zap.Int64("seen_revision", seen), zap.Int64("revision", h.Revision),
		zap.String("cluster_id", fmt.Sprintf("%x", h.ClusterId)), zap.String("member_id", fmt.Sprintf("%x", h.MemberId)))
	return rewoundError(seen, h.Revision)
}

// loose checks the header of an answer that a member may give from behind the cluster
// (a lease keepalive or time-to-live, a watch response). An older revision there is
// confirmed with a linearizable read before it counts as a rewind.
func (b *Backend) loose(ctx context.Context, cli *clientv3.Client, h *pb.ResponseHeader) error {
	if h == nil || h.Revision >= b.highest() {
		return b.checked(h)
	}
	// Any key will do: the header is the point. The prefix is one that etcd users set up
	// for this plugin may read.
	resp, err := cli.Get(leaderCtx(ctx), b.cfg.Prefix, clientv3.WithCountOnly())
	if err != nil {
		return b.describe(err)
	}
	return b.checked(resp.Header)
}

func (b *Backend) highest() int64 {
	b.revs.mu.Lock()
	defer b.revs.mu.Unlock()
	return b.revs.highest
}

// watchStart returns what a watch from after afterRev needs: a channel closed at the
// next detected rewind, and an error if afterRev itself is of a history already left
// behind (it is above every revision seen since the rewind).
func (b *Backend) watchStart(afterRev int64) (<-chan struct{}, error) {
	b.revs.mu.Lock()
	defer b.revs.mu.Unlock()
	if afterRev > b.revs.highest {
		return nil, rewoundError(afterRev, b.revs.highest)
	}
	return b.revs.rewound, nil
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
