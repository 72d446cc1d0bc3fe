package etcdbackend

import (
	"context"
	"encoding/json"
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// An election's history of terms is one key, <key>/history, holding a JSON array of the
// entries (base64, as encoding/json writes []byte). It is bound to no lease: it outlives
// every instance. Appends read it and write it back in a transaction guarded by its mod
// revision, so that of two concurrent appends the loser reads again rather than overwrite.

func (b *Backend) historyKey(election string) string { return b.Key(election) + "/history" }

// AppendHistory implements elector.Backend.
func (b *Backend) AppendHistory(ctx context.Context, election string, entry []byte, keep int) error {
	cli, err := b.client(ctx)
	if err != nil {
		return err
	}
	key := b.historyKey(election)
	for {
		at := b.mark()
		get, err := cli.Get(leaderCtx(ctx), key)
		if err != nil {
			return b.describe(err)
		}
		if err := b.checked(at, get.Header); err != nil {
			return err
		}
		var list [][]byte
		var modRev int64
		if len(get.Kvs) > 0 {
			modRev = get.Kvs[0].ModRevision
			if err := json.Unmarshal(get.Kvs[0].Value, &list); err != nil {
				// Not written by this plugin: start the history anew rather than fail
				// every append for good.
				list = nil
			}
		}
		list = append(list, entry)
		list = list[max(0, len(list)-keep):]
		value, _ := json.Marshal(list) // byte slices always marshal
		at = b.mark()
		txn, err := cli.Txn(leaderCtx(ctx)).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", modRev)).
			Then(clientv3.OpPut(key, string(value))).
			Commit()
		if err != nil {
			return b.describe(err)
		}
		if err := b.checked(at, txn.Header); err != nil {
			return err
		}
		if txn.Succeeded {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("appending to the history of election %q: %w", election, err)
		}
	}
}

// History implements elector.Backend.
func (b *Backend) History(ctx context.Context, election string) ([][]byte, error) {
	cli, err := b.client(ctx)
	if err != nil {
		return nil, err
	}
	at := b.mark()
	get, err := cli.Get(leaderCtx(ctx), b.historyKey(election))
	if err != nil {
		return nil, b.describe(err)
	}
	if err := b.checked(at, get.Header); err != nil {
		return nil, err
	}
	return decodeHistory(election, get.Kvs)
}

// decodeHistory is the history of election that a read of its history key found in kvs.
func decodeHistory(election string, kvs []*mvccpb.KeyValue) ([][]byte, error) {
	list := [][]byte{}
	if len(kvs) > 0 {
		if err := json.Unmarshal(kvs[0].Value, &list); err != nil {
			return nil, fmt.Errorf("the history of election %q is not what this plugin writes: %v", election, err)
		}
	}
	return list, nil
}
