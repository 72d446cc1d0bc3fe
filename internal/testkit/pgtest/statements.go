package pgtest

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// Statement is one statement as pg_stat_statements counts it.
type Statement struct {
	Calls int64
	// Query is its normalised text, white space folded, cut to its first 110 characters.
	Query string
}

// Statements lists the statements pg_stat_statements counted (since its last reset)
// whose text contains like (case-insensitive), the busiest first; pg_stat_statements'
// own queries are left out. The server preloads the library; the extension must have
// been created (CREATE EXTENSION pg_stat_statements).
func (s *Server) Statements(t testing.TB, like string) []Statement {
	t.Helper()
	ctx, conn, done := s.connect(t)
	defer done()
	rows, err := conn.Query(ctx, `SELECT calls, query FROM pg_stat_statements
		WHERE query ILIKE '%' || $1 || '%' AND query NOT ILIKE '%pg_stat_statements%' ORDER BY calls DESC`, like)
	if err != nil {
		t.Fatalf("pgtest: pg_stat_statements: %v", err)
	}
	list, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Statement, error) {
		var st Statement
		err := row.Scan(&st.Calls, &st.Query)
		if st.Query = strings.Join(strings.Fields(st.Query), " "); len(st.Query) > 110 {
			st.Query = st.Query[:110] + "..."
		}
		return st, err
	})
	if err != nil {
		t.Fatalf("pgtest: pg_stat_statements: %v", err)
	}
	return list
}
