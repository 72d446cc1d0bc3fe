package etcdbackend

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
	"github.com/caddyleader/caddy-leader/internal/testkit/faultproxy"
	fleetpkg "github.com/caddyleader/caddy-leader/internal/testkit/fleet"
)

const (
	secureUser     = "caddy"
	securePassword = "correct-horse-battery-staple"
	rootPassword   = "root-secret"
	// secureTTL keeps the tests short: failure shows within a few seconds.
	secureTTL = 3 * time.Second
)

// recordingBackend counts lease grants and keeps the newest error a request returned, to
// show that the elector keeps retrying and what it was told.
type recordingBackend struct {
	*Backend
	grants atomic.Int64

	mu      sync.Mutex
	lastErr error
}

func (r *recordingBackend) Grant(ctx context.Context, ttl time.Duration) (elector.LeaseID, time.Duration, error) {
	r.grants.Add(1)
	id, granted, err := r.Backend.Grant(ctx, ttl)
	if err != nil {
		r.mu.Lock()
		r.lastErr = err
		r.mu.Unlock()
	}
	return id, granted, err
}

func (r *recordingBackend) err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastErr
}

// secureNode is a candidate in election "default" whose logs are kept for inspection.
type secureNode struct {
	cand     *elector.Candidate
	election *elector.Election
	backend  *recordingBackend
	logs     *observer.ObservedLogs
}

func (n *secureNode) leading() bool {
	_, ok := n.election.Check()
	return ok
}

func startSecureNode(t *testing.T, id string, ttl time.Duration, cfg Config) *secureNode {
	t.Helper()
	cfg.Prefix = testPrefix
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 2 * time.Second
	}
	core, logs := observer.New(zapcore.DebugLevel)
	logger := zap.New(zapcore.NewTee(core, zaptest.NewLogger(t).Core())).Named(id)
	cfg.Logger = logger.Named("etcd")
	b, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	n := &secureNode{backend: &recordingBackend{Backend: b}, logs: logs}
	cand, es := fleetpkg.StartCandidate(t, elector.Config{
		ID:           id,
		URL:          "http://" + id + ".test:8080",
		TTL:          ttl,
		DrainTimeout: time.Second,
		Backend:      n.backend,
		Logger:       logger,
	}, "default")
	n.cand, n.election = cand, es[0]
	return n
}

func (n *secureNode) close(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = n.cand.Close(ctx)
}

