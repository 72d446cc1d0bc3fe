package etcdbackend

import (
	"context"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ackLeases hands out the leases that acknowledgements are bound to (see acknowledgement).
// One lease, granted for twice the holder's TTL, serves every acknowledgement written within
// one TTL of its grant: each still lives at least as long as the holder's lease was granted
// for, as one lease of its own would, and an instance that lets go of many keys at once (a
// shutdown with a shard set) waits for one grant, shared by all its releases, instead of
// one grant, and one more round trip, before each.
type ackLeases struct {
	mu    sync.Mutex
	bySec map[int64]*ackLease // by the TTL to outlive, in whole seconds
}

// ackLease is one grant; id, err and usableUntil are set before ready is closed.
type ackLease struct {
	ready       chan struct{}
	id          clientv3.LeaseID
	err         error
	usableUntil time.Time // by this host's monotonic clock: the grant's sending plus the TTL
}

// ackLease returns a lease under which an acknowledgement lives at least secs seconds,
// granting one if none that is still young enough was granted here (or is being granted:
// its answer is waited for, within ctx).
func (b *Backend) ackLease(ctx context.Context, cli *clientv3.Client, secs int64) (clientv3.LeaseID, error) {
	for {
		b.acks.mu.Lock()
		if b.acks.bySec == nil {
			b.acks.bySec = map[int64]*ackLease{}
		}
		cur := b.acks.bySec[secs]
		if cur != nil {
			select {
			case <-cur.ready:
				if cur.err != nil || !time.Now().Before(cur.usableUntil) {
					cur = nil // failed, or too old to outlive secs: grant anew
				}
			default: // being granted
			}
		}
		if cur == nil {
			l := &ackLease{ready: make(chan struct{})}
			b.acks.bySec[secs] = l
			b.acks.mu.Unlock()
			b.grantAckLease(ctx, cli, secs, l)
			return l.id, l.err
		}
		b.acks.mu.Unlock()
		select {
		case <-cur.ready:
			if cur.err == nil {
				return cur.id, nil
			}
			// That grant failed (its caller's context may have ended): try one here.
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// grantAckLease grants l for twice secs and closes l.ready.
func (b *Backend) grantAckLease(ctx context.Context, cli *clientv3.Client, secs int64, l *ackLease) {
	defer close(l.ready)
	sent := time.Now()
	at := b.mark()
	resp, err := cli.Grant(leaderCtx(ctx), 2*secs)
	if err != nil {
		l.err = b.describe(err)
		return
	}
	if l.err = b.checked(at, resp.ResponseHeader); l.err == nil {
		l.id, l.usableUntil = resp.ID, sent.Add(time.Duration(secs)*time.Second)
	}
}

// forgetAckLease drops lease id, which the store no longer knows (an operator revoked it, or
// the store was restored from a backup that predates it), so that the next acknowledgement
// is granted a new one.
func (b *Backend) forgetAckLease(id clientv3.LeaseID) {
	b.acks.mu.Lock()
	defer b.acks.mu.Unlock()
	for secs, l := range b.acks.bySec {
		select {
		case <-l.ready:
			if l.id == id {
				delete(b.acks.bySec, secs)
			}
		default:
		}
	}
}
