// Package pgbackend is the elector's Backend on PostgreSQL: leases as rows that expire by the
// server's clock, single-statement campaigns and releases, and LISTEN/NOTIFY with polling for
// watches. See docs/postgres.md.
package pgbackend

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/internal/beacon"
)

// Config says how to reach PostgreSQL and which tables to use.
type Config struct {
	// DSN is a libpq connection string: a postgres:// URL or key=value pairs. It may
	// carry sslmode and friends; the fields below override it.
	DSN string
	// Password, if set, replaces the DSN's.
	Password string
	// SSLMode, SSLRootCert, SSLCert and SSLKey, if set, replace the DSN's sslmode,
	// sslrootcert, sslcert and sslkey (libpq's meaning).
	SSLMode, SSLRootCert, SSLCert, SSLKey string
	// TablePrefix begins the name of every table the store uses; DefaultPrefix if empty.
	TablePrefix string
	// SkipSchema, if set, never creates the tables: whoever manages the schema runs
	// Schema's statements beforehand.
	SkipSchema bool
	// MaxConns bounds the connection pool (the listener connection comes on top).
	// Default: 4.
	MaxConns int32
	// PollInterval is how often a watch reads again when no notification came. It is
	// lowered to a third of the first granted lease TTL. Default: 1s.
	PollInterval time.Duration
	// DisableListen turns LISTEN off and leaves watches to polling alone, for a pooler in
	// transaction mode that cannot deliver notifications (PgBouncer).
	DisableListen bool
	// Logger receives connection trouble of the listener; nil discards it.
	Logger *zap.Logger
}

// Backend talks to one PostgreSQL database. New does not connect: connections are made by
// the first requests, so a config can be validated without a reachable database.
type Backend struct {
	cfg   Config
	names names
	pool  *pgxpool.Pool
	poll  atomic.Int64 // a time.Duration

	schemaMu   sync.Mutex
	schemaDone bool
	// noWhy is set when the acknowledgements' why column is missing: a schema managed by
	// hand (SkipSchema) that Schema's statements of this release have not been run on.
	noWhy atomic.Bool
	// noBeat is set, likewise, when the leases' beat column is missing: no election's
	// heartbeats are then grouped, and grouped keys' reads and Expire read the beat in a
	// way that works before and after the column is added (see beatOf).
	noBeat atomic.Bool

	// groups are the groups of elections whose heartbeats share a beacon (beacon.go).
	groups beacon.Groups[group]

	// last holds the latest states reported for each election (see Watch).
	lastMu sync.Mutex
	last   map[string][]reported

	// wrote is the value this backend last wrote to each election's key (see Update).
	wroteMu sync.Mutex
	wrote   map[string]wrote

	// seen is what this backend was answered, to tell a store gone back in time (see
	// fence.go).
	seen seen

	listener *listener

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

var _ elector.Backend = (*Backend)(nil)

// New checks cfg and returns a Backend that has not connected yet.
func New(cfg Config) (*Backend, error) {
	if cfg.TablePrefix == "" {
		cfg.TablePrefix = DefaultPrefix
	}
	if !prefixPattern.MatchString(cfg.TablePrefix) {
		return nil, fmt.Errorf("pgbackend: table prefix %q: use lower-case letters, digits and _, at most 40", cfg.TablePrefix)
	}
	if cfg.MaxConns == 0 {
		cfg.MaxConns = 4
	}
	if cfg.MaxConns < 1 {
		return nil, fmt.Errorf("pgbackend: max_conns %d must be at least 1", cfg.MaxConns)
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = time.Second
	}
	if cfg.PollInterval < 0 {
		return nil, fmt.Errorf("pgbackend: poll interval %s is negative", cfg.PollInterval)
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	pcfg, err := poolConfig(cfg)
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		return nil, fmt.Errorf("pgbackend: %s: %w", Redact(cfg.DSN), err)
	}
	b := &Backend{cfg: cfg, names: newNames(cfg.TablePrefix), pool: pool, last: make(map[string][]reported),
		wrote: make(map[string]wrote), seen: seen{terms: make(map[string]int64)}}
	b.poll.Store(int64(cfg.PollInterval))
	b.ctx, b.cancel = context.WithCancel(context.Background())
	b.listener = newListener(b, pcfg.ConnConfig)
	return b, nil
}

// poolConfig parses the DSN with cfg's overrides. Statements run in QueryExecModeExec:
// extended protocol with unnamed statements only, never a prepared statement that outlives
// a request, so that a pooler in transaction mode can hand each request to any server
// connection.
func poolConfig(cfg Config) (*pgxpool.Config, error) {
	dsn, err := withOverrides(cfg)
	if err != nil {
		return nil, err
	}
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("pgbackend: dsn %s: %w", Redact(cfg.DSN), redactErr(err, cfg))
	}
	if cfg.Password != "" {
		pcfg.ConnConfig.Password = cfg.Password
	}
	pcfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	pcfg.MaxConns = cfg.MaxConns
	pcfg.MinConns = 0
	pcfg.MaxConnIdleTime = time.Minute
	pcfg.HealthCheckPeriod = 10 * time.Second
	if pcfg.ConnConfig.ConnectTimeout == 0 {
		pcfg.ConnConfig.ConnectTimeout = defaultConnectTimeout
	}
	return pcfg, nil
}

