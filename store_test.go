package caddyleader

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// validate runs what `caddy validate` does for a leader app config: provision, validate and
// clean up, with no store reachable (stores connect lazily).
func validate(t *testing.T, app string) error {
	t.Helper()
	return caddy.Validate(&caddy.Config{
		Admin:   &caddy.AdminConfig{Disabled: true},
		AppsRaw: caddy.ModuleMap{"leader": json.RawMessage(app)},
	})
}

func TestStoreProvision(t *testing.T) {
	t.Setenv("CADDY_LEADER_TEST_PG_PASSWORD", "s3cret-pw")
	for _, tc := range []struct {
		name    string
		app     string
		wantErr string // empty: provisions
	}{
		{name: "postgres", app: `{"instance_id": "n", "store": {"module": "postgres",
			"dsn": "postgres://caddy_leader@127.0.0.1:1/app?sslmode=disable",
			"password": "{env.CADDY_LEADER_TEST_PG_PASSWORD}"}}`},
		{name: "postgres_keyword_dsn", app: `{"instance_id": "n", "store": {"module": "postgres",
			"dsn": "host=127.0.0.1 port=1 dbname=app", "sslmode": "require", "table_prefix": "fleet_a_", "max_conns": 2}}`},
		{name: "etcd_module", app: `{"instance_id": "n", "store": {"module": "etcd", "endpoints": ["127.0.0.1:1"]}}`},
		{name: "etcd_top_level", app: `{"instance_id": "n", "endpoints": ["127.0.0.1:1"]}`},
		{name: "postgres_without_dsn", app: `{"instance_id": "n", "store": {"module": "postgres"}}`,
			wantErr: "dsn: required"},
		{name: "postgres_bad_sslmode", app: `{"instance_id": "n", "store": {"module": "postgres", "dsn": "postgres://h/db", "sslmode": "always"}}`,
			wantErr: `sslmode "always"`},
		{name: "postgres_bad_table_prefix", app: `{"instance_id": "n", "store": {"module": "postgres", "dsn": "postgres://h/db", "table_prefix": "Fleet-A"}}`,
			wantErr: `table prefix "Fleet-A"`},
		{name: "postgres_cert_without_key", app: `{"instance_id": "n", "store": {"module": "postgres", "dsn": "postgres://h/db", "sslcert": "/c.pem"}}`,
			wantErr: "sslcert, sslkey"},
		{name: "postgres_password_from_unset_env", app: `{"instance_id": "n", "store": {"module": "postgres", "dsn": "postgres://h/db",
			"password": "{env.CADDY_LEADER_TEST_UNSET}"}}`, wantErr: "password:"},
		{name: "postgres_missing_root_cert", app: `{"instance_id": "n", "store": {"module": "postgres", "dsn": "postgres://h/db",
			"sslmode": "verify-full", "sslrootcert": "/nonexistent/ca.pem"}}`, wantErr: "ca.pem"},
		{name: "store_and_top_level_etcd", app: `{"instance_id": "n", "endpoints": ["127.0.0.1:1"], "store": {"module": "postgres", "dsn": "postgres://h/db"}}`,
			wantErr: "store: the top-level etcd options"},
		{name: "unknown_store", app: `{"instance_id": "n", "store": {"module": "consul"}}`,
			wantErr: "leader.stores.consul"},
		{name: "etcd_module_without_endpoints", app: `{"instance_id": "n", "store": {"module": "etcd"}}`,
			wantErr: "endpoints: at least one etcd endpoint is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := validate(t, tc.app)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("Validate: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("Validate: %v; want an error containing %q", err, tc.wantErr)
			case err != nil && strings.Contains(err.Error(), "s3cret-pw"):
				t.Fatalf("the error shows the password: %v", err)
			}
		})
	}
}

// TestPostgresStoreKey checks that a reload keeps the candidacy exactly when the store's
// settings are the same, and that the key holds no password.
func TestPostgresStoreKey(t *testing.T) {
	key := func(p PostgresStore) string {
		t.Helper()
		if err := p.Provision(caddy.Context{}); err != nil {
			t.Fatal(err)
		}
		return p.StoreKey()
	}
	base := PostgresStore{DSN: "postgres://u:dsn-pw@h/db", Password: "pw-one"}
	k := key(base)
	if strings.Contains(k, "pw-one") || strings.Contains(k, "dsn-pw") {
		t.Fatalf("store key holds a password: %s", k)
	}
	if key(base) != k {
		t.Error("the same settings gave another key")
	}
	for name, p := range map[string]PostgresStore{
		"password":     {DSN: base.DSN, Password: "pw-two"},
		"dsn_password": {DSN: "postgres://u:other@h/db", Password: base.Password},
		"table_prefix": {DSN: base.DSN, Password: base.Password, TablePrefix: "x_"},
	} {
		if key(p) == k {
			t.Errorf("a change of %s kept the key", name)
		}
	}
}
