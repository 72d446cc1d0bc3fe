package caddyleader

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
	"github.com/caddyleader/caddy-leader/internal/testkit/faultproxy"
)

// TestClientCertificateRotation renews the leader's client certificate in place, as
// cert-manager or Vault's PKI do, against a real etcd that requires client certificates:
// the old certificate is revoked, so etcd refuses it in every new handshake, and every
// connection is then cut. The leader reconnects with the new certificate without a reload
// and keeps its term (the same fencing token); a reload afterwards keeps the candidacy too.
func TestClientCertificateRotation(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and Caddy")
	}
	certs := etcdtest.NewCerts(t)
	cluster := etcdtest.StartWith(t, 1, etcdtest.Options{TLS: certs, ClientCertAuth: true})
	link, err := faultproxy.New(strings.TrimPrefix(cluster.Endpoint(0), "https://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = link.Close() })

	dir := t.TempDir()
	cert, key := filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	oldCert, oldKey := certs.ClientCert(t, "rotating-node-v1")
	replaceFile(t, oldCert, cert)
	replaceFile(t, oldKey, key)

	raw, err := json.Marshal(leaderConfig(t, App{
		EtcdStore: EtcdStore{
			Endpoints: []string{"https://" + link.Addr()},
			Prefix:    "/rotation-test/",
			TLS:       &EtcdTLS{CA: certs.CAFile, Cert: cert, Key: key},
		},
		TTL:        caddy.Duration(5 * time.Second),
		InstanceID: "rotating-node",
		Elections:  []string{"rotation"},
	}))
	if err != nil {
		t.Fatal(err)
	}
	if err := caddy.Load(raw, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	app := runningApp(t)
	election := app.elections["rotation"]
	waitUntil(t, "the instance leads", func() bool { _, ok := election.Check(); return ok })
	token := election.Term().Token

	newCert, newKey := certs.ClientCert(t, "rotating-node-v2")
	replaceFile(t, newKey, key)
	replaceFile(t, newCert, cert)
	certs.Revoke(t, oldCert)
	link.Reset()
	cut := time.Now()
	waitUntil(t, "etcd confirms the lease over a new connection", func() bool { return app.candidate.LastContact().After(cut) })

	if term, ok := election.Check(); !ok || term.Token != token {
		t.Fatalf("after the rotation: leading %v with token %d; want leading with token %d", ok, term.Token, token)
	}
	if err := caddy.Load(raw, true); err != nil {
		t.Fatal(err)
	}
	if again := runningApp(t); again.candidate != app.candidate {
		t.Fatal("a reload after the rotation started a new candidacy")
	}
	if term, ok := election.Check(); !ok || term.Token != token {
		t.Fatalf("after the reload: leading %v with token %d; want leading with token %d", ok, term.Token, token)
	}
}

// replaceFile puts a copy of from at to in one step (a rename), as a certificate manager
// does, so that no reader ever sees half a file.
func replaceFile(t *testing.T, from, to string) {
	t.Helper()
	tmp := to + ".new"
	copyFile(t, from, tmp)
	if err := os.Rename(tmp, to); err != nil {
		t.Fatal(err)
	}
}
