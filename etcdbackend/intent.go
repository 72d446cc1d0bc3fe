package etcdbackend

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/caddyleader/caddy-leader/elector"
)

// Beside each election key live the keys through which any instance can ask the leader
// to resign or hand over: <key>/intent, and <key>/candidates/<id>/<lease> for each live
// candidate (keyed by lease too, so that two processes given one instance id by mistake
// never overwrite, and then expire, each other's entry); and <key>/released/<token>, by
// which the holder of a term acknowledges its end. <key>/history (history.go) and
// <key>/jobs/<job> (jobs.go) live there too. They are never mistaken for an election:
// election names cannot contain a slash.

func (b *Backend) intentKey(election string) string { return b.Key(election) + "/intent" }

func (b *Backend) candidatesPrefix(election string) string { return b.Key(election) + "/candidates/" }

// Announce implements elector.Backend.
func (b *Backend) Announce(ctx context.Context, election, id string, value []byte, lease elector.LeaseID) error {
	cli, err := b.client(ctx)
	if err != nil {
		return err
	}
	at := b.mark()
	key := b.candidatesPrefix(election) + id + "/" + leaseHex(lease)
	resp, err := cli.Put(leaderCtx(ctx), key, string(value), clientv3.WithLease(clientv3.LeaseID(lease)))
	if err != nil {
		return b.describe(mapLeaseErr(err))
	}
	return b.checked(at, resp.Header)
}

// Candidates implements elector.Backend.
func (b *Backend) Candidates(ctx context.Context, election string) ([]elector.CandidateEntry, error) {
	cli, err := b.client(ctx)
	if err != nil {
		return nil, err
	}
	at := b.mark()
	prefix := b.candidatesPrefix(election)
	resp, err := cli.Get(leaderCtx(ctx), prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, b.describe(err)
	}
	if err := b.checked(at, resp.Header); err != nil {
		return nil, err
	}
	return candidateList(prefix, resp.Kvs), nil
}

// candidateList turns the keys under prefix into the registry's entries. The id is read
// from the key; when one id is announced under two leases, the entry written last wins.
func candidateList(prefix string, kvs []*mvccpb.KeyValue) []elector.CandidateEntry {
	latest := make(map[string]*mvccpb.KeyValue, len(kvs))
	for _, kv := range kvs {
		rest := strings.TrimPrefix(string(kv.Key), prefix)
		id := rest[:max(0, strings.LastIndexByte(rest, '/'))]
		if seen, ok := latest[id]; id != "" && (!ok || kv.ModRevision > seen.ModRevision) {
			latest[id] = kv
		}
	}
	list := make([]elector.CandidateEntry, 0, len(latest))
	for id, kv := range latest {
		list = append(list, elector.CandidateEntry{ID: id, Value: kv.Value})
	}
	slices.SortFunc(list, func(x, y elector.CandidateEntry) int { return strings.Compare(x.ID, y.ID) })
	return list
}

// WatchCandidates implements elector.Backend: a read of the registry's keys, then a watch
// of them from the read's revision on. The events of one revision (one transaction) are
// one change.
func (b *Backend) WatchCandidates(ctx context.Context, election string) <-chan elector.CandidatesChange {
	out := make(chan elector.CandidatesChange, 1)
	prefix := b.candidatesPrefix(election)
	keys := map[string]*mvccpb.KeyValue{}
	current := func() elector.CandidatesChange {
		return elector.CandidatesChange{Candidates: candidateList(prefix, slices.Collect(maps.Values(keys)))}
	}
	go func() {
		defer close(out)
		readThenWatch(ctx, b, prefix, out,
			func(kvs []*mvccpb.KeyValue) elector.CandidatesChange {
				for _, kv := range kvs {
					keys[string(kv.Key)] = kv
				}
				return current()
			},
			func(_ mark, evs []*clientv3.Event) ([]elector.CandidatesChange, error) {
				var changes []elector.CandidatesChange
				for i, ev := range evs {
					if ev.Type == clientv3.EventTypePut {
						keys[string(ev.Kv.Key)] = ev.Kv
					} else {
						delete(keys, string(ev.Kv.Key))
					}
					if i == len(evs)-1 || evs[i+1].Kv.ModRevision != ev.Kv.ModRevision {
						changes = append(changes, current())
					}
				}
				return changes, nil
			},
			func(err error) elector.CandidatesChange { return elector.CandidatesChange{Err: err} },
			clientv3.WithPrefix())
	}()
	return out
}

