package etcdbackend

import (
	"context"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/caddyleader/caddy-leader/jobs"
)

// A job's record in an election is <key>/jobs/<job>, beside the election's other keys
// (intent.go). It is bound to no lease: it outlives every term and instance, and only an
// operator deletes it. A grouped election's stream (beacon.go) sees its writes and skips
// them, as it skips every key below an election's.

func (b *Backend) jobKey(election, job string) string { return b.Key(election) + "/jobs/" + job }

// JobRecord implements jobs.Store with a linearizable read.
func (b *Backend) JobRecord(ctx context.Context, election, job string) ([]byte, error) {
	cli, err := b.client(ctx)
	if err != nil {
		return nil, err
	}
	at := b.mark()
	resp, err := cli.Get(leaderCtx(ctx), b.jobKey(election, job))
	if err != nil {
		return nil, b.describe(err)
	}
	if err := b.checked(at, resp.Header); err != nil {
		return nil, err
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	return resp.Kvs[0].Value, nil
}

// PutJobRecord implements jobs.Store with one transaction: the record is put only if the
// election's key was created at revision token, that is, still holds that term (a key
// whose lease ran out is deleted with it).
func (b *Backend) PutJobRecord(ctx context.Context, election, job string, token int64, value []byte) (bool, error) {
	cli, err := b.client(ctx)
	if err != nil {
		return false, err
	}
	resp, _, err := b.commit(ctx, cli, []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(b.Key(election)), "=", token)},
		[]clientv3.Op{clientv3.OpPut(b.jobKey(election, job), string(value))}, nil)
	if err != nil {
		return false, err
	}
	return resp.Succeeded, nil
}

var _ jobs.Store = (*Backend)(nil)
