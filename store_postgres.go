package caddyleader

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/pgbackend"
)

func init() {
	caddy.RegisterModule(PostgresStore{})
}

// PostgresStore is the `leader.stores.postgres` module: elections in a PostgreSQL database.
// Each instance's lease is a row whose `expires_at` the server's clock sets; each election is
// a row bound to its holder's lease, and its token (the WAL timeline above a sequence)
// strictly increases, also across a failover to a standby. Every request is one autocommit
// statement, so PgBouncer in transaction mode may sit in front (with disable_listen). See
// docs/postgres.md for the schema, the grants and the guarantees.
type PostgresStore struct {
	// DSN is the libpq connection string, a `postgres://` URL or `key=value` pairs, such as
	// `postgres://caddy_leader@db.internal:5432/app?sslmode=verify-full`. Keep the password
	// out of it (see password). Placeholders such as `{env.LEADER_PG_DSN}` are expanded.
	// Required.
	DSN string `json:"dsn,omitempty"`

	// Password is the database password, replacing any in dsn. Give a placeholder such as
	// `{env.LEADER_PG_PASSWORD}` or `{file./run/secrets/pg-password}` rather than the
	// password itself, which anyone who can read Caddy's config (its admin API too) would
	// see; a placeholder that expands to nothing is an error. It is never logged, and logs
	// and errors show dsn with its password replaced. Default: the DSN's, or none (libpq's
	// ~/.pgpass and PGPASSWORD also apply).
	Password string `json:"password,omitempty"`

	// SSLMode is libpq's sslmode: `disable`, `allow`, `prefer`, `require`, `verify-ca` or
	// `verify-full`; it replaces the DSN's. Use `verify-full` across any network you do not
	// own. Default: the DSN's, else `prefer`.
	SSLMode string `json:"sslmode,omitempty"`

	// SSLRootCert is the PEM file of the CAs that sign the server's certificate (libpq's
	// sslrootcert); it replaces the DSN's. Placeholders are expanded. Default: the DSN's.
	SSLRootCert string `json:"sslrootcert,omitempty"`

	// SSLCert is the PEM file of the client certificate (libpq's sslcert), for servers that
	// authenticate clients by certificate; it needs sslkey. Placeholders are expanded.
	// Default: the DSN's.
	SSLCert string `json:"sslcert,omitempty"`

	// SSLKey is the PEM file of sslcert's private key (libpq's sslkey). Placeholders are
	// expanded. Default: the DSN's.
	SSLKey string `json:"sslkey,omitempty"`

	// TablePrefix begins the name of every table, sequence, function and trigger the store
	// uses: lower-case letters, digits and `_`. Default: `caddy_leader_`.
	TablePrefix string `json:"table_prefix,omitempty"`

	// SkipSchema, if true, never creates the tables: whoever manages the schema creates them
	// beforehand (docs/postgres.md lists the statements). Default: false, the tables are
	// created if missing on the first request.
	SkipSchema bool `json:"skip_schema,omitempty"`

	// MaxConns bounds the instance's connection pool; the LISTEN connection comes on top.
	// Default: 4.
	MaxConns int32 `json:"max_conns,omitempty"`

	// DisableListen, if true, leaves followers to poll (every ttl/3) instead of waiting for
	// NOTIFY, for a pooler in transaction mode that cannot deliver notifications
	// (PgBouncer). A handover then takes up to ttl/3 instead of milliseconds. Default:
	// false.
	DisableListen bool `json:"disable_listen,omitempty"`

	secrets string
}

// CaddyModule returns the Caddy module information.
func (PostgresStore) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "leader.stores.postgres",
		New: func() caddy.Module { return new(PostgresStore) },
	}
}

