package pgbackend

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DefaultPrefix begins the name of every table, sequence, function and trigger the store uses.
const DefaultPrefix = "caddy_leader_"

var prefixPattern = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,39}$`)

// names are the store's SQL object names for one prefix. Prefix is checked against
// prefixPattern, so the names can be put into statements as they are.
type names struct {
	seq, next, fenced, prev, leases, elections, vacated, intents, candidates, acks, history, jobs, notify, channel string
}

func newNames(prefix string) names {
	return names{
		seq:        prefix + "seq",
		next:       prefix + "next",
		fenced:     prefix + "fenced",
		prev:       prefix + "prev",
		leases:     prefix + "leases",
		elections:  prefix + "elections",
		vacated:    prefix + "vacated",
		intents:    prefix + "intents",
		candidates: prefix + "candidates",
		acks:       prefix + "released",
		notify:     prefix + "notify",
		channel:    prefix + "changes",
		history:    prefix + "history",
		jobs:       prefix + "jobs",
	}
}

// Schema returns the statements that create the store's tables for prefix (DefaultPrefix
// if empty), for those who manage the schema themselves (Config.SkipSchema). Running them
// again changes nothing.
func Schema(prefix string) (string, error) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if !prefixPattern.MatchString(prefix) {
		return "", fmt.Errorf("table prefix %q: use lower-case letters, digits and _, at most 40", prefix)
	}
	return schema(newNames(prefix)), nil
}

// schema is the DDL. Why each piece is there:
//   - <prefix>next() hands out lease ids, fencing tokens and revisions: the server's WAL
//     timeline in the top bits, a sequence below. A promoted standby that missed the last
//     writes (asynchronous replication) may hand out sequence values the old primary
//     already used, but it runs on a new, higher timeline, so its values are higher than
//     any of the old primary's. 40 bits of sequence is a trillion values per timeline.
//     The two are added, not or'ed, so that the sequence may be moved past 40 bits when
//     the timeline went back (see fenceSchema).
//   - expires_at lives on the lease, shared by all the elections and announcements of one
//     instance: one renewal per instance per ttl/3, however many elections, as with etcd.
//     It is set from the server's clock_timestamp() only.
//   - Everything bound to a lease references it ON DELETE CASCADE: revoking (or reaping)
//     a lease deletes its election rows and announcements with it, and no row can ever
//     point at a lease that does not exist. Acknowledgements are the exception: a holder
//     revokes its lease right after letting go, and its successor must still find them;
//     they carry an expires_at of their own (the holder's TTL) and are deleted when read.
//     Their why (added later: an older instance's insert leaves it empty) says why the
//     term ended.
//   - beat on the lease is its beacon: the revision of its last heartbeat of the keys it
//     holds in grouped elections (a shard set's), written instead of each key (see
//     beacon.go). It was added later: an existing table gets the column with 0, which no
//     revision is below. The column and the leases' trigger are added only where missing:
//     ALTER TABLE and CREATE TRIGGER lock the table against every renewal, and each
//     instance runs these statements when it starts.
//   - The history of terms is bound to no lease: it outlives every instance. So are the
//     records of scheduled jobs (<prefix>jobs, see jobs.go).
//   - The tokens of the elections and of vacated are indexed, and so is the expiry of the
//     acknowledgements: every campaign asks for the highest token of both tables (see
//     fenceSchema) and every release clears the expired acknowledgements (by the
//     statement's time, not clock_timestamp(), which an index cannot serve), and without
//     the indexes each would read the whole table, once per shard of a set (added later:
//     created where missing, as the columns are).
//   - <prefix>vacated keeps, per election, the key as it was when its row was last deleted
//     (by triggers, so an operator's DELETE or TRUNCATE and a lease's cascade count too).
//     It also names the term before a new one (Observation.Prev). A watch
//     reads the key, not its history: without it a heartbeat followed at once by a delete
//     would reach a watch that read before both as a bare vacancy (see Watch). Its beat
//     (added later) is the deleted key's lease's beacon at that moment. When the lease goes
//     first (its delete cascades to the key), a trigger on the lease keeps its beat in a
//     setting of the transaction for the key's; when even that is unknown, a new revision
//     stands for it, so that a watch reports a write before the vacancy, later than any
//     beacon.
//   - The triggers NOTIFY listeners of every change of an election, intent or candidate
//     row, whoever makes it (an operator's UPDATE or DELETE too, and a lease's cascade),
//     and say which it was; a key's delete carries the vacancy's revision (notice.go).
//     A lease's renewal notifies nobody: it changes no candidate. (A database set up by
//     an earlier version keeps its <prefix>notify_intent(), unused now.)
func schema(n names) string {
	return fmt.Sprintf(`