func waitLeading(t *testing.T, n *secureNode, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !n.leading() {
		if time.Now().After(deadline) {
			t.Fatalf("not leader within %s; last error: %v", within, n.backend.err())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// wantFailClosed watches n for d: it must never lead, and must keep asking etcd for a
// lease. It returns the error the elector was last given.
func wantFailClosed(t *testing.T, n *secureNode, d time.Duration) error {
	t.Helper()
	start := n.backend.grants.Load()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if n.leading() {
			t.Fatal("admitted as leader although etcd refuses it")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if tries := n.backend.grants.Load() - start; tries < 2 {
		t.Errorf("%d lease requests in %s; want the elector to keep retrying", tries, d)
	}
	if n.cand.LeaseRemaining() != 0 {
		t.Error("holds a lease although every request fails")
	}
	err := n.backend.err()
	if err == nil {
		t.Fatal("no request failed")
	}
	return err
}

// wantWarned checks that a WARN, the elector's or the backend's, says what is wrong.
func wantWarned(t *testing.T, n *secureNode, wants ...string) {
	t.Helper()
	warns := n.logs.FilterLevelExact(zapcore.WarnLevel).All()
	for _, w := range warns {
		text, _ := w.ContextMap()["error"].(string)
		found := true
		for _, want := range wants {
			found = found && strings.Contains(text, want)
		}
		if found {
			return
		}
	}
	for _, w := range warns {
		t.Logf("WARN %s: %v", w.Message, w.ContextMap()["error"])
	}
	t.Errorf("no WARN (of %d) mentions all of %q", len(warns), wants)
}

// wantNoSecret fails if any log line or the last error holds secret.
func wantNoSecret(t *testing.T, n *secureNode, secret string) {
	t.Helper()
	for _, e := range n.logs.All() {
		if strings.Contains(e.Message, secret) {
			t.Errorf("log message %q holds the password", e.Message)
		}
		for k, v := range e.ContextMap() {
			if s, ok := v.(string); ok && strings.Contains(s, secret) {
				t.Errorf("log field %s=%q holds the password", k, s)
			}
		}
	}
	if err := n.backend.err(); err != nil && strings.Contains(err.Error(), secret) {
		t.Errorf("error %q holds the password", err)
	}
}

func mustLoadTLS(t *testing.T, f TLSFiles) *Config {
	t.Helper()
	cfg, _, err := LoadTLS(f)
	if err != nil {
		t.Fatalf("LoadTLS: %v", err)
	}
	return &Config{TLS: cfg}
}

// TestSecureEtcd runs candidates against real etcd clusters that serve clients over TLS
// with client certificates required, or have authentication enabled, or both.
func TestSecureEtcd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd clusters")
	}
	certs := etcdtest.NewCerts(t)
	otherCA := etcdtest.NewCerts(t) // a CA that signed nothing the cluster uses
	goodFiles := TLSFiles{CA: certs.CAFile, Cert: certs.ClientCertFile, Key: certs.ClientKeyFile}

	t.Run("tls", func(t *testing.T) {
		t.Parallel()
		cluster := etcdtest.StartWith(t, 1, etcdtest.Options{TLS: certs, ClientCertAuth: true})

		t.Run("client_certificate_becomes_leader", func(t *testing.T) {
			cfg := mustLoadTLS(t, goodFiles)
			cfg.Endpoints = cluster.Endpoints()
			n := startSecureNode(t, "tls-node", secureTTL, *cfg)
			waitLeading(t, n, 10*time.Second)
		})

		t.Run("host_port_endpoints_use_tls", func(t *testing.T) {
			cfg := mustLoadTLS(t, goodFiles)
			cfg.Endpoints = []string{strings.TrimPrefix(cluster.Endpoint(0), "https://")}
			n := startSecureNode(t, "tls-hostport-node", secureTTL, *cfg)
			waitLeading(t, n, 10*time.Second)
		})

		t.Run("wrong_ca_fails_closed_then_fixed_config_leads", func(t *testing.T) {
			cfg := mustLoadTLS(t, TLSFiles{CA: otherCA.CAFile, Cert: certs.ClientCertFile, Key: certs.ClientKeyFile})
			cfg.Endpoints = cluster.Endpoints()
			bad := startSecureNode(t, "wrong-ca-node", secureTTL, *cfg)
			err := wantFailClosed(t, bad, 4*time.Second)
			for _, want := range []string{"etcd TLS handshake failed", "certificate signed by unknown authority"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not mention %q", err, want)
				}
			}
			wantWarned(t, bad, "etcd TLS handshake failed", "certificate signed by unknown authority")
			bad.close(t)

			// A reload with the right CA makes a new backend.
			fixed := mustLoadTLS(t, goodFiles)
			fixed.Endpoints = cluster.Endpoints()
			good := startSecureNode(t, "wrong-ca-node", secureTTL, *fixed)
			waitLeading(t, good, 10*time.Second)
		})

		t.Run("missing_client_certificate_is_named", func(t *testing.T) {
			cfg := mustLoadTLS(t, TLSFiles{CA: certs.CAFile})
			cfg.Endpoints = cluster.Endpoints()
			n := startSecureNode(t, "no-cert-node", secureTTL, *cfg)
			err := wantFailClosed(t, n, 3*time.Second)
			for _, want := range []string{"etcd TLS handshake failed", "certificate required", "rejected the client certificate"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not mention %q", err, want)
				}
			}
		})

		t.Run("server_name_is_verified", func(t *testing.T) {
			files := goodFiles
			files.ServerName = "etcd.example"
			cfg := mustLoadTLS(t, files)
			cfg.Endpoints = cluster.Endpoints()
			n := startSecureNode(t, "server-name-node", secureTTL, *cfg)
			err := wantFailClosed(t, n, 3*time.Second)
			if !strings.Contains(err.Error(), "not etcd.example") {
				t.Errorf("error %q does not say the certificate is not valid for etcd.example", err)
			}

			files.ServerName = "localhost" // in the server certificate, unlike the endpoints' 127.0.0.1
			cfg = mustLoadTLS(t, files)
			cfg.Endpoints = cluster.Endpoints()
			n = startSecureNode(t, "server-name-node-2", secureTTL, *cfg)
			waitLeading(t, n, 10*time.Second)
		})

		t.Run("plain_client_gets_no_leadership", func(t *testing.T) {
			n := startSecureNode(t, "plain-node", secureTTL, Config{Endpoints: []string{strings.TrimPrefix(cluster.Endpoint(0), "https://")}})
			wantFailClosed(t, n, 3*time.Second)
		})
	})

	t.Run("auth", func(t *testing.T) {
		t.Parallel()
		cluster := etcdtest.StartWith(t, 1, etcdtest.Options{RootPassword: rootPassword})
		cluster.AddUser(t, secureUser, securePassword, testPrefix)
		cluster.AddUser(t, "elsewhere", securePassword, "/not-the-election-prefix/")

		t.Run("password_login_becomes_leader", func(t *testing.T) {
			n := startSecureNode(t, "auth-node", secureTTL, Config{Endpoints: cluster.Endpoints(), Username: secureUser, Password: securePassword})
			waitLeading(t, n, 10*time.Second)
			wantNoSecret(t, n, securePassword)
		})

		t.Run("wrong_password_fails_closed_until_etcd_accepts_it", func(t *testing.T) {
			const typo = "correct-horse-battery-stapel"
			cluster.AddUser(t, "typo-user", securePassword, testPrefix)
			n := startSecureNode(t, "typo-node", secureTTL, Config{Endpoints: cluster.Endpoints(), Username: "typo-user", Password: typo})
			err := wantFailClosed(t, n, 4*time.Second)
			if want := `etcd authentication failed for user "typo-user"`; !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not mention %q", err, want)
			}
			if !errors.Is(err, rpctypes.ErrAuthFailed) {
				t.Errorf("error %v does not unwrap to rpctypes.ErrAuthFailed", err)
			}
			wantWarned(t, n, "etcd authentication failed for user")
			wantNoSecret(t, n, typo)

			// No failed client is kept: once etcd accepts the password, the same
			// backend's next try logs in.
			cluster.ChangePassword(t, "typo-user", typo)
			waitLeading(t, n, 10*time.Second)
		})

		t.Run("wrong_password_behind_a_slow_link_is_logged", func(t *testing.T) {
			// A request that gives up before the login's answer comes can only say its
			// deadline passed; the backend logs the reason itself, once.
			proxy, err := faultproxy.New(strings.TrimPrefix(cluster.Endpoint(0), "http://"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { proxy.Close() })
			proxy.Delay(300 * time.Millisecond) // each way: a login takes several round trips
			core, logs := observer.New(zapcore.WarnLevel)
			b, err := New(Config{Endpoints: []string{proxy.URL()}, DialTimeout: 10 * time.Second, Username: secureUser, Password: "wrong", Logger: zap.New(core)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.Close() })
			grant := func(timeout time.Duration) error {
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				defer cancel()
				_, _, err := b.Grant(ctx, 5*time.Second)
				return err
			}
			if err := grant(200 * time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("first grant: got %v, want its deadline to pass while connecting", err)
			}
			deadline := time.Now().Add(15 * time.Second)
			for logs.Len() == 0 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			want := `etcd authentication failed for user "caddy"`
			if got := logs.All(); len(got) != 1 || !strings.Contains(got[0].ContextMap()["error"].(string), want) {
				t.Fatalf("logged %v; want one WARN naming the failed login", got)
			}
			// A request that waits for the answer gets it, and the log is not repeated.
			if err := grant(15 * time.Second); err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("second grant: got %v, want %q", err, want)
			}
			if n := logs.Len(); n != 1 {
				t.Errorf("%d WARNs; want the failure logged once", n)
			}
		})

		t.Run("no_credentials_get_no_leadership", func(t *testing.T) {
			n := startSecureNode(t, "anonymous-node", secureTTL, Config{Endpoints: cluster.Endpoints()})
			// etcd grants leases to anyone; the campaign is what it refuses.
			deadline := time.Now().Add(3 * time.Second)
			for time.Now().Before(deadline) {
				if n.leading() {
					t.Fatal("leads without logging in to an etcd with authentication on")
				}
				time.Sleep(10 * time.Millisecond)
			}
			wantWarned(t, n, "etcd requires authentication: set username and password")
		})

		t.Run("user_without_permission_on_prefix_is_named", func(t *testing.T) {
			n := startSecureNode(t, "elsewhere-node", secureTTL, Config{Endpoints: cluster.Endpoints(), Username: "elsewhere", Password: securePassword})
			deadline := time.Now().Add(3 * time.Second)
			for time.Now().Before(deadline) {
				if n.leading() {
					t.Fatal("leads without permission on the election key")
				}
				time.Sleep(10 * time.Millisecond)
			}
			wantWarned(t, n, `etcd denied user "elsewhere" access to keys under "`+testPrefix+`"`)
		})
	})

	t.Run("tls_and_auth", func(t *testing.T) {
		t.Parallel()
		cluster := etcdtest.StartWith(t, 1, etcdtest.Options{TLS: certs, ClientCertAuth: true, RootPassword: rootPassword})
		cluster.AddUser(t, secureUser, securePassword, testPrefix)

		t.Run("client_certificate_and_password_become_leader", func(t *testing.T) {
			cfg := mustLoadTLS(t, goodFiles)
			cfg.Endpoints = cluster.Endpoints()
			cfg.Username, cfg.Password = secureUser, securePassword
			n := startSecureNode(t, "tls-auth-node", secureTTL, *cfg)
			waitLeading(t, n, 10*time.Second)
		})

		t.Run("wrong_ca_with_login_names_tls", func(t *testing.T) {
			// With a username the client logs in while it connects, which waits for a
			// connection that the handshake never gives it.
			cfg := mustLoadTLS(t, TLSFiles{CA: otherCA.CAFile, Cert: certs.ClientCertFile, Key: certs.ClientKeyFile})
			cfg.Endpoints = cluster.Endpoints()
			cfg.Username, cfg.Password = secureUser, securePassword
			n := startSecureNode(t, "wrong-ca-auth-node", secureTTL, *cfg)
			err := wantFailClosed(t, n, 4*time.Second)
			if !strings.Contains(err.Error(), "certificate signed by unknown authority") {
				t.Errorf("error %q does not name the unknown authority", err)
			}
			wantWarned(t, n, "etcd TLS handshake failed", "certificate signed by unknown authority")
			wantNoSecret(t, n, securePassword)
		})

		t.Run("certificate_common_name_as_user", func(t *testing.T) {
			// etcd takes the client certificate's common name as the user of requests
			// without a token: no username or password is needed.
			cluster.AddUser(t, "caddy-by-cert", "unused-password", testPrefix)
			cert, key := certs.ClientCert(t, "caddy-by-cert")
			cfg := mustLoadTLS(t, TLSFiles{CA: certs.CAFile, Cert: cert, Key: key})
			cfg.Endpoints = cluster.Endpoints()
			n := startSecureNode(t, "cn-node", secureTTL, *cfg)
			waitLeading(t, n, 10*time.Second)
		})
	})
}

