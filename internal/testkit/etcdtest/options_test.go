package etcdtest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

func TestStartWith(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd clusters")
	}
	certs := NewCerts(t)
	t.Run("tls_with_client_certificates", func(t *testing.T) {
		t.Parallel()
		c := StartWith(t, 1, Options{TLS: certs, ClientCertAuth: true})
		if ep := c.Endpoint(0); !strings.HasPrefix(ep, "https://127.0.0.1:") {
			t.Errorf("Endpoint(0) = %q, want https://127.0.0.1:PORT", ep)
		}
		put(t, c.Client(t), "k", "v")

		// Trusting the CA is not enough: the member wants a client certificate.
		pool := x509.NewCertPool()
		pem, err := os.ReadFile(certs.CAFile)
		if err != nil {
			t.Fatal(err)
		}
		pool.AppendCertsFromPEM(pem)
		wantRefusedRead(t, clientv3.Config{Endpoints: c.Endpoints(), TLS: &tls.Config{RootCAs: pool}})
		// Nor is a certificate from another CA.
		wantRefusedRead(t, clientv3.Config{Endpoints: c.Endpoints(), TLS: NewCerts(t).ClientTLS(t)})

		// A revoked certificate works until Revoke, then no new connection gets through.
		certFile, keyFile := certs.ClientCert(t, "revoked")
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			t.Fatal(err)
		}
		withRevoked := clientv3.Config{Endpoints: c.Endpoints(), TLS: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}}}
		put(t, clientWith(t, withRevoked), "revoked", "not yet")
		certs.Revoke(t, certFile)
		wantRefusedRead(t, withRevoked)

		c.Stop(t, 0)
		c.Restart(t, 0)
		wantGet(t, c.Client(t), "k", "v")
	})

	t.Run("authentication", func(t *testing.T) {
		t.Parallel()
		c := StartWith(t, 1, Options{RootPassword: "root-pw"})
		put(t, c.Client(t), "/app/k", "v") // as root

		anon := clientWith(t, clientv3.Config{Endpoints: c.Endpoints()})
		if _, err := anon.Get(ctxFor(t), "/app/k"); !errors.Is(err, rpctypes.ErrUserEmpty) {
			t.Errorf("anonymous read: got %v, want %v", err, rpctypes.ErrUserEmpty)
		}

		c.AddUser(t, "app", "app-pw", "/app/")
		app := clientWith(t, clientv3.Config{Endpoints: c.Endpoints(), Username: "app", Password: "app-pw"})
		put(t, app, "/app/k", "by app")
		if _, err := app.Put(ctxFor(t), "/other/k", "v"); !errors.Is(err, rpctypes.ErrPermissionDenied) {
			t.Errorf("write outside the user's prefix: got %v, want %v", err, rpctypes.ErrPermissionDenied)
		}

		c.ChangePassword(t, "app", "new-pw")
		if _, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), Username: "app", Password: "app-pw", DialTimeout: 5 * time.Second, Logger: zap.NewNop()}); !errors.Is(err, rpctypes.ErrAuthFailed) {
			t.Errorf("login with the old password: got %v, want %v", err, rpctypes.ErrAuthFailed)
		}

		c.Stop(t, 0)
		c.Restart(t, 0) // readiness is checked as root
		wantGet(t, c.Client(t), "/app/k", "by app")
	})
}

func clientWith(t *testing.T, cfg clientv3.Config) *clientv3.Client {
	t.Helper()
	cfg.DialTimeout = 5 * time.Second
	cfg.Logger = zap.NewNop()
	cli, err := clientv3.New(cfg)
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	t.Cleanup(cancel)
	return ctx
}

// wantRefusedRead checks that a client with cfg gets nothing from the cluster.
func wantRefusedRead(t *testing.T, cfg clientv3.Config) {
	t.Helper()
	cli := clientWith(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := cli.Get(ctx, "k"); err == nil {
		t.Error("read succeeded; want the member to refuse the client")
	}
}
