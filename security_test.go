package caddyleader

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
)

// testSecret stands for a password; no error or pool key may contain it.
const testSecret = "hunter2-but-longer"

func TestAppSecurityProvisionErrors(t *testing.T) {
	certs := etcdtest.NewCerts(t)
	other := etcdtest.NewCerts(t)
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "not-a-ca.pem")
	if err := os.WriteFile(notPEM, []byte("no certificate here\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.pem")
	eps := []string{"https://127.0.0.1:2379"}

	tests := []struct {
		name    string
		app     App
		wantErr string
	}{
		{name: "tls_ca_unreadable", app: App{EtcdStore: EtcdStore{Endpoints: eps, TLS: &EtcdTLS{CA: missing}}}, wantErr: "tls.ca: cannot read the CA file"},
		{name: "tls_ca_without_certificate", app: App{EtcdStore: EtcdStore{Endpoints: eps, TLS: &EtcdTLS{CA: notPEM}}}, wantErr: "tls.ca: " + notPEM + " holds no PEM-encoded certificate"},
		{name: "tls_cert_without_key", app: App{EtcdStore: EtcdStore{Endpoints: eps, TLS: &EtcdTLS{Cert: certs.ClientCertFile}}}, wantErr: "tls.key: the client certificate (tls.cert) needs its private key"},
		{name: "tls_key_without_cert", app: App{EtcdStore: EtcdStore{Endpoints: eps, TLS: &EtcdTLS{Key: certs.ClientKeyFile}}}, wantErr: "tls.cert: the private key (tls.key) needs its client certificate"},
		{name: "tls_key_of_another_certificate", app: App{EtcdStore: EtcdStore{Endpoints: eps, TLS: &EtcdTLS{Cert: certs.ClientCertFile, Key: other.ClientKeyFile}}}, wantErr: "tls.cert: " + certs.ClientCertFile + " with key"},
		{name: "tls_ca_from_unset_env", app: App{EtcdStore: EtcdStore{Endpoints: eps, TLS: &EtcdTLS{CA: "{env.CADDY_LEADER_TEST_UNSET}"}}}, wantErr: "tls.ca: evaluated placeholder {env.CADDY_LEADER_TEST_UNSET} is empty"},
		{name: "tls_with_http_endpoint", app: App{EtcdStore: EtcdStore{Endpoints: []string{"http://127.0.0.1:2379"}, TLS: &EtcdTLS{}}}, wantErr: `tls: endpoint "http://127.0.0.1:2379" is plain http://`},
		{name: "endpoints_mix_schemes", app: App{EtcdStore: EtcdStore{Endpoints: []string{"http://127.0.0.1:2379", "https://127.0.0.1:2380"}}}, wantErr: "endpoints: \"http://127.0.0.1:2379\" and \"https://127.0.0.1:2380\" mix http:// and https://"},
		{name: "password_without_username", app: App{EtcdStore: EtcdStore{Endpoints: eps, Password: testSecret}}, wantErr: "password: set without a username"},
		{name: "username_without_password", app: App{EtcdStore: EtcdStore{Endpoints: eps, Username: "caddy"}}, wantErr: `password: user "caddy" has no password`},
		{name: "password_from_unset_env", app: App{EtcdStore: EtcdStore{Endpoints: eps, Username: "caddy", Password: "{env.CADDY_LEADER_TEST_UNSET}"}}, wantErr: "password: evaluated placeholder {env.CADDY_LEADER_TEST_UNSET} is empty"},
		{name: "password_from_missing_file", app: App{EtcdStore: EtcdStore{Endpoints: eps, Username: "caddy", Password: "{file." + missing + "}"}}, wantErr: "password: evaluated placeholder {file." + missing + "} is empty"},
		{name: "username_from_unset_env", app: App{EtcdStore: EtcdStore{Endpoints: eps, Username: "{env.CADDY_LEADER_TEST_UNSET}", Password: testSecret}}, wantErr: "username: evaluated placeholder {env.CADDY_LEADER_TEST_UNSET} is empty"},
		{name: "bad_ca_with_password", app: App{EtcdStore: EtcdStore{Endpoints: eps, TLS: &EtcdTLS{CA: notPEM}, Username: "caddy", Password: testSecret}}, wantErr: "tls.ca:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// What `caddy validate` and a reload do: provision through Caddy's own path.
			err := caddy.Validate(leaderConfig(t, tt.app))
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("got error %v, want one containing %q", err, tt.wantErr)
			}
			if err != nil && strings.Contains(err.Error(), testSecret) {
				t.Errorf("error %q holds the password", err)
			}
		})
	}
}

// leaderConfig is a Caddy config with only app, and no admin endpoint.
func leaderConfig(t *testing.T, app App) *caddy.Config {
	t.Helper()
	raw, err := json.Marshal(app)
	if err != nil {
		t.Fatal(err)
	}
	return &caddy.Config{
		Admin:   &caddy.AdminConfig{Disabled: true},
		AppsRaw: caddy.ModuleMap{"leader": raw},
	}
}