// SetIntent implements elector.Backend: the intent is bound to a lease of its own, so
// that it expires after ttl even if nobody acts on it.
func (b *Backend) SetIntent(ctx context.Context, election string, value []byte, ttl time.Duration) error {
	_, err := b.putIntent(ctx, election, value, ttl, false)
	return err
}

// CreateIntent implements elector.IntentCreator: the put is conditional on the key not
// existing (an intent whose lease ran out is gone with it).
func (b *Backend) CreateIntent(ctx context.Context, election string, value []byte, ttl time.Duration) (bool, error) {
	return b.putIntent(ctx, election, value, ttl, true)
}

// putIntent stores value as election's intent under a lease of its own for ttl; if
// onlyIfNone is set, only where no intent is stored, and reports whether it stored it.
func (b *Backend) putIntent(ctx context.Context, election string, value []byte, ttl time.Duration, onlyIfNone bool) (bool, error) {
	cli, err := b.client(ctx)
	if err != nil {
		return false, err
	}
	at := b.mark()
	lease, err := cli.Grant(leaderCtx(ctx), int64(math.Ceil(ttl.Seconds())))
	if err != nil {
		return false, b.describe(err)
	}
	if err := b.checked(at, lease.ResponseHeader); err != nil {
		return false, err
	}
	key := b.intentKey(election)
	put := clientv3.OpPut(key, string(value), clientv3.WithLease(lease.ID))
	txn := cli.Txn(leaderCtx(ctx))
	if onlyIfNone {
		txn = txn.If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0))
	}
	resp, err := txn.Then(put).Commit()
	if err != nil {
		return false, b.describe(err)
	}
	if err := b.checked(at, resp.Header); err != nil {
		return false, err
	}
	if !resp.Succeeded {
		// Nothing is bound to the lease: revoke it rather than leave it to run out.
		_, _ = cli.Revoke(leaderCtx(ctx), lease.ID)
	}
	return resp.Succeeded, nil
}

// ClearIntent implements elector.Backend. It revokes the intent's own lease, which deletes
// the intent with it, rather than leaving the lease to run out its ttl: intents are set
// every handover, and their leases would otherwise pile up in etcd. A newer intent put
// after the read has a lease of its own, which the revoke leaves alone.
func (b *Backend) ClearIntent(ctx context.Context, election string, value []byte) error {
	cli, err := b.client(ctx)
	if err != nil {
		return err
	}
	at := b.mark()
	key := b.intentKey(election)
	resp, err := cli.Get(leaderCtx(ctx), key)
	if err != nil {
		return b.describe(err)
	}
	if err := b.checked(at, resp.Header); err != nil {
		return err
	}
	if len(resp.Kvs) == 0 || value != nil && !bytes.Equal(resp.Kvs[0].Value, value) {
		return nil // gone already, or another intent now
	}
	if resp.Kvs[0].Lease != 0 {
		// A newer intent set meanwhile has a lease of its own and stays.
		return b.Revoke(ctx, elector.LeaseID(resp.Kvs[0].Lease))
	}
	// Without a lease (written by hand): delete it only if it is still the one read.
	del, err := cli.Txn(leaderCtx(ctx)).
		If(clientv3.Compare(clientv3.ModRevision(key), "=", resp.Kvs[0].ModRevision)).
		Then(clientv3.OpDelete(key)).Commit()
	if err != nil {
		return b.describe(err)
	}
	return b.checked(at, del.Header)
}

