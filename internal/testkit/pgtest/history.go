package pgtest

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// What an operator does to a cluster's history: a later WAL timeline (as after failovers),
// a dump, and a restore of one into another database or cluster.

// DatabaseDSN is DSN for database db.
func (s *Server) DatabaseDSN(db string) string {
	return fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", Superuser, s.Addr(), db)
}

// SetTimeline stops the server, moves it to WAL timeline tli with pg_resetwal -l (which
// only ever raises it), and starts it again: as if it had been promoted tli-1 times.
func (s *Server) SetTimeline(t testing.TB, tli uint32) {
	t.Helper()
	s.Stop(t)
	// Log file 0xFF is past every segment a test server writes.
	s.run(t, filepath.Join(s.bin, "pg_resetwal"), "-l", fmt.Sprintf("%08X%08X%08X", tli, 0xFF, 0), "-D", s.dir)
	s.Start(t)
}

// Dump returns pg_dump's plain SQL of database db.
func (s *Server) Dump(t testing.TB, db string) []byte {
	t.Helper()
	file := filepath.Join(filepath.Dir(s.dir), "dump.sql")
	s.run(t, filepath.Join(s.bin, "pg_dump"), "-h", "127.0.0.1", "-p", strconv.Itoa(s.Port), "-U", Superuser,
		"-d", db, "-f", file)
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(file)
	return b
}

// Restore creates database db and runs dump (from Dump) in it, stopping at the first error.
func (s *Server) Restore(t testing.TB, db string, dump []byte) {
	t.Helper()
	s.Exec(t, "CREATE DATABASE "+db)
	file := filepath.Join(filepath.Dir(s.dir), "restore.sql")
	if err := os.WriteFile(file, dump, 0o644); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(file)
	s.run(t, filepath.Join(s.bin, "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1",
		"-p", strconv.Itoa(s.Port), "-U", Superuser, "-d", db, "-f", file)
}
