package pgbackend

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/internal/testkit/pgtest"
)

// TestFencingTokensNeverGoBack: tokens and lease ids keep rising across what replaces a
// cluster's history (issue 18, hole 4). The old cluster runs on WAL timeline 5, as after
// four failovers, so its tokens are 5<<40 and up.
//   - A dump restored into a new cluster (timeline 1, as after pg_upgrade too): a backend
//     that saw nothing before gets a token above every old one, from the store's mark.
//   - A restore from a backup older than the last terms: the sequence and the rows come
//     back as they were, and only the instances remember what came after. A backend that
//     saw those terms reports the rewind (elector.ErrStoreRewound) on its next read and on
//     its next Renew, and its next lease and token are above what it saw.
func TestFencingTokensNeverGoBack(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	old := pgtest.Start(t)
	old.SetTimeline(t, 5)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const election = "fence"

	// term grants a lease on b, wins a term with it and, unless keep, releases it.
	term := func(t *testing.T, b *Backend, keep bool) (elector.LeaseID, int64) {
		t.Helper()
		lease, o := win(t, ctx, b, election, "v", time.Minute)
		if !keep {
			if err := b.Release(ctx, election, o.Holder.Token, lease, elector.EndedResigned); err != nil {
				t.Fatal(err)
			}
		}
		return lease, o.Holder.Token
	}
	above := func(t *testing.T, what string, got, highest int64) {
		t.Helper()
		if got <= highest {
			t.Errorf("%s %d (timeline %d), not above %d (timeline %d) handed out before", what, got, got>>40, highest, highest>>40)
		}
	}

	t.Run("dump_restored_into_a_new_cluster", func(t *testing.T) {
		old.Exec(t, "CREATE DATABASE moved")
		b := newBackend(t, Config{DSN: old.DatabaseDSN("moved")})
		var lease elector.LeaseID
		var token int64
		for range 3 {
			lease, token = term(t, b, false)
		}
		b.Close()
		fresh := pgtest.Start(t)
		fresh.Restore(t, "moved", old.Dump(t, "moved"))

		nb := newBackend(t, Config{DSN: fresh.DatabaseDSN("moved")})
		newLease, newToken := term(t, nb, true)
		above(t, "the new cluster's first lease", int64(newLease), int64(lease))
		above(t, "the new cluster's first token", newToken, token)
	})

	t.Run("restored_from_an_older_backup", func(t *testing.T) {
		old.Exec(t, "CREATE DATABASE restored")
		b := newBackend(t, Config{DSN: old.DatabaseDSN("restored")})
		term(t, b, false)
		backup := old.Dump(t, "restored")
		for range 3 {
			term(t, b, false)
		}
		lease, token := term(t, b, true)

		old.Exec(t, "DROP DATABASE restored WITH (FORCE)")
		old.Restore(t, "restored", backup)
		b.Pool().Reset() // its connections were to the dropped database

		if _, err := b.Observe(ctx, election); !errors.Is(err, elector.ErrStoreRewound) {
			t.Errorf("Observe after the restore: %v; want ErrStoreRewound", err)
		}
		if _, err := b.Renew(ctx, lease); !errors.Is(err, elector.ErrStoreRewound) {
			t.Errorf("Renew of a lease granted before the restore: %v; want ErrStoreRewound", err)
		}
		newLease, newToken := term(t, b, true)
		above(t, "the lease granted after the restore", int64(newLease), token)
		above(t, "the token of the term after the restore", newToken, token)
		if o, err := b.Observe(ctx, election); err != nil || o.Holder == nil || o.Holder.Token != newToken {
			t.Errorf("Observe after the new term: %+v, %v", o, err)
		}
		if err := b.Release(ctx, election, newToken, newLease, elector.EndedResigned); err != nil {
			t.Fatal(err)
		}
		// A backend that saw nothing goes on from there.
		_, freshToken := term(t, newBackend(t, Config{DSN: old.DatabaseDSN("restored")}), false)
		above(t, "the next term's token", freshToken, newToken)
	})
}

// TestConcurrentGrantsDoNotMoveTheFence: grants and campaigns running side by side hand
// out values in whatever order they commit; none of them is a generator gone back, so the
// sequence is never moved on (which would skip 2^32 values each time).
func TestConcurrentGrantsDoNotMoveTheFence(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	server := pgtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const clients, grants = 4, 25
	ids := make([][]int64, clients)
	var wg sync.WaitGroup
	for i := range clients {
		b := newBackend(t, Config{DSN: server.DSN()})
		if _, _, err := b.Grant(ctx, time.Minute); err != nil { // creates the tables first
			t.Fatal(err)
		}
		wg.Go(func() {
			for range grants {
				id, _, err := b.Grant(ctx, time.Minute)
				if err != nil {
					t.Error(err)
					return
				}
				ids[i] = append(ids[i], int64(id))
			}
		})
	}
	wg.Wait()
	all := slices.Concat(ids...)
	if lo, hi := slices.Min(all), slices.Max(all); hi-lo >= fenceSlack {
		t.Errorf("lease ids from %d to %d: the sequence was moved on though it never went back", lo, hi)
	}
}
