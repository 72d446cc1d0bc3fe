package etcdbackend

import (
	"context"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"

	"github.com/caddyleader/caddy-leader/elector"
)

// requestsInFlight is how many requests of one batched call are on their way at once: a
// start's thousands of claims and reads go in a few dozen requests, which need not wait
// for one another (etcd commits the writes that arrive together in one write of its log),
// nor all land on etcd at the same moment ahead of the fleet's renewals. One after the
// other, a start's claims of ~800 shards took longer than a request's timeout on this
// machine, and the instance lost their answers.
const requestsInFlight = 4

// ObserveAll implements elector.ReadBatcher: Observe's read of each key, batchElections
// to a request (a transaction of reads, answered at one revision).
func (b *Backend) ObserveAll(ctx context.Context, elections []string) ([]elector.Observation, error) {
	return readAll(ctx, b, elections, b.Key, func(at mark, election string, rev int64, kvs []*mvccpb.KeyValue) (elector.Observation, error) {
		return b.termChecked(at, election, observation(rev, kvs))
	})
}

// HistoryAll implements elector.ReadBatcher: History's read of each history key,
// batchElections to a request.
func (b *Backend) HistoryAll(ctx context.Context, elections []string) ([][][]byte, error) {
	return readAll(ctx, b, elections, b.historyKey, func(_ mark, election string, _ int64, kvs []*mvccpb.KeyValue) ([][]byte, error) {
		return decodeHistory(election, kvs)
	})
}

// readAll gets the key keyOf names for each of elections, in transactions of
// batchElections reads, readsInFlight at once, and turns what each read found (at the
// transaction's revision, in a request sent at at) into its answer.
func readAll[Out any](ctx context.Context, b *Backend, elections []string, keyOf func(string) string, answer func(at mark, election string, rev int64, kvs []*mvccpb.KeyValue) (Out, error)) ([]Out, error) {
	cli, err := b.client(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]Out, len(elections))
	err = inChunks(len(elections), func(start, end int) error {
		chunk := elections[start:end]
		ops := make([]clientv3.Op, len(chunk))
		for i, election := range chunk {
			ops[i] = clientv3.OpGet(keyOf(election))
		}
		resp, at, err := b.commit(ctx, cli, nil, ops, nil)
		if err != nil {
			return err
		}
		for i, election := range chunk {
			if out[start+i], err = answer(at, election, resp.Header.Revision, resp.Responses[i].GetResponseRange().GetKvs()); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// inChunks calls request for each chunk [start, end) of n elections, batchElections to a
// chunk, requestsInFlight at once, and returns the first error.
func inChunks(n int, request func(start, end int) error) error {
	var g errgroup.Group
	g.SetLimit(requestsInFlight)
	for start := 0; start < n; start += batchElections {
		g.Go(func() error { return request(start, min(start+batchElections, n)) })
	}
	return g.Wait()
}

// Interface guard.
var _ elector.ReadBatcher = (*Backend)(nil)