CREATE SEQUENCE IF NOT EXISTS %[1]s;
CREATE OR REPLACE FUNCTION %[2]s() RETURNS bigint LANGUAGE sql VOLATILE AS $f$
	SELECT (('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint << 40)
		+ nextval('%[1]s')
$f$;
CREATE TABLE IF NOT EXISTS %[3]s (
	id bigint PRIMARY KEY,
	ttl_ms bigint NOT NULL,
	expires_at timestamptz NOT NULL,
	beat bigint NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS %[4]s (
	name text PRIMARY KEY,
	value bytea NOT NULL,
	lease bigint NOT NULL REFERENCES %[3]s (id) ON DELETE CASCADE,
	token bigint NOT NULL,
	rev bigint NOT NULL
);
CREATE INDEX IF NOT EXISTS %[4]s_lease ON %[4]s (lease);
DO $do$ BEGIN
	IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = '%[3]s'::regclass AND attname = 'beat' AND NOT attisdropped) THEN
		ALTER TABLE %[3]s ADD COLUMN IF NOT EXISTS beat bigint NOT NULL DEFAULT 0;
	END IF;
END $do$;
CREATE TABLE IF NOT EXISTS %[5]s (
	election text PRIMARY KEY,
	value bytea NOT NULL,
	rev bigint NOT NULL,
	expires_at timestamptz NOT NULL
);
CREATE TABLE IF NOT EXISTS %[6]s (
	election text NOT NULL,
	id text NOT NULL,
	lease bigint NOT NULL REFERENCES %[3]s (id) ON DELETE CASCADE,
	PRIMARY KEY (election, id)
);
CREATE INDEX IF NOT EXISTS %[6]s_lease ON %[6]s (lease);
ALTER TABLE %[6]s ADD COLUMN IF NOT EXISTS value bytea NOT NULL DEFAULT ''::bytea;
CREATE TABLE IF NOT EXISTS %[7]s (
	election text NOT NULL,
	token bigint NOT NULL,
	expires_at timestamptz NOT NULL,
	PRIMARY KEY (election, token)
);
ALTER TABLE %[7]s ADD COLUMN IF NOT EXISTS why text NOT NULL DEFAULT '';
CREATE TABLE IF NOT EXISTS %[11]s (
	election text NOT NULL,
	seq bigint NOT NULL,
	entry bytea NOT NULL,
	PRIMARY KEY (election, seq)
);
CREATE OR REPLACE FUNCTION %[8]s() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
	IF TG_OP = 'DELETE' THEN
		PERFORM pg_notify('%[9]s', OLD.%[10]s || '/d/' || OLD.token || '/' || OLD.rev || '/' || %[2]s());
	ELSE
		PERFORM pg_notify('%[9]s', NEW.%[10]s || '/k');
	END IF;
	RETURN NULL;
END
$f$;
CREATE OR REPLACE TRIGGER %[4]s_notify AFTER INSERT OR UPDATE OR DELETE ON %[4]s
	FOR EACH ROW EXECUTE FUNCTION %[8]s();
CREATE TABLE IF NOT EXISTS %[12]s (
	name text PRIMARY KEY,
	value bytea NOT NULL,
	lease bigint NOT NULL,
	token bigint NOT NULL,
	rev bigint NOT NULL,
	beat bigint NOT NULL DEFAULT 0
);
DO $do$ BEGIN
	IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = '%[12]s'::regclass AND attname = 'beat' AND NOT attisdropped) THEN
		ALTER TABLE %[12]s ADD COLUMN IF NOT EXISTS beat bigint NOT NULL DEFAULT 0;
	END IF;
END $do$;
DO $do$ BEGIN
	IF to_regclass('%[4]s_token') IS NULL THEN
		CREATE INDEX IF NOT EXISTS %[4]s_token ON %[4]s (token);
	END IF;
	IF to_regclass('%[12]s_token') IS NULL THEN
		CREATE INDEX IF NOT EXISTS %[12]s_token ON %[12]s (token);
	END IF;
	IF to_regclass('%[7]s_expires_at') IS NULL THEN
		CREATE INDEX IF NOT EXISTS %[7]s_expires_at ON %[7]s (expires_at);
	END IF;
END $do$;
CREATE OR REPLACE FUNCTION %[8]s_vacated() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
	INSERT INTO %[12]s (name, value, lease, token, rev, beat)
	VALUES (OLD.name, OLD.value, OLD.lease, OLD.token, OLD.rev,
		COALESCE((SELECT beat FROM %[3]s WHERE id = OLD.lease),
			nullif(current_setting('%[8]s.beat_' || OLD.lease, true), '')::bigint, %[2]s()))
	ON CONFLICT (name) DO UPDATE
		SET value = EXCLUDED.value, lease = EXCLUDED.lease, token = EXCLUDED.token, rev = EXCLUDED.rev,
			beat = EXCLUDED.beat;
	RETURN NULL;
END
$f$;
CREATE OR REPLACE TRIGGER %[4]s_vacated AFTER DELETE ON %[4]s
	FOR EACH ROW EXECUTE FUNCTION %[8]s_vacated();
CREATE OR REPLACE FUNCTION %[8]s_lease_gone() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
	PERFORM set_config('%[8]s.beat_' || OLD.id, OLD.beat::text, true);
	RETURN OLD;
END
$f$;
DO $do$ BEGIN
	IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = '%[3]s'::regclass AND tgname = '%[3]s_gone') THEN
		CREATE TRIGGER %[3]s_gone BEFORE DELETE ON %[3]s
			FOR EACH ROW EXECUTE FUNCTION %[8]s_lease_gone();
	END IF;
