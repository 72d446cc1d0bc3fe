package etcdtest

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"go.etcd.io/etcd/client/v3/snapshot"
	etcdutl "go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Snapshot saves the cluster's keyspace to a file under t.TempDir(), as `etcdctl snapshot
// save` does (through the Maintenance API, from one running member), and returns its path.
func (c *Cluster) Snapshot(t testing.TB) string {
	t.Helper()
	eps := c.runningEndpoints(t, "snapshot")
	path := filepath.Join(t.TempDir(), "snapshot.db")
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	if _, err := snapshot.SaveWithVersion(ctx, zap.NewNop(), c.clientConfig(eps[:1]), path); err != nil {
		t.Fatalf("etcdtest: snapshot: %v", err)
	}
	return path
}

// RestoreOptions are the flags of `etcdutl snapshot restore` that decide what clients see.
type RestoreOptions struct {
	// RevisionBump is --bump-revision: the restored store's revision is raised by this
	// much, so that it stays above every revision handed out before. Zero restores the
	// snapshot's own revision, which clients have seen go past already.
	RevisionBump uint64
	// MarkCompacted is --mark-compacted: watches from a revision before the bumped one
	// fail as compacted instead of waiting. It needs RevisionBump.
	MarkCompacted bool
}

// Restore replaces the whole cluster with the state in snapshot, as an operator does after
// losing it: every member is stopped, its data dir replaced by one restored from the file
// with etcdutl's own restore code, and every member started again with the same name and
// ports. It returns once the cluster answers linearizable reads. Clients see their
// connections cut, as when members crash, and then a store at the snapshot's revision (plus
// RevisionBump).
func (c *Cluster) Restore(t testing.TB, snapshotPath string, o RestoreOptions) {
	t.Helper()
	c.stopMembers()
	for _, m := range c.members {
		// etcdutl refuses to restore into an existing data dir, as operators should
		// not either; this one is gone with the cluster it belonged to.
		if err := os.RemoveAll(m.dir); err != nil {
			t.Fatalf("etcdtest: restore: %v", err)
		}
		err := etcdutl.NewV3(zap.NewNop()).Restore(etcdutl.RestoreConfig{
			SnapshotPath:        snapshotPath,
			Name:                m.name,
			OutputDataDir:       m.dir,
			PeerURLs:            []string{m.peerURL.String()},
			InitialCluster:      c.initialCluster,
			InitialClusterToken: "etcdtest",
			RevisionBump:        o.RevisionBump,
			MarkCompacted:       o.MarkCompacted,
		})
		if err != nil {
			t.Fatalf("etcdtest: restore member %s: %v", m.name, err)
		}
	}
	for i, m := range c.members {
		m.op.Lock()
		in, err := m.start(c.initialCluster, embed.ClusterStateFlagNew, nil)
		if err == nil {
			c.mu.Lock()
			m.run = in
			c.mu.Unlock()
		}
		m.op.Unlock()
		if err != nil {
			t.Fatalf("etcdtest: start restored member %d: %v", i, err)
		}
	}
	if err := c.waitReady(c.runningIndexes()); err != nil {
		t.Fatalf("etcdtest: restored cluster: %v", err)
	}
}
