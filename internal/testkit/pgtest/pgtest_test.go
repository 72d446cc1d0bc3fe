package pgtest

import "testing"

func TestServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	s := Start(t)
	s.Exec(t, "CREATE TABLE t (n int); INSERT INTO t VALUES (1)")
	t.Run("restart_keeps_data", func(t *testing.T) {
		s.Crash(t)
		s.Start(t)
		if n := s.QueryInt(t, "SELECT count(*) FROM t"); n != 1 {
			t.Fatalf("after a crash and restart the table has %d rows, want 1", n)
		}
	})
	t.Run("replica_promotes_to_a_new_timeline", func(t *testing.T) {
		r := s.StartReplica(t)
		r.Promote(t)
		tl := r.QueryInt(t, "SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint")
		if tl != 2 {
			t.Fatalf("promoted replica is on timeline %d, want 2", tl)
		}
		r.Exec(t, "CREATE ROLE app LOGIN; SET ROLE app; SELECT pg_walfile_name(pg_current_wal_lsn())")
	})
}
