package etcdbackend

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
)

// TestRestoredEtcd restores the fleet's etcd from a snapshot, as an operator does after
// losing the cluster, while the fleet runs on. The snapshot is a term old: since it was
// taken, the leader resigned, a second term began, and a hundred more revisions were
// written. Restored as is, etcd's revision goes back and the snapshot's term is in it again;
// every node must notice, the second leader must stop admitting for that reason (not
// because its lease lapsed), and the fleet must agree on a new term that etcd itself holds.
// Restored with --bump-revision and --mark-compacted, the new term's token must be above
// every revision before the restore. At no moment may two nodes admit (the fleet's
// watchdog).
func TestRestoredEtcd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	// The ttl outlasts the restore's outage, so that the second leader still leads when
	// etcd comes back, and it is the rewind that ends its term.
	const ttl = 6 * time.Second
	tests := []struct {
		name    string
		members int
		opts    etcdtest.RestoreOptions
		// revisionBack is whether the restored store's revision is below the old one.
		revisionBack bool
	}{
		{
			name:         "without_bump_revision_the_rewind_is_noticed_and_a_new_term_follows",
			members:      1,
			revisionBack: true,
		},
		{
			// Renewals and watches reach followers too, which answer from behind the
			// leader: none of that may pass for a rewind (each node logs exactly one).
			name:         "three_member_etcd_without_bump_revision",
			members:      3,
			revisionBack: true,
		},
		{
			name:    "with_bump_revision_and_mark_compacted_tokens_keep_rising",
			members: 1,
			opts:    etcdtest.RestoreOptions{RevisionBump: 1_000_000_000, MarkCompacted: true},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cluster := etcdtest.Start(t, tt.members)
			cli := cluster.Client(t)
			core, logs := observer.New(zapcore.WarnLevel)
			f := startFleet(t, cluster, fleetOptions{size: 3, ttl: ttl, election: "restored", logs: core})
			first, firstToken := f.waitLeader(ttl + 5*time.Second)
			snap := cluster.Snapshot(t)

			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			for range 100 {
				if _, err := cli.Put(ctx, testPrefix+"filler", "x"); err != nil {
					t.Fatal(err)
				}
			}
			// A short hold-off: by the time etcd is restored, the first leader may campaign
			// again, and without the checks it would lead the snapshot's term once more.
			if err := first.election.Resign(ctx, time.Second); err != nil {
				t.Fatal(err)
			}
			second, secondToken := waitTerm(t, f, cli, ttl+5*time.Second, firstToken)
			lastRev := storeRevision(t, cli)

			// Times count from etcd going down: a 3-member etcd answers once two members
			// are back, before Restore has seen the third one ready.
			restoring := time.Now()
			cluster.Restore(t, snap, tt.opts)
			restored := time.Now()
			if rev := storeRevision(t, cli); (rev < lastRev) != tt.revisionBack {
				t.Fatalf("revision %d after the restore, %d before: the restore is not the one this case is about", rev, lastRev)
			}
			// The leader of before the restore must stop admitting under its term, which the
			// restored store does not have. With the revision bumped it may win the next term
			// itself (once the snapshot's stale term is gone, it may be first to campaign).
			waitFor(t, 3*ttl, "the leader of before the restore to stop admitting under its term", func() bool {
				return !second.leading() || second.election.Term().Token != secondToken
			})
			stopped := time.Now()
			leader, token := waitTerm(t, f, cli, 3*ttl, firstToken, secondToken)
			agreed := time.Now()

			errs := logs.FilterLevelExact(zapcore.ErrorLevel)
			back := errs.FilterMessageSnippet("revision went backwards")
			stale := errs.FilterMessageSnippet("older than one seen before")
			if tt.revisionBack {
				for _, n := range f.nodes {
					if c := back.FilterLoggerName(n.id).Len(); c != 1 {
						t.Errorf("%s logged the rewind %d times, want once", n.id, c)
					}
				}
			} else {
				if back.Len() != 0 {
					t.Errorf("the revision went on rising, yet %d nodes logged it going backwards", back.Len())
				}
				if token <= lastRev {
					t.Errorf("token %d after the restore is not above revision %d before it: fencing tokens went back", token, lastRev)
				}
			}
			var detected time.Time
			for _, e := range append(back.All(), stale.All()...) {
				if detected.IsZero() || e.Time.Before(detected) {
					detected = e.Time
				}
			}
			if detected.IsZero() {
				t.Fatal("no node logged the restore at ERROR")
			}
			lost := errs.FilterMessage("lease lost").FilterLoggerName(second.id).Filter(func(e observer.LoggedEntry) bool {
				reason, _ := e.ContextMap()["reason"].(string)
				return strings.Contains(reason, "went backwards")
			})
			if lost.Len() == 0 && tt.revisionBack {
				t.Errorf("%s, leader before the restore, did not give its lease up for the rewind: %v", second.id, errs.All())
			}
			t.Logf("terms: %d (snapshot), %d (before the restore, last revision %d), %d (after, led by %s)",
				firstToken, secondToken, lastRev, token, leader.id)
			record(t, "etcd down for the restore (stop, restore, start, all ready)", restored.Sub(restoring))
			record(t, "restore begun to first detection", detected.Sub(restoring))
			record(t, "restore begun to old leader stopping", stopped.Sub(restoring))
			record(t, "restore begun to new term agreed", agreed.Sub(restoring))
		})
	}
}

// waitTerm waits until every node names one leader, in a term whose token is none of
// old, that leads and holds the election key in etcd; it returns that leader and token.
func waitTerm(t *testing.T, f *fleet, cli *clientv3.Client, within time.Duration, old ...int64) (*node, int64) {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		term := f.nodes[0].election.Term()
		agreed := term.LeaderKnown() && !slices.Contains(old, term.Token)
		var leader *node
		for _, n := range f.nodes {
			nt := n.election.Term()
			agreed = agreed && nt.Leader.ID == term.Leader.ID && nt.Token == term.Token
			if n.leading() {
				leader = n
			}
		}
		if agreed && leader != nil && leader.id == term.Leader.ID && keyToken(t, cli) == term.Token {
			return leader, term.Token
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, n := range f.nodes {
		nt := n.election.Term()
		t.Logf("%s: leading=%v leader=%q token=%d reason=%q", n.id, n.leading(), nt.Leader.ID, nt.Token, nt.Reason)
	}
	t.Fatalf("no agreed new term (other than %v) within %s; etcd holds token %d", old, within, keyToken(t, cli))
	return nil, 0
}

// keyToken is the token of the election key in etcd, 0 if nobody holds it.
func keyToken(t *testing.T, cli *clientv3.Client) int64 {
	t.Helper()
	resp := get(t, cli, testPrefix+"restored")
	if len(resp.Kvs) == 0 {
		return 0
	}
	return resp.Kvs[0].CreateRevision
}

func storeRevision(t *testing.T, cli *clientv3.Client) int64 {
	t.Helper()
	return get(t, cli, testPrefix+"filler").Header.Revision
}

func get(t *testing.T, cli *clientv3.Client, key string) *clientv3.GetResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}
