package pgbackend

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/elector/electortest"
	"github.com/caddyleader/caddy-leader/internal/testkit/faultproxy"
	"github.com/caddyleader/caddy-leader/internal/testkit/pgtest"
	"github.com/caddyleader/caddy-leader/internal/testkit/proxyfleet"
)

// pgFleet is a fleet of candidates, each reaching the database (or a pooler) at target
// through a fault proxy of its own, under application_name node-<i>.
type pgFleet struct{ *proxyfleet.Fleet }

func startPGFleet(t *testing.T, target string, ttl time.Duration, election string, cfg Config) *pgFleet {
	t.Helper()
	return &pgFleet{proxyfleet.Start(t, electortest.FleetOptions{Size: 3, TTL: ttl, Election: election}, target,
		func(t testing.TB, i int, addr string) elector.Backend {
			c := cfg
			c.DSN = fmt.Sprintf("postgres://%s@%s/postgres?sslmode=disable&application_name=node-%d", pgtest.Superuser, addr, i)
			b, err := New(c)
			if err != nil {
				t.Fatal(err)
			}
			return b
		})}
}

// cut makes m's link to the database silent, as a crash or a partition would.
func (f *pgFleet) cut(m *electortest.Member) { f.Proxy(m).Blackhole() }

func measured(t *testing.T, what string, d time.Duration) {
	t.Logf("measured %s: %s", what, d.Round(time.Millisecond))
}

