package kubebackend

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/elector/electortest"
	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
	"github.com/caddyleader/caddy-leader/internal/testkit/proxyfleet"
	"github.com/caddyleader/caddy-leader/kubernetes/internal/kubetest"
)

// kubeFleet is a fleet of candidates, each reaching the API server through a fault proxy
// of its own.
type kubeFleet struct{ *proxyfleet.Fleet }

func startKubeFleet(t *testing.T, srv *kubetest.Server, ttl time.Duration, election string) *kubeFleet {
	t.Helper()
	return &kubeFleet{proxyfleet.Start(t, electortest.FleetOptions{Size: 3, TTL: ttl, Election: election},
		strings.TrimPrefix(srv.URL, "https://"),
		func(t testing.TB, i int, addr string) elector.Backend {
			b, err := New(Config{Kubeconfig: srv.Kubeconfig(t, "admin", "default", "https://"+addr), Prefix: "fleet-"})
			if err != nil {
				t.Fatal(err)
			}
			return b
		})}
}

func measured(t *testing.T, what string, d time.Duration) {
	t.Logf("measured %s: %s", what, d.Round(time.Millisecond))
}

// admin is a backend of the fleet's store for an operator's requests.
func admin(t *testing.T, srv *kubetest.Server) *Backend {
	t.Helper()
	b, err := New(Config{Kubeconfig: srv.Kubeconfig(t, "admin", "default", ""), Prefix: "fleet-"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func TestElection(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kube-apiserver")
	}
	const ttl = 2 * time.Second
	srv := kubetest.Start(t, kubetest.Options{})

	t.Run("three_candidates_one_leader", func(t *testing.T) {
		f := startKubeFleet(t, srv, ttl, "one")
		if _, token := f.Leader(ttl + 5*time.Second); token <= 0 {
			t.Fatalf("token %d", token)
		}
	})

	t.Run("crashed_leader_is_replaced_after_its_lease_expires", func(t *testing.T) {
		f := startKubeFleet(t, srv, ttl, "crash")
		leader, token := f.Leader(ttl + 5*time.Second)
		cutAt := time.Now()
		f.Proxy(leader).Blackhole()
		_, _, at := f.NewLeader(leader, token, 2*ttl+5*time.Second)
		measured(t, "failover after a crash (ttl 2s)", at.Sub(cutAt))
	})

	t.Run("leader_cut_off_stops_admitting_before_its_lease_can_be_taken", func(t *testing.T) {
		f := startKubeFleet(t, srv, ttl, "cut")
		leader, token := f.Leader(ttl + 5*time.Second)
		f.Proxy(leader).Blackhole()
		f.Await("the cut-off leader stopping", ttl, func() bool { return !leader.Leading() })
		next, _, _ := f.NewLeader(leader, token, 2*ttl+5*time.Second)
		f.Proxy(leader).Heal()
		f.Await("the old leader following the new one", 3*ttl, func() bool {
			return leader.Election.Term().Leader.ID == next.ID
		})
	})

	t.Run("a_release_is_one_write_that_the_next_campaign_reads_as_its_acknowledgement", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		a, b := admin(t, srv), admin(t, srv)
		la, _, err := a.Grant(ctx, ttl)
		if err != nil {
			t.Fatal(err)
		}
		lb, _, err := b.Grant(ctx, ttl)
		if err != nil {
			t.Fatal(err)
		}
		const election = "one-write-release"
		won, err := a.Campaign(ctx, election, []byte("a"), la)
		if err != nil || won.Holder == nil || won.Holder.Lease != la {
			t.Fatalf("Campaign: %+v, %v", won, err)
		}
		before := srv.LeaseRequests(t)
		if err := a.Release(ctx, election, won.Holder.Token, la, elector.EndedHandedOver); err != nil {
			t.Fatal(err)
		}
		after := srv.LeaseRequests(t)
		writes := 0.0
		for _, verb := range []string{"POST", "PUT", "PATCH", "DELETE"} {
			writes += after[verb] - before[verb]
		}
		if writes != 1 {
			t.Fatalf("the release made %v writes, want 1: %v then %v", writes, before, after)
		}
		next, err := b.Campaign(ctx, election, []byte("b"), lb)
		if err != nil || next.Holder == nil || next.Holder.Lease != lb {
			t.Fatalf("Campaign after the release: %+v, %v", next, err)
		}
		if next.Prev != won.Holder.Token || !next.PrevReleased || next.PrevWhy != elector.EndedHandedOver {
			t.Fatalf("the campaign after a release reports Prev %d released %v why %q; want %d, true, %q",
				next.Prev, next.PrevReleased, next.PrevWhy, won.Holder.Token, elector.EndedHandedOver)
		}
		if ok, _, err := b.Released(ctx, election, won.Holder.Token, 0); err != nil || ok {
			t.Fatalf("Released after the campaign consumed the acknowledgement = %v, %v; want false", ok, err)
		}
	})

	t.Run("resign_hands_over_without_waiting_for_the_ttl", func(t *testing.T) {
		f := startKubeFleet(t, srv, ttl, "resign")
		leader, token := f.Leader(ttl + 5*time.Second)
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := leader.Election.Resign(ctx, time.Minute); err != nil {
			t.Fatal(err)
		}
		_, _, at := f.NewLeader(leader, token, ttl)
		measured(t, "failover after resign", at.Sub(start))
	})

	t.Run("election_object_deleted_by_an_operator", func(t *testing.T) {
		f := startKubeFleet(t, srv, ttl, "deleted")
		_, token := f.Leader(ttl + 5*time.Second)
		op := admin(t, srv)
		leases, err := op.client()
		if err != nil {
			t.Fatal(err)
		}
		if err := leases.Delete(context.Background(), op.electionName("deleted"), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		// A new term begins, with a token above the deleted object's, although the new
		// object's leaseTransitions starts again.
		f.Await("a new term", 2*ttl+5*time.Second, func() bool {
			for _, m := range f.Members {
				if term, ok := m.Election.Check(); ok && term.Token > token {
					return true
				}
			}
			return false
		})
	})

	t.Run("holder_lease_deleted_by_an_operator", func(t *testing.T) {
		f := startKubeFleet(t, srv, ttl, "revoked")
		leader, token := f.Leader(ttl + 5*time.Second)
		op := admin(t, srv)
		o, err := op.Observe(context.Background(), "revoked")
		if err != nil || o.Holder == nil {
			t.Fatalf("Observe: %+v %v", o.Holder, err)
		}
		if err := op.Revoke(context.Background(), o.Holder.Lease); err != nil {
			t.Fatal(err)
		}
		f.Await("the leader stopping", ttl, func() bool { return !leader.Leading() || leader.Election.Term().Token != token })
		f.NewLeaderOrSame(t, token, 2*ttl+5*time.Second)
	})

	t.Run("rewriting_the_same_value_is_seen", func(t *testing.T) {
		// The elector's heartbeats rewrite the same record; followers must see each one.
		b := admin(t, srv)
		ctx := context.Background()
		id, _, err := b.Grant(ctx, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		o, err := b.Campaign(ctx, "same", []byte("v"), id)
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		changes := b.Watch(wctx, "same", o.Revision)
		if ok, err := b.Update(ctx, "same", o.Holder.Token, []byte("v")); !ok || err != nil {
			t.Fatalf("Update: %v %v", ok, err)
		}
		got := <-changes
		if got.Err != nil || got.Revision <= o.Revision || got.Holder == nil || string(got.Holder.Value) != "v" {
			t.Fatalf("after rewriting the same value the watch reports %+v", got)
		}
	})

	t.Run("api_server_restarted", func(t *testing.T) {
		f := startKubeFleet(t, srv, ttl, "restart")
		leader, token := f.Leader(ttl + 5*time.Second)
		srv.Stop(t)
		srv.Start(t)
		// The term may survive a quick restart or end; either way one leader, and a token
		// that did not go back.
		l, tok := f.Leader(3*ttl + 10*time.Second)
		if tok < token {
			t.Fatalf("token went from %d to %d (%s, then %s)", token, tok, leader.ID, l.ID)
		}
	})
}

// NewLeaderOrSame waits for a term after token: another member's or the same one's anew.
func (f *kubeFleet) NewLeaderOrSame(t *testing.T, token int64, within time.Duration) {
	t.Helper()
	f.Await("a new term", within, func() bool {
		for _, m := range f.Members {
			if term, ok := m.Election.Check(); ok && term.Token > token {
				return true
			}
		}
		return false
	})
}

// TestTokensAcrossEtcdRestore restores the API server's etcd from a snapshot: with
// --bump-revision a new term's token exceeds every earlier one; without it the backend
// reports the rewind.
func TestTokensAcrossEtcdRestore(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kube-apiserver")
	}
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		bump   uint64
		rewind bool
	}{
		{"bump_revision", 1_000_000, false},
		{"no_bump", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := kubetest.Start(t, kubetest.Options{})
			b := admin(t, srv)
			snap := srv.Etcd.Snapshot(t)
			var highest int64
			for i := range 5 {
				id, _, err := b.Grant(ctx, 5*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				o, err := b.Campaign(ctx, "restore", []byte(fmt.Sprint(i)), id)
				if err != nil || o.Holder == nil || o.Holder.Lease != id {
					t.Fatalf("Campaign: %+v %v", o.Holder, err)
				}
				highest = o.Holder.Token
				if err := b.Revoke(ctx, id); err != nil {
					t.Fatal(err)
				}
			}
			srv.Stop(t)
			srv.Etcd.Restore(t, snap, etcdRestore(tc.bump))
			srv.Start(t)
			id, _, err := b.Grant(ctx, 5*time.Second)
			if err == nil {
				var o elector.Observation
				o, err = b.Campaign(ctx, "restore", []byte("after"), id)
				if err == nil && o.Holder.Token <= highest {
					t.Fatalf("token %d after the restore, %d before", o.Holder.Token, highest)
				}
			}
			switch {
			case tc.rewind && !errors.Is(err, elector.ErrStoreRewound):
				t.Fatalf("after a restore without a bump: %v, want ErrStoreRewound", err)
			case !tc.rewind && err != nil:
				t.Fatalf("after a restore with a bump: %v", err)
			}
		})
	}
}

// TestForbidden checks that a service account without the Role gets an error that names
// the verb it lacks.
func TestForbidden(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kube-apiserver")
	}
	srv := kubetest.Start(t, kubetest.Options{RBAC: true})
	b, err := New(Config{Kubeconfig: srv.Kubeconfig(t, "nobody", "default", "")})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	_, _, err = b.Grant(context.Background(), 5*time.Second)
	if !apierrors.IsForbidden(errors.Unwrap(err)) || !strings.Contains(err.Error(), `grant the verb "create"`) {
		t.Fatalf("Grant without rights: %v; want a Forbidden error naming the verb create", err)
	}
}

func etcdRestore(bump uint64) etcdtest.RestoreOptions {
	return etcdtest.RestoreOptions{RevisionBump: bump, MarkCompacted: bump > 0}
}
