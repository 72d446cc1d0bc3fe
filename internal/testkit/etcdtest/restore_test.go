package etcdtest

import (
	"context"
	"errors"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestRestore checks that Restore gives clients what an operator's restore gives them: the
// snapshot's keys, at the snapshot's revision, or above every revision before with a bump.
func TestRestore(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	const bump = 1_000_000
	tests := []struct {
		name string
		opts RestoreOptions
		// check gets the revision at the snapshot and the highest one before the restore.
		check func(t *testing.T, cli *clientv3.Client, snapRev, lastRev int64)
	}{
		{
			name: "without_bump_the_revision_goes_back_to_the_snapshot",
			check: func(t *testing.T, cli *clientv3.Client, snapRev, lastRev int64) {
				if rev := revision(t, cli); rev != snapRev {
					t.Errorf("revision after restore = %d, want the snapshot's %d (it was %d)", rev, snapRev, lastRev)
				}
			},
		},
		{
			name: "with_bump_the_revision_stays_above_and_old_watches_are_compacted",
			opts: RestoreOptions{RevisionBump: bump, MarkCompacted: true},
			check: func(t *testing.T, cli *clientv3.Client, snapRev, lastRev int64) {
				if rev := revision(t, cli); rev <= lastRev || rev < snapRev+bump {
					t.Errorf("revision after restore = %d, want above %d and at least %d", rev, lastRev, snapRev+bump)
				}
				ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
				defer cancel()
				resp := <-cli.Watch(ctx, "k", clientv3.WithRev(lastRev+1))
				if !errors.Is(resp.Err(), rpctypes.ErrCompacted) {
					t.Errorf("watch from revision %d: %v, want compacted", lastRev+1, resp.Err())
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Start(t, 1)
			cli := c.Client(t)
			put(t, cli, "k", "before")
			snapRev := revision(t, cli)
			snap := c.Snapshot(t)
			for range 5 {
				put(t, cli, "k", "after")
			}
			lastRev := revision(t, cli)

			c.Restore(t, snap, tt.opts)
			cli = c.Client(t)
			wantGet(t, cli, "k", "before")
			tt.check(t, cli, snapRev, lastRev)
		})
	}
}

func revision(t *testing.T, cli *clientv3.Client) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	resp, err := cli.Get(ctx, "etcdtest/revision")
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}