// defaultConnectTimeout bounds a connection attempt when the DSN sets no connect_timeout.
// It is long on purpose: a request gives up on its own deadline while the attempt goes on
// in the pool's background, and an attempt abandoned early wastes the server's work on it.
// When a whole fleet starts at once (hundreds of connections on a busy server), attempts
// abandoned after a few seconds are retried at once and the server never catches up: 200
// candidates on 2 cores never all got a lease with 5 s here, and agreed within 34 s with 30 s.
const defaultConnectTimeout = 30 * time.Second

// ErrClosed is returned by requests on a closed Backend.
var ErrClosed = errors.New("pgbackend: closed")

// ready makes sure the tables exist (once) before the first request.
func (b *Backend) ready(ctx context.Context) error {
	if b.ctx.Err() != nil {
		return ErrClosed
	}
	b.listener.start()
	b.schemaMu.Lock()
	defer b.schemaMu.Unlock()
	if b.schemaDone {
		return nil
	}
	if b.cfg.SkipSchema {
		if err := b.probeColumns(ctx); err != nil {
			return err
		}
	} else if err := b.createSchema(ctx); err != nil {
		return err
	}
	b.schemaDone = true
	return nil
}

// probeColumns looks, once, whether a schema managed by hand has the columns added by
// later releases: the acknowledgements' why and the leases' and vacated keys' beat.
// Without why, acknowledgements are written and read as an earlier release did, without a
// reason (the history then says "handed over"); without beat, every heartbeat rewrites its
// key, as before grouping, while reads and Expire of grouped keys still see the beacons of
// instances started after the column was added (beatOf). Either way the store keeps
// working until Schema's statements are run again. b.schemaMu is held.
func (b *Backend) probeColumns(ctx context.Context) error {
	const has = `EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attname = %s AND NOT attisdropped)`
	var why, beat bool
	err := b.pool.QueryRow(ctx, `SELECT `+fmt.Sprintf(has, "$1", "'why'")+`, `+fmt.Sprintf(has, "$2", "'beat'")+
		` AND `+fmt.Sprintf(has, "$3", "'beat'"), b.names.acks, b.names.leases, b.names.vacated).Scan(&why, &beat)
	if err != nil {
		return b.describe(err)
	}
	if !why {
		b.cfg.Logger.Warn("the acknowledgements table has no why column: run pgbackend.Schema's statements again (skip_schema) so that the history can say how each term ended",
			zap.String("table", b.names.acks))
	}
	if !beat {
		b.cfg.Logger.Warn("the leases table has no beat column: run pgbackend.Schema's statements again (skip_schema) so that a shard set's heartbeats share one write per instance",
			zap.String("table", b.names.leases))
	}
	b.noWhy.Store(!why)
	b.noBeat.Store(!beat)
	return nil
}

// ackWhy returns the SQL that writes (a column and a value, $4) and reads (an expression
// over the acknowledgements' row a) an acknowledgement's why, and the arguments of a
// write that takes its why last; without the column (see probeWhy) no why is written and
// every one reads empty.
func (b *Backend) ackWhy(args []any, why string) (col, val, read string, _ []any) {
	if b.noWhy.Load() {
		return "", "", "NULL::text", args
	}
	return ", why", ", $4", "a.why", append(args, why)
}

// Pool is the backend's connection pool, for tests and metrics.
func (b *Backend) Pool() *pgxpool.Pool { return b.pool }

// Close implements elector.Backend: it ends watches and the listener and closes the pool.
func (b *Backend) Close() error {
	b.cancel()
	b.listener.stop()
	b.wg.Wait()
	b.pool.Close()
	return nil
}