// Provision implements caddy.Provisioner: it expands placeholders and checks every field,
// without connecting.
func (p *PostgresStore) Provision(caddy.Context) error {
	repl := caddy.NewReplacer()
	for _, f := range []struct {
		name string
		val  *string
	}{{"dsn", &p.DSN}, {"password", &p.Password}, {"sslrootcert", &p.SSLRootCert}, {"sslcert", &p.SSLCert}, {"sslkey", &p.SSLKey}} {
		v, err := repl.ReplaceOrErr(*f.val, true, false)
		if err != nil {
			return fmt.Errorf("%s: %v", f.name, err)
		}
		*f.val = v
	}
	if p.DSN == "" {
		return fmt.Errorf("dsn: required")
	}
	if (p.SSLCert == "") != (p.SSLKey == "") {
		return fmt.Errorf("sslcert, sslkey: the client certificate and its key go together")
	}
	// New parses and checks everything else, without connecting.
	b, err := pgbackend.New(p.config(zap.NewNop()))
	if err != nil {
		return fmt.Errorf("postgres store: %v", err)
	}
	b.Close()
	var files []byte
	for _, name := range []string{p.SSLRootCert, p.SSLCert, p.SSLKey} {
		if name != "" {
			data, err := os.ReadFile(name)
			if err != nil {
				return fmt.Errorf("postgres store: %v", err)
			}
			files = append(files, data...)
		}
	}
	p.secrets = secretsDigest([]byte(p.Password), files)
	return nil
}

func (p *PostgresStore) config(logger *zap.Logger) pgbackend.Config {
	return pgbackend.Config{
		DSN:           p.DSN,
		Password:      p.Password,
		SSLMode:       p.SSLMode,
		SSLRootCert:   p.SSLRootCert,
		SSLCert:       p.SSLCert,
		SSLKey:        p.SSLKey,
		TablePrefix:   p.TablePrefix,
		SkipSchema:    p.SkipSchema,
		MaxConns:      p.MaxConns,
		DisableListen: p.DisableListen,
		Logger:        logger,
	}
}

// StoreKey implements Store. The DSN goes in with its password replaced; the password and
// the certificate files' contents only as a keyed digest.
func (p *PostgresStore) StoreKey() string {
	key, _ := json.Marshal([]any{"postgres", pgbackend.Redact(p.DSN), p.SSLMode, p.SSLRootCert, p.SSLCert, p.SSLKey,
		p.TablePrefix, p.SkipSchema, p.MaxConns, p.DisableListen, p.secrets, secretsDigest([]byte(p.DSN))})
	return string(key)
}

// NewBackend implements Store.
func (p *PostgresStore) NewBackend(logger *zap.Logger) (elector.Backend, error) {
	return pgbackend.New(p.config(logger.Named("postgres")))
}

// UnmarshalCaddyfile sets up the store from the `store postgres` block of the leader global
// option:
//
//	store postgres {
//		dsn            <connection string>
//		password       <password>
//		sslmode        <mode>
//		sslrootcert    <file>
//		sslcert        <file>
//		sslkey         <file>
//		table_prefix   <prefix>
//		skip_schema
//		max_conns      <n>
//		disable_listen
//	}
//
// Give the password as a placeholder, {env.VAR} or {file.path}, which Caddy expands when it
// loads the config: {$VAR} would write the password itself into the adapted JSON.
func (p *PostgresStore) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the store's name
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		switch opt := d.Val(); opt {
		case "dsn", "password", "sslmode", "sslrootcert", "sslcert", "sslkey", "table_prefix":
			dst := map[string]*string{"dsn": &p.DSN, "password": &p.Password, "sslmode": &p.SSLMode,
				"sslrootcert": &p.SSLRootCert, "sslcert": &p.SSLCert, "sslkey": &p.SSLKey, "table_prefix": &p.TablePrefix}[opt]
			if err := oneArg(d, dst); err != nil {
				return err
			}
			if opt == "password" {
				warnLiteralPassword(d, p.Password)
			}
		case "skip_schema":
			if d.NextArg() {
				return d.ArgErr()
			}
			p.SkipSchema = true
		case "disable_listen":
			if d.NextArg() {
				return d.ArgErr()
			}
			p.DisableListen = true
		case "max_conns":
			var n string
			if err := oneArg(d, &n); err != nil {
				return err
			}
			var v int32
			if _, err := fmt.Sscan(n, &v); err != nil || v < 1 || fmt.Sprint(v) != n {
				return d.Errf("max_conns: %q is not a whole number of at least 1", n)
			}
			p.MaxConns = v
		default:
			return d.Errf("unrecognized postgres store option %q", opt)
		}
	}
	if p.DSN == "" {
		return d.Err("store postgres: dsn: required")
	}
	return nil
}

// Interface guards
var (
	_ Store                 = (*PostgresStore)(nil)
	_ caddy.Provisioner     = (*PostgresStore)(nil)
	_ caddyfile.Unmarshaler = (*PostgresStore)(nil)
	_ caddyfile.Unmarshaler = (*EtcdStore)(nil)
)