func TestElection(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	const ttl = 2 * time.Second
	server := pgtest.Start(t)

	t.Run("three_candidates_one_leader", func(t *testing.T) {
		f := startPGFleet(t, server.Addr(), ttl, "one", Config{})
		leader, token := f.Leader(ttl + 5*time.Second)
		for _, m := range f.Members {
			if term := m.Election.Term(); m != leader && (term.Holds() || term.Leader.URL != "http://"+leader.ID+".test:8080") {
				t.Errorf("%s: holds=%v, leader URL %q", m.ID, term.Holds(), term.Leader.URL)
			}
		}
		if token <= 0 {
			t.Fatalf("token %d", token)
		}
	})

	t.Run("crashed_leader_is_replaced_after_its_lease_expires", func(t *testing.T) {
		f := startPGFleet(t, server.Addr(), ttl, "crash", Config{})
		leader, token := f.Leader(ttl + 5*time.Second)
		cutAt := time.Now()
		f.cut(leader)
		_, _, at := f.NewLeader(leader, token, ttl+3*time.Second)
		measured(t, "failover after a crash (ttl 2s)", at.Sub(cutAt))
	})

	t.Run("leader_cut_off_stops_admitting_before_its_row_can_be_taken", func(t *testing.T) {
		f := startPGFleet(t, server.Addr(), ttl, "cut", Config{})
		leader, token := f.Leader(ttl + 5*time.Second)
		f.cut(leader)
		f.Await("the cut-off leader stopping", ttl, func() bool { return !leader.Leading() })
		next, _, _ := f.NewLeader(leader, token, ttl+3*time.Second)
		// The watchdog counts any moment in which both admitted.
		f.Proxy(leader).Heal()
		f.Await("the old leader following the new one", 2*ttl, func() bool {
			return leader.Election.Term().Leader.ID == next.ID
		})
	})

	t.Run("resign_hands_over_without_waiting_for_the_ttl", func(t *testing.T) {
		f := startPGFleet(t, server.Addr(), ttl, "resign", Config{})
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

	t.Run("terminated_backends_do_not_cost_leadership", func(t *testing.T) {
		f := startPGFleet(t, server.Addr(), ttl, "terminate", Config{})
		leader, token := f.Leader(ttl + 5*time.Second)
		before := leader.Candidate.LastContact()
		n := server.QueryInt(t, fmt.Sprintf(`SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE application_name = 'node-%d'`, f.Index(leader)))
		if n == 0 {
			t.Fatal("the leader had no connection to terminate")
		}
		f.Await("a renewal after the connections were killed", 2*ttl, func() bool {
			return leader.Candidate.LastContact().After(before.Add(ttl / 3))
		})
		if l, tok := f.Leader(ttl); l != leader || tok != token {
			t.Fatalf("leadership moved to %s (token %d)", l.ID, tok)
		}
	})

	t.Run("operator_deletes_the_row", func(t *testing.T) {
		f := startPGFleet(t, server.Addr(), ttl, "operator", Config{})
		_, token := f.Leader(ttl + 5*time.Second)
		server.Exec(t, `DELETE FROM caddy_leader_elections WHERE name = 'operator'`)
		f.Await("a new term", ttl+3*time.Second, func() bool {
			l := f.Leaders()
			return len(l) == 1 && l[0].Election.Term().Token > token
		})
	})

	t.Run("database_restart_within_the_ttl_keeps_leadership", func(t *testing.T) {
		const ttl = 5 * time.Second
		f := startPGFleet(t, server.Addr(), ttl, "restart", Config{})
		leader, token := f.Leader(ttl + 5*time.Second)
		start := time.Now()
		server.Stop(t)
		server.Start(t)
		measured(t, "database restart", time.Since(start))
		f.Await("a renewal after the restart", ttl, func() bool { return leader.Candidate.LastContact().After(start) })
		if l, tok := f.Leader(ttl); l != leader || tok != token {
			t.Fatalf("leadership moved to %s (token %d)", l.ID, tok)
		}
	})
}

func TestElectionBehindPgBouncer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL and PgBouncer")
	}
	const ttl = 2 * time.Second
	server := pgtest.Start(t)
	bouncer := pgtest.StartPgBouncer(t, server)
	// Notifications do not come through a pooler in transaction mode: watches poll.
	f := startPGFleet(t, fmt.Sprintf("127.0.0.1:%d", bouncer.Port), ttl, "bouncer", Config{DisableListen: true})
	leader, token := f.Leader(ttl + 5*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	if err := leader.Election.Resign(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	next, token, at := f.NewLeader(leader, token, ttl+time.Second)
	measured(t, "failover after resign behind PgBouncer", at.Sub(start))
	cutAt := time.Now()
	f.cut(next)
	_, _, at = f.NewLeader(next, token, ttl+3*time.Second)
	measured(t, "failover after a crash behind PgBouncer", at.Sub(cutAt))
}

// TestPromotedReplicaNeverRepeatsATerm makes an asynchronous replica miss the last terms
// (and more sequence values than PostgreSQL logs ahead, 32), promotes it, and checks that
// the terms and leases it hands out are above every one the old primary handed out.
func TestPromotedReplicaNeverRepeatsATerm(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	primary := pgtest.Start(t)
	link, err := faultproxy.New(primary.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer link.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	old := newBackend(t, Config{DSN: primary.DSN()})
	lease, _, err := old.Grant(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	replica := primary.StartReplicaVia(t, link.Addr())
	// Wait until the replica has the tables and the lease.
	deadline := time.Now().Add(20 * time.Second)
	for replica.QueryInt(t, `SELECT count(*) FROM pg_class WHERE relname = 'caddy_leader_leases'`) == 0 ||
		replica.QueryInt(t, `SELECT count(*) FROM caddy_leader_leases`) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the replica did not catch up")
		}
		time.Sleep(50 * time.Millisecond)
	}
	link.Blackhole()
	var last, lastLease int64
	for i := range 50 {
		o, err := old.Campaign(ctx, "failover", []byte("old"), lease)
		if err != nil || o.Holder == nil || o.Holder.Lease != lease {
			t.Fatalf("campaign %d on the old primary: %+v %v", i, o.Holder, err)
		}
		last = o.Holder.Token
		if err := old.Release(ctx, "failover", last, lease, elector.EndedResigned); err != nil {
			t.Fatal(err)
		}
	}
	l, _, err := old.Grant(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	lastLease = int64(l)
	primary.Crash(t)
	replica.Promote(t)

	promoted := newBackend(t, Config{DSN: replica.DSN()})
	var newLease elector.LeaseID
	for time.Now().Before(deadline.Add(10 * time.Second)) {
		// Promotion finishes in the background: writes fail until it has.
		if newLease, _, err = promoted.Grant(ctx, time.Minute); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("Grant on the promoted replica: %v", err)
	}
	if int64(newLease) <= lastLease {
		t.Errorf("lease %d on the promoted replica does not exceed %d from the old primary", newLease, lastLease)
	}
	o, err := promoted.Campaign(ctx, "failover", []byte("new"), newLease)
	if err != nil || o.Holder == nil || o.Holder.Lease != newLease {
		t.Fatalf("campaign on the promoted replica: %+v %v", o.Holder, err)
	}
	if o.Holder.Token <= last {
		t.Fatalf("token %d on the promoted replica does not exceed %d, the old primary's last", o.Holder.Token, last)
	}
	t.Logf("old primary's last token %#x, promoted replica's first %#x", last, o.Holder.Token)
}