// TestAuthTokenExpiry holds leadership in an etcd whose auth tokens expire after a second
// unused, across many token lifetimes, then hands over with requests whose token has
// expired: the client must log in again by itself every time.
func TestAuthTokenExpiry(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd clusters")
	}
	const tokenTTL = time.Second // etcd's minimum: it counts in whole seconds
	cluster := etcdtest.StartWith(t, 1, etcdtest.Options{RootPassword: rootPassword, AuthTokenTTL: tokenTTL})
	cluster.AddUser(t, secureUser, securePassword, testPrefix)

	// With a 9s lease, renewals come every 3s: longer than a token lives unused (1s, and
	// etcd sweeps expired tokens every second), so every renewal finds its client's last
	// token expired.
	const ttl = 9 * time.Second
	cfg := Config{Endpoints: cluster.Endpoints(), Username: secureUser, Password: securePassword}
	a := startSecureNode(t, "node-a", ttl, cfg)
	waitLeading(t, a, 10*time.Second)
	b := startSecureNode(t, "node-b", ttl, cfg)
	leaderToken := a.election.Term().Token

	// The premise: a token unused for longer than its TTL is refused.
	probe := newTokenProbe(t, cluster.Endpoint(0))

	const hold = 8 * time.Second
	minRemaining := ttl
	deadline := time.Now().Add(hold)
	for time.Now().Before(deadline) {
		term, ok := a.election.Check()
		if !ok || term.Token != leaderToken {
			t.Fatalf("leadership lost after %s of token expiries: leading=%v token=%d (was %d), reason %q",
				hold-time.Until(deadline), ok, term.Token, leaderToken, term.Reason)
		}
		if b.leading() {
			t.Fatal("the follower leads too")
		}
		minRemaining = min(minRemaining, a.cand.LeaseRemaining())
		time.Sleep(20 * time.Millisecond)
	}
	probe.wantExpired(t)
	// Renewals succeed every 3s, so the lease deadline (9s - 0.9s after each) never comes
	// closer than about 5s; a failing renewal would let it fall towards zero.
	if minRemaining < ttl/3 {
		t.Errorf("lease deadline came within %s: renewals failed", minRemaining)
	}
	for _, n := range []*secureNode{a, b} {
		if warns := n.logs.FilterLevelExact(zapcore.WarnLevel).All(); len(warns) > 0 {
			t.Errorf("etcd requests failed while tokens expired: %s %v", warns[0].Message, warns[0].ContextMap())
		}
	}

	// Hand over while the token of a's last renewal has expired: the release and b's
	// campaign are single requests that meet an expired token.
	waitSinceRenewal(t, a, ttl, 2200*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := a.election.Resign(ctx, time.Minute); err != nil {
		t.Fatalf("resign with an expired token: %v", err)
	}
	deadline = time.Now().Add(5 * time.Second) // well under the 9s lease: a takeover, not an expiry
	for !b.leading() {
		if time.Now().After(deadline) {
			t.Fatalf("follower did not take over after the resign; last error %v", b.backend.err())
		}
		time.Sleep(10 * time.Millisecond)
	}
	wantNoSecret(t, a, securePassword)
}

