package etcdbackend

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/caddyleader/caddy-leader/elector"
)

// Beside each election key live the keys through which any instance can ask the leader
// to resign or hand over: <key>/intent, and <key>/candidates/<id> for each live candidate;
// and <key>/released/<token>, by which the holder of a term acknowledges its end. They are
// never mistaken for an election: election names cannot contain a slash.

func (b *Backend) intentKey(election string) string { return b.Key(election) + "/intent" }

func (b *Backend) candidatesPrefix(election string) string { return b.Key(election) + "/candidates/" }

// Announce implements elector.Backend.
func (b *Backend) Announce(ctx context.Context, election, id string, lease elector.LeaseID) error {
	cli, err := b.client(ctx)
	if err != nil {
		return err
	}
	_, err = cli.Put(leaderCtx(ctx), b.candidatesPrefix(election)+id, id, clientv3.WithLease(clientv3.LeaseID(lease)))
	return b.describe(mapLeaseErr(err))
}

// Candidates implements elector.Backend.
func (b *Backend) Candidates(ctx context.Context, election string) ([]string, error) {
	cli, err := b.client(ctx)
	if err != nil {
		return nil, err
	}
	prefix := b.candidatesPrefix(election)
	resp, err := cli.Get(leaderCtx(ctx), prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, b.describe(err)
	}
	ids := make([]string, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		ids = append(ids, strings.TrimPrefix(string(kv.Key), prefix))
	}
	return ids, nil
}

// SetIntent implements elector.Backend: the intent is bound to a lease of its own, so
// that it expires after ttl even if nobody acts on it.
func (b *Backend) SetIntent(ctx context.Context, election string, value []byte, ttl time.Duration) error {
	cli, err := b.client(ctx)
	if err != nil {
		return err
	}
	lease, err := cli.Grant(leaderCtx(ctx), int64(math.Ceil(ttl.Seconds())))
	if err != nil {
		return b.describe(err)
	}
	_, err = cli.Put(leaderCtx(ctx), b.intentKey(election), string(value), clientv3.WithLease(lease.ID))
	return b.describe(err)
}

// ClearIntent implements elector.Backend.
func (b *Backend) ClearIntent(ctx context.Context, election string) error {
	cli, err := b.client(ctx)
	if err != nil {
		return err
	}
	_, err = cli.Delete(leaderCtx(ctx), b.intentKey(election))
	return b.describe(err)
}

// WatchIntent implements elector.Backend.
func (b *Backend) WatchIntent(ctx context.Context, election string) <-chan elector.IntentChange {
	out := make(chan elector.IntentChange, 1)
	go func() {
		defer close(out)
		broken := func(err error) elector.IntentChange { return elector.IntentChange{Err: err} }
		cli, err := b.client(ctx)
		if err != nil {
			watchKeyFailed(ctx, out, broken(err))
			return
		}
		key := b.intentKey(election)
		resp, err := cli.Get(leaderCtx(ctx), key)
		if err != nil {
			watchKeyFailed(ctx, out, broken(b.describe(err)))
			return
		}
		current := elector.IntentChange{}
		if len(resp.Kvs) > 0 {
			current.Value = resp.Kvs[0].Value
		}
		select {
		case out <- current:
		case <-ctx.Done():
			return
		}
		watchKey(ctx, b, key, resp.Header.Revision, out,
			func(ev *clientv3.Event) elector.IntentChange {
				if ev.Type == clientv3.EventTypePut {
					return elector.IntentChange{Value: ev.Kv.Value}
				}
				return elector.IntentChange{}
			}, broken)
	}()
	return out
}

// watchKeyFailed reports a watch that could not start.
func watchKeyFailed[T any](ctx context.Context, out chan<- T, v T) {
	select {
	case out <- v:
	case <-ctx.Done():
	}
}

func (b *Backend) releasedKey(election string, token int64) string {
	return b.Key(election) + "/released/" + strconv.FormatInt(token, 10)
}

// acknowledgement is the put that records the end of term token. It is bound to the
// holder's lease: once that lease is gone the acknowledgement is not needed any more.
func (b *Backend) acknowledgement(election string, token int64, lease elector.LeaseID) clientv3.Op {
	return clientv3.OpPut(b.releasedKey(election, token), "", clientv3.WithLease(clientv3.LeaseID(lease)))
}

// Acknowledge implements elector.Backend.
func (b *Backend) Acknowledge(ctx context.Context, election string, token int64, lease elector.LeaseID) error {
	cli, err := b.client(ctx)
	if err != nil {
		return err
	}
	_, err = cli.Do(leaderCtx(ctx), b.acknowledgement(election, token, lease))
	if errors.Is(mapLeaseErr(err), elector.ErrLeaseNotFound) {
		return nil // the lease is gone: Released says so without the acknowledgement
	}
	return b.describe(err)
}

// Released implements elector.Backend.
func (b *Backend) Released(ctx context.Context, election string, token int64, lease elector.LeaseID) (bool, error) {
	cli, err := b.client(ctx)
	if err != nil {
		return false, err
	}
	resp, err := cli.Get(leaderCtx(ctx), b.releasedKey(election, token), clientv3.WithCountOnly())
	if err != nil {
		return false, b.describe(err)
	}
	if resp.Count > 0 {
		return true, nil
	}
	ttl, err := cli.TimeToLive(leaderCtx(ctx), clientv3.LeaseID(lease))
	if err != nil {
		if errors.Is(mapLeaseErr(err), elector.ErrLeaseNotFound) {
			return true, nil
		}
		return false, b.describe(err)
	}
	// etcd reports a lease's remaining TTL in whole seconds, rounded down: 0 means less than
	// a second is left, not that the lease is gone (that is -1), and its holder may still act.
	return ttl.TTL < 0, nil
}