// WatchIntent implements elector.Backend.
func (b *Backend) WatchIntent(ctx context.Context, election string) <-chan elector.IntentChange {
	out := make(chan elector.IntentChange, 1)
	go func() {
		defer close(out)
		readThenWatch(ctx, b, b.intentKey(election), out,
			func(kvs []*mvccpb.KeyValue) elector.IntentChange {
				if len(kvs) > 0 {
					return elector.IntentChange{Value: kvs[0].Value}
				}
				return elector.IntentChange{}
			},
			perEvent(func(_ mark, ev *clientv3.Event) (elector.IntentChange, error) {
				if ev.Type == clientv3.EventTypePut {
					return elector.IntentChange{Value: ev.Kv.Value}, nil
				}
				return elector.IntentChange{}, nil
			}),
			func(err error) elector.IntentChange { return elector.IntentChange{Err: err} })
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
	return b.releasedPrefix(election) + strconv.FormatInt(token, 10)
}

// releasedPrefix begins the key of every acknowledgement of the election.
func (b *Backend) releasedPrefix(election string) string { return b.Key(election) + "/released/" }

// acknowledgement makes the puts that record the ends of terms of a holder, each's value
// why (empty in the acknowledgements of older releases, which gave no reason), and returns
// the lease they are put under. It is bound to a lease of its own, under which it lives at least as long as the
// holder's lease was granted for (see ackLeases): the holder's lease may be revoked the
// moment after (a shutting-down instance revokes it as soon as it has let go, an operator
// may revoke it), and the successor must still find the acknowledgement. The successor
// deletes it when it reads it; otherwise it expires with its lease.
func (b *Backend) acknowledgement(ctx context.Context, cli *clientv3.Client, holder elector.LeaseID, why string) (ack func(election string, token int64) clientv3.Op, id clientv3.LeaseID, err error) {
	ttl := defaultAckTTL
	if granted, ok := b.granted.Load(holder); ok {
		ttl = granted.(time.Duration)
	}
	id, err = b.ackLease(ctx, cli, int64(math.Ceil(ttl.Seconds())))
	if err != nil {
		return nil, 0, err
	}
	return func(election string, token int64) clientv3.Op {
		return clientv3.OpPut(b.releasedKey(election, token), why, clientv3.WithLease(id))
	}, id, nil
}

// acknowledged sends the request that send makes of acknowledgements of terms' ends, which
// ack makes (see acknowledgement); if the store no longer knows the lease the
// acknowledgements were put under, it is sent once more under a new one.
func (b *Backend) acknowledged(ctx context.Context, cli *clientv3.Client, holder elector.LeaseID, why string,
	send func(ack func(election string, token int64) clientv3.Op) error) error {
	for retried := false; ; retried = true {
		ack, id, err := b.acknowledgement(ctx, cli, holder, why)
		if err != nil {
			return err
		}
		err = send(ack)
		if retried || !errors.Is(mapLeaseErr(err), elector.ErrLeaseNotFound) {
			return err
		}
		b.forgetAckLease(id)
	}
}

// defaultAckTTL is how long an acknowledgement lives when the holder's lease was granted by
// another process (a reload's predecessor): long enough for any successor to read it.
const defaultAckTTL = time.Minute

// Acknowledge implements elector.Backend.
func (b *Backend) Acknowledge(ctx context.Context, election string, token int64, lease elector.LeaseID, why string) error {
	cli, err := b.client(ctx)
	if err != nil {
		return err
	}
	return b.acknowledged(ctx, cli, lease, why, func(ack func(string, int64) clientv3.Op) error {
		at := b.mark()
		resp, err := cli.Do(leaderCtx(ctx), ack(election, token))
		if err != nil {
			return b.describe(err)
		}
		return b.checked(at, resp.Put().Header)
	})
}

// Released implements elector.Backend. It consumes the acknowledgement: only the successor
// asks, once, and the key would otherwise stay for as long as the old holder's lease lives,
// one more for each term it ends. (A successor whose answer is lost falls back to waiting
// out the old holder's TTL.)
func (b *Backend) Released(ctx context.Context, election string, token int64, lease elector.LeaseID) (bool, string, error) {
	cli, err := b.client(ctx)
	if err != nil {
		return false, "", err
	}
	at := b.mark()
	resp, err := cli.Delete(leaderCtx(ctx), b.releasedKey(election, token), clientv3.WithPrevKV())
	if err != nil {
		return false, "", b.describe(err)
	}
	if err := b.checked(at, resp.Header); err != nil {
		return false, "", err
	}
	if len(resp.PrevKvs) > 0 {
		return true, string(resp.PrevKvs[0].Value), nil
	}
	if resp.Deleted > 0 || lease == 0 {
		return resp.Deleted > 0, "", nil
	}
	ttl, err := cli.TimeToLive(leaderCtx(ctx), clientv3.LeaseID(lease))
	if err != nil {
		if errors.Is(mapLeaseErr(err), elector.ErrLeaseNotFound) {
			return true, "", nil
		}
		return false, "", b.describe(err)
	}
	if err := b.loose(ctx, cli, at, ttl.ResponseHeader); err != nil {
		return false, "", err
	}
	// Only a lease the store no longer knows (TTL -1) is gone. The remaining TTL is
	// truncated to whole seconds, so 0 means "less than a second left", not "expired": the
	// holder's deadline may still be ahead.
	return ttl.TTL == leaseGone, "", nil
}

// leaseGone is the TTL etcd's TimeToLive reports for a lease it does not know.
const leaseGone = -1

// WatchGroupIntents implements elector.IntentGrouper: one watch of the group's prefix,
// whose intent keys (<prefix><group>.<n>/intent) it reports. It starts from a read of the
// prefix's keys alone, then of the values of the intent keys among them at that read's
// revision, so that a set's start does not read every shard's keys and history.
func (b *Backend) WatchGroupIntents(ctx context.Context, group string) <-chan elector.GroupIntents {
	out := make(chan elector.GroupIntents, 1)
	prefix := b.Key(group + ".")
	broken := func(err error) elector.GroupIntents { return elector.GroupIntents{Err: err} }
	go func() {
		defer close(out)
		first, rev, err := b.groupIntents(ctx, prefix, group)
		if err != nil {
			watchKeyFailed(ctx, out, broken(err))
			return
		}
		select {
		case out <- first:
		case <-ctx.Done():
			return
		}
		watchKey(ctx, b, prefix, rev, out,
			func(_ mark, evs []*clientv3.Event) ([]elector.GroupIntents, error) {
				// The intents one transaction changed are one report.
				var changes []elector.GroupIntents
				var lastRev int64
				for _, ev := range evs {
					election, ok := intentOf(prefix, group, ev.Kv.Key)
					if ok {
						if len(changes) == 0 || lastRev != ev.Kv.ModRevision {
							changes = append(changes, elector.GroupIntents{Intents: map[string][]byte{}})
							lastRev = ev.Kv.ModRevision
						}
						var value []byte
						if ev.Type == clientv3.EventTypePut {
							value = ev.Kv.Value
						}
						changes[len(changes)-1].Intents[election] = value
					}
				}
				return changes, nil
			}, broken, clientv3.WithPrefix())
	}()
	return out
}

// groupIntents reads the intents of the group's elections (under prefix), and the
// revision it read them at.
func (b *Backend) groupIntents(ctx context.Context, prefix, group string) (elector.GroupIntents, int64, error) {
	cli, err := b.client(ctx)
	if err != nil {
		return elector.GroupIntents{}, 0, err
	}
	at := b.mark()
	keys, err := cli.Get(leaderCtx(ctx), prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return elector.GroupIntents{}, 0, b.describe(err)
	}
	if err := b.checked(at, keys.Header); err != nil {
		return elector.GroupIntents{}, 0, err
	}
	rev := keys.Header.Revision
	all := elector.GroupIntents{All: true, Intents: map[string][]byte{}}
	for _, kv := range keys.Kvs {
		election, ok := intentOf(prefix, group, kv.Key)
		if !ok {
			continue
		}
		resp, err := cli.Get(leaderCtx(ctx), string(kv.Key), clientv3.WithRev(rev))
		if err != nil {
			return elector.GroupIntents{}, 0, b.describe(err)
		}
		if len(resp.Kvs) > 0 {
			all.Intents[election] = resp.Kvs[0].Value
		}
	}
	return all, rev, nil
}

// intentOf reports whether key, under prefix, is the intent key of an election of group,
// and which.
func intentOf(prefix, group string, key []byte) (string, bool) {
	rest, ok := strings.CutPrefix(string(key), prefix)
	if !ok {
		return "", false
	}
	shard, ok := strings.CutSuffix(rest, "/intent")
	if !ok || shard == "" || strings.Contains(shard, "/") {
		return "", false
	}
	return group + "." + shard, true
}

var (
	_ elector.IntentGrouper = (*Backend)(nil)
	_ elector.IntentCreator = (*Backend)(nil)
)