// waitSinceRenewal waits until n's last lease renewal is at least since ago, judged by its
// lease deadline (set to send time + ttl - ttl/10 on every renewal).
func waitSinceRenewal(t *testing.T, n *secureNode, ttl, since time.Duration) {
	t.Helper()
	full := ttl - ttl/10
	deadline := time.Now().Add(2 * ttl)
	for n.cand.LeaseRemaining() > full-since {
		if time.Now().After(deadline) {
			t.Fatal("the lease deadline did not move as expected")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// tokenProbe holds a token obtained by logging in, unused, to show it expires.
type tokenProbe struct {
	kv    etcdserverpb.KVClient
	token string
}

func newTokenProbe(t *testing.T, endpoint string) *tokenProbe {
	t.Helper()
	conn, err := grpc.NewClient(strings.TrimPrefix(endpoint, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := etcdserverpb.NewAuthClient(conn).Authenticate(ctx, &etcdserverpb.AuthenticateRequest{Name: secureUser, Password: securePassword})
	if err != nil {
		t.Fatalf("authenticate: %v", err)
	}
	p := &tokenProbe{kv: etcdserverpb.NewKVClient(conn), token: resp.Token}
	if err := p.read(); err != nil {
		t.Fatalf("a fresh token is refused: %v", err)
	}
	return p
}

func (p *tokenProbe) read() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, rpctypes.TokenFieldNameGRPC, p.token)
	_, err := p.kv.Range(ctx, &etcdserverpb.RangeRequest{Key: []byte(testPrefix + "probe")})
	return err
}

func (p *tokenProbe) wantExpired(t *testing.T) {
	t.Helper()
	if err := p.read(); !errors.Is(rpctypes.Error(err), rpctypes.ErrInvalidAuthToken) {
		t.Fatalf("a token unused for longer than its TTL: got %v, want %v; the test proves nothing", err, rpctypes.ErrInvalidAuthToken)
	}
}

// TestBackendSecurityChecks covers what New and LoadTLS refuse, without etcd.
func TestBackendSecurityChecks(t *testing.T) {
	certs := etcdtest.NewCerts(t)
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "not-a-ca.pem")
	if err := os.WriteFile(notPEM, []byte("this is no certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	otherCerts := etcdtest.NewCerts(t)

	loadTests := []struct {
		name    string
		files   TLSFiles
		wantErr string
	}{
		{name: "ca_unreadable", files: TLSFiles{CA: filepath.Join(dir, "missing.pem")}, wantErr: "tls.ca: cannot read the CA file"},
		{name: "ca_without_certificate", files: TLSFiles{CA: notPEM}, wantErr: "tls.ca: " + notPEM + " holds no PEM-encoded certificate"},
		{name: "cert_without_key", files: TLSFiles{Cert: certs.ClientCertFile}, wantErr: "tls.key: the client certificate (tls.cert) needs its private key"},
		{name: "key_without_cert", files: TLSFiles{Key: certs.ClientKeyFile}, wantErr: "tls.cert: the private key (tls.key) needs its client certificate"},
		{name: "cert_unreadable", files: TLSFiles{Cert: filepath.Join(dir, "missing.pem"), Key: certs.ClientKeyFile}, wantErr: "tls.cert: cannot read the client certificate"},
		{name: "key_unreadable", files: TLSFiles{Cert: certs.ClientCertFile, Key: filepath.Join(dir, "missing.pem")}, wantErr: "tls.key: cannot read the private key"},
		{name: "key_of_another_certificate", files: TLSFiles{Cert: certs.ClientCertFile, Key: otherCerts.ClientKeyFile}, wantErr: "tls.cert: " + certs.ClientCertFile + " with key"},
	}
	for _, tt := range loadTests {
		t.Run("load/"+tt.name, func(t *testing.T) {
			_, _, err := LoadTLS(tt.files)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("got error %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
	t.Run("load/everything", func(t *testing.T) {
		cfg, read, err := LoadTLS(TLSFiles{CA: certs.CAFile, Cert: certs.ClientCertFile, Key: certs.ClientKeyFile, ServerName: "etcd.internal"})
		if err != nil {
			t.Fatal(err)
		}
		if cfg.RootCAs == nil || cfg.GetClientCertificate == nil || cfg.ServerName != "etcd.internal" || cfg.MinVersion < 0x0303 {
			t.Errorf("config does not carry the files: %+v", cfg)
		}
		ca, err := os.ReadFile(certs.CAFile)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(read, ca) {
			t.Error("the bytes reported read are not the CA file's (and only the CA file's)")
		}
	})
	t.Run("load/client_certificate_is_read_on_each_handshake", func(t *testing.T) {
		cert, key := filepath.Join(dir, "rotating.pem"), filepath.Join(dir, "rotating-key.pem")
		copyFile(t, certs.ClientCertFile, cert)
		copyFile(t, certs.ClientKeyFile, key)
		cfg, _, err := LoadTLS(TLSFiles{CA: certs.CAFile, Cert: cert, Key: key})
		if err != nil {
			t.Fatal(err)
		}
		presented := func() string {
			t.Helper()
			c, err := cfg.GetClientCertificate(&tls.CertificateRequestInfo{})
			if err != nil {
				t.Fatal(err)
			}
			leaf, err := x509.ParseCertificate(c.Certificate[0])
			if err != nil {
				t.Fatal(err)
			}
			return leaf.Subject.CommonName
		}
		if cn := presented(); cn != "etcdtest-client" {
			t.Fatalf("presents %q before the rotation", cn)
		}
		newCert, newKey := certs.ClientCert(t, "rotated")
		copyFile(t, newCert, cert)
		copyFile(t, newKey, key)
		if cn := presented(); cn != "rotated" {
			t.Errorf("presents %q after the files were replaced, want the new certificate's %q", cn, "rotated")
		}
	})

	newTests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{name: "tls_with_http_endpoint", cfg: Config{Endpoints: []string{"http://127.0.0.1:2379"}, TLS: certs.ClientTLS(t)}, wantErr: `tls: endpoint "http://127.0.0.1:2379" is plain http://`},
		{name: "mixed_schemes", cfg: Config{Endpoints: []string{"https://a:2379", "http://b:2379"}}, wantErr: "mix http:// and https://"},
		{name: "password_without_username", cfg: Config{Endpoints: []string{"a:2379"}, Password: "x"}, wantErr: "password: set without a username"},
		{name: "username_without_password", cfg: Config{Endpoints: []string{"a:2379"}, Username: "caddy"}, wantErr: `password: user "caddy" has no password`},
	}
	for _, tt := range newTests {
		t.Run("new/"+tt.name, func(t *testing.T) {
			if _, err := New(tt.cfg); err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("got error %v, want one containing %q", err, tt.wantErr)
			}
		})
	}

	t.Run("new/https_without_tls_uses_system_roots", func(t *testing.T) {
		b, err := New(Config{Endpoints: []string{"https://etcd.example:2379", "etcd2.example:2379"}})
		if err != nil {
			t.Fatal(err)
		}
		if b.tls == nil || b.tls.RootCAs != nil {
			t.Errorf("TLS config %+v; want TLS with the system roots (nil RootCAs)", b.tls)
		}
	})
	t.Run("new/host_port_without_tls_is_plain", func(t *testing.T) {
		b, err := New(Config{Endpoints: []string{"etcd.example:2379"}})
		if err != nil {
			t.Fatal(err)
		}
		if b.tls != nil {
			t.Errorf("TLS config %+v; want none", b.tls)
		}
	})
}

// TestBackendRetriesConnect shows a failed connect is not kept and that a request waits
// no longer than its context for one.
func TestBackendRetriesConnect(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd clusters")
	}
	cluster := etcdtest.StartWith(t, 1, etcdtest.Options{RootPassword: rootPassword})
	cluster.AddUser(t, secureUser, "first", testPrefix)
	b, err := New(Config{Endpoints: cluster.Endpoints(), Prefix: testPrefix, DialTimeout: 2 * time.Second, Username: secureUser, Password: "second"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	grant := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_, _, err := b.Grant(ctx, 5*time.Second)
		return err
	}
	if err := grant(); !errors.Is(err, rpctypes.ErrAuthFailed) {
		t.Fatalf("first grant: got %v, want an authentication failure", err)
	}
	cluster.ChangePassword(t, secureUser, "second")
	if err := grant(); err != nil {
		t.Fatalf("grant after the password was fixed: %v", err)
	}

	t.Run("request_waits_no_longer_than_its_context", func(t *testing.T) {
		// Nothing listens at port 1: with a login, connecting waits for DialTimeout.
		slow, err := New(Config{Endpoints: []string{"127.0.0.1:1"}, DialTimeout: 5 * time.Second, Username: secureUser, Password: "x"})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		start := time.Now()
		if _, _, err := slow.Grant(ctx, 5*time.Second); err == nil {
			t.Fatal("grant against nothing succeeded")
		}
		if waited := time.Since(start); waited > time.Second {
			t.Errorf("grant waited %s for a connect; want about its 200ms deadline", waited)
		}
		start = time.Now()
		if err := slow.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if waited := time.Since(start); waited > time.Second {
			t.Errorf("Close waited %s for the connect in progress; want it ended at once", waited)
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
