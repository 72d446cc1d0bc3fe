package pgbackend

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/elector/electortest"
	"github.com/caddyleader/caddy-leader/internal/testkit/pgtest"
	"github.com/caddyleader/caddy-leader/jobs/jobstest"
)

// TestConformance runs the store-neutral suites (the elector's, and the job records')
// against a real PostgreSQL: with LISTEN, with watches left to polling, and behind
// PgBouncer in transaction mode (polling too); each with elections on their own and
// grouped (a shard set's, whose heartbeats share a beacon and whose watches share a read).
func TestConformance(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	server := pgtest.Start(t)
	var n atomic.Int64
	for _, tc := range []struct {
		name string
		dsn  func(t *testing.T) string
		cfg  Config
	}{
		{"listen", func(*testing.T) string { return server.DSN() }, Config{}},
		{"disable_listen", func(*testing.T) string { return server.DSN() }, Config{DisableListen: true}},
		{"pgbouncer", func(t *testing.T) string { return pgtest.StartPgBouncer(t, server).DSN() }, Config{DisableListen: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.DSN = tc.dsn(t)
			harness := func(group string) func(t *testing.T) electortest.Harness {
				return func(t *testing.T) electortest.Harness {
					return electortest.Harness{
						NewClient: func(t *testing.T) elector.Backend {
							b := newBackend(t, cfg)
							if group != "" {
								b.GroupHeartbeats(group)
							}
							return b
						},
						TTL:     2 * time.Second,
						Advance: time.Sleep,
						Election: func() string {
							if group != "" {
								return fmt.Sprintf("%s.%d", group, n.Add(1))
							}
							return fmt.Sprintf("conformance-%d", n.Add(1))
						},
						NamesPrev: true,
					}
				}
			}
			t.Run("alone", func(t *testing.T) {
				electortest.Run(t, harness(""))
				electortest.RunBatch(t, harness(""))
				electortest.RunGroupIntents(t, harness(""))
				jobstest.Run(t, harness(""))
			})
			t.Run("grouped", func(t *testing.T) {
				electortest.Run(t, harness("grouped"))
				electortest.RunGrouped(t, harness("grouped"))
				electortest.RunGroupIntents(t, harness("grouped"))
				electortest.RunBatch(t, harness("grouped"))
				jobstest.Run(t, harness("grouped"))
			})
		})
	}
}

func newBackend(t testing.TB, cfg Config) *Backend {
	t.Helper()
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// win grants a lease of ttl on b and wins election with value under it.
func win(t *testing.T, ctx context.Context, b *Backend, election, value string, ttl time.Duration) (elector.LeaseID, elector.Observation) {
	t.Helper()
	lease, _, err := b.Grant(ctx, ttl)
	if err != nil {
		t.Fatal(err)
	}
	o, err := b.Campaign(ctx, election, []byte(value), lease)
	if err != nil || o.Holder == nil || o.Holder.Lease != lease {
		t.Fatalf("campaign: %+v, %v", o, err)
	}
	return lease, o
}