END $do$;
CREATE OR REPLACE FUNCTION %[8]s_truncated() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
	DELETE FROM %[4]s; -- row by row, so that the rows are kept and watchers told
	RETURN NULL;
END
$f$;
CREATE OR REPLACE TRIGGER %[4]s_truncated BEFORE TRUNCATE ON %[4]s
	FOR EACH STATEMENT EXECUTE FUNCTION %[8]s_truncated();
CREATE OR REPLACE FUNCTION %[8]s_tagged() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
	IF TG_OP = 'DELETE' THEN
		PERFORM pg_notify('%[9]s', OLD.election || '/' || TG_ARGV[0]);
	ELSE
		PERFORM pg_notify('%[9]s', NEW.election || '/' || TG_ARGV[0]);
	END IF;
	RETURN NULL;
END
$f$;
CREATE OR REPLACE TRIGGER %[5]s_notify AFTER INSERT OR UPDATE OR DELETE ON %[5]s
	FOR EACH ROW EXECUTE FUNCTION %[8]s_tagged('i');
CREATE OR REPLACE TRIGGER %[6]s_notify AFTER INSERT OR UPDATE OR DELETE ON %[6]s
	FOR EACH ROW EXECUTE FUNCTION %[8]s_tagged('c');
`, n.seq, n.next, n.leases, n.elections, n.intents, n.candidates, n.acks, n.notify, n.channel, "name", n.history, n.vacated) +
		fenceSchema(n) + jobsSchema(n)
}

// createSchema runs the DDL. Candidates that start together race to create the same
// objects; the loser of such a race gets a unique violation and simply tries again.
func (b *Backend) createSchema(ctx context.Context) error {
	ddl := schema(b.names)
	var err error
	for range 5 {
		_, err = b.pool.Exec(ctx, ddl, pgx.QueryExecModeSimpleProtocol)
		var pgErr *pgconn.PgError
		if err == nil || !errors.As(err, &pgErr) || (pgErr.Code != "23505" && pgErr.Code != "42P07" && pgErr.Code != "42710" && pgErr.Code != "XX000" && pgErr.Code != "40P01") {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("creating tables %s*: %w", strings.TrimSuffix(b.names.seq, "seq"), err)
	}
	return nil
}