// TestAppSecurityPlaceholders expands tls, username and password as Provision does:
// {env.*} and {file.*} are read, and a password's other braces are kept.
func TestAppSecurityPlaceholders(t *testing.T) {
	certs := etcdtest.NewCerts(t)
	secretFile := filepath.Join(t.TempDir(), "etcd-password")
	if err := os.WriteFile(secretFile, []byte(testSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("CADDY_LEADER_TEST_CA", certs.CAFile)
	t.Setenv("CADDY_LEADER_TEST_USER", "caddy")

	tests := []struct {
		name         string
		password     string
		wantPassword string
	}{
		{name: "file", password: "{file." + secretFile + "}", wantPassword: testSecret},
		{name: "env_in_the_middle", password: "a{env.CADDY_LEADER_TEST_USER}b", wantPassword: "acaddyb"},
		{name: "literal_braces_kept", password: "p{w}d", wantPassword: "p{w}d"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			app := App{
				EtcdStore: EtcdStore{
					Endpoints: []string{"127.0.0.1:2379"},
					TLS:       &EtcdTLS{CA: "{env.CADDY_LEADER_TEST_CA}", ServerName: "{env.CADDY_LEADER_TEST_USER}.internal"},
					Username:  "{env.CADDY_LEADER_TEST_USER}",
					Password:  tt.password,
				},
			}
			if err := app.expandAndDefault(); err != nil {
				t.Fatal(err)
			}
			if err := app.check(); err != nil {
				t.Fatal(err)
			}
			cfg, _, err := app.loadSecurity()
			if err != nil {
				t.Fatal(err)
			}
			if app.TLS.CA != certs.CAFile || app.TLS.ServerName != "caddy.internal" || app.Username != "caddy" || app.Password != tt.wantPassword {
				t.Errorf("expanded to ca %q, server_name %q, username %q, password %q; want %q, %q, %q, %q",
					app.TLS.CA, app.TLS.ServerName, app.Username, app.Password, certs.CAFile, "caddy.internal", "caddy", tt.wantPassword)
			}
			if cfg == nil || cfg.RootCAs == nil || cfg.ServerName != "caddy.internal" {
				t.Errorf("TLS config %+v does not carry the CA and server name", cfg)
			}
		})
	}
}

// TestAppPoolKeySecurity reloads Caddy in this process: a reload with the same security
// settings keeps the candidacy, one that changes any of them, files' contents included,
// starts a new one, and the pool key never holds the password.
func TestAppPoolKeySecurity(t *testing.T) {
	certs := etcdtest.NewCerts(t)
	other := etcdtest.NewCerts(t)
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	copyFile(t, certs.CAFile, ca)
	base := func() App {
		return App{
			EtcdStore: EtcdStore{
				Endpoints: []string{"https://127.0.0.1:1"},
				TLS:       &EtcdTLS{CA: ca, Cert: certs.ClientCertFile, Key: certs.ClientKeyFile, ServerName: "etcd.internal"},
				Username:  "caddy",
				Password:  testSecret,
			}, // nothing listens: the candidate only retries
			InstanceID: "pool-key-node",
		}
	}
	// load makes app the running config, as a reload does, and returns its provisioned app.
	load := func(t *testing.T, app App) *App {
		t.Helper()
		cfg, err := json.Marshal(leaderConfig(t, app))
		if err != nil {
			t.Fatal(err)
		}
		if err := caddy.Load(cfg, true); err != nil {
			t.Fatalf("load: %v", err)
		}
		running, err := caddy.ActiveContext().App("leader")
		if err != nil {
			t.Fatal(err)
		}
		return running.(*App)
	}
	t.Cleanup(func() { _ = caddy.Stop() })

	first := load(t, base())
	if strings.Contains(first.poolKey, testSecret) {
		t.Fatalf("pool key %q holds the password", first.poolKey)
	}
	if again := load(t, base()); again == first || again.poolKey != first.poolKey || again.candidate != first.candidate {
		t.Fatal("a reload with the same security settings did not keep the candidacy")
	}

	changes := []struct {
		name   string
		change func(a *App)
	}{
		{name: "ca", change: func(a *App) { a.TLS.CA = other.CAFile }},
		{name: "cert_and_key", change: func(a *App) { a.TLS.Cert, a.TLS.Key = other.ClientCertFile, other.ClientKeyFile }},
		{name: "server_name", change: func(a *App) { a.TLS.ServerName = "etcd2.internal" }},
		{name: "no_tls", change: func(a *App) { a.TLS = nil }},
		{name: "username", change: func(a *App) { a.Username = "caddy2" }},
		{name: "password", change: func(a *App) { a.Password = testSecret + "!" }},
		{name: "ca_file_contents", change: func(a *App) { copyFile(t, other.CAFile, ca) }},
	}
	for _, c := range changes {
		t.Run(c.name, func(t *testing.T) {
			t.Cleanup(func() { copyFile(t, certs.CAFile, ca) })
			before := load(t, base())
			changed := base()
			c.change(&changed)
			after := load(t, changed)
			if after.poolKey == before.poolKey || after.candidate == before.candidate {
				t.Errorf("a reload that changed %s kept the candidacy", c.name)
			}
			if strings.Contains(after.poolKey, after.Password) {
				t.Errorf("pool key %q holds the password", after.poolKey)
			}
		})
	}
	// A certificate renewed in place is no new identity: the client reads it again for each
	// connection, and a reload must not hand leadership over.
	t.Run("cert_file_contents_keep_the_candidacy", func(t *testing.T) {
		cert, key := filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
		copyFile(t, certs.ClientCertFile, cert)
		copyFile(t, certs.ClientKeyFile, key)
		withCopies := func() App {
			a := base()
			a.TLS.Cert, a.TLS.Key = cert, key
			return a
		}
		before := load(t, withCopies())
		renewed, renewedKey := certs.ClientCert(t, "pool-key-node")
		copyFile(t, renewed, cert)
		copyFile(t, renewedKey, key)
		if after := load(t, withCopies()); after.poolKey != before.poolKey || after.candidate != before.candidate {
			t.Error("a reload after the client certificate was renewed in place started a new candidacy")
		}
	})
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, data, 0o600); err != nil {
		t.Fatal(err)
	}
}
