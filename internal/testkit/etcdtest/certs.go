package etcdtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// Certs is a test certificate authority with PEM files under a temporary
// directory: the CA certificate, a server certificate for 127.0.0.1 and
// localhost, and a client certificate. Give it to Options.TLS to make a
// cluster serve clients over TLS.
type Certs struct {
	// CAFile is the CA certificate. A client that trusts it trusts the
	// server; a server that trusts it accepts the client certificate.
	CAFile string
	// ServerCertFile and ServerKeyFile are the members' certificate and key.
	ServerCertFile, ServerKeyFile string
	// ClientCertFile and ClientKeyFile are a client certificate with the
	// common name "etcdtest-client", which names no etcd user.
	ClientCertFile, ClientKeyFile string
	// CRLFile is the CA's certificate revocation list, empty until Revoke.
	// The members read it on every client handshake.
	CRLFile string

	dir     string
	ca      *x509.Certificate
	caKey   *ecdsa.PrivateKey
	serial  int64
	mu      sync.Mutex // guards revoked and crlSeq
	revoked []x509.RevocationListEntry
	crlSeq  int64
}

// NewCerts makes a new CA and its server and client certificates, valid
// for an hour. Two calls make two CAs that do not trust each other.
func NewCerts(t testing.TB) *Certs {
	t.Helper()
	c := &Certs{dir: t.TempDir()}
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "etcdtest CA"},
		NotBefore:             time.Now().Add(-time.Minute),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("etcdtest: create CA: %v", err)
	}
	if c.ca, err = x509.ParseCertificate(der); err != nil {
		t.Fatalf("etcdtest: parse CA: %v", err)
	}
	c.caKey = key
	c.serial = 1
	c.CAFile = c.write(t, "ca.pem", "CERTIFICATE", der)
	c.ServerCertFile, c.ServerKeyFile = c.issue(t, "server", "etcdtest-server", x509.ExtKeyUsageServerAuth)
	c.ClientCertFile, c.ClientKeyFile = c.ClientCert(t, "etcdtest-client")
	c.CRLFile = filepath.Join(c.dir, "crl.der")
	c.writeCRL(t)
	return c
}

// Revoke adds the certificate in certFile to the revocation list: from then
// on the members refuse it in every new handshake, while connections made
// with it before stay up.
func (c *Certs) Revoke(t testing.TB, certFile string) {
	t.Helper()
	data, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatalf("etcdtest: revoke: %v", err)
	}
	block, _ := pem.Decode(data)
	if block == nil {
		t.Fatalf("etcdtest: revoke: %s holds no PEM block", certFile)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatalf("etcdtest: revoke: %v", err)
	}
	c.mu.Lock()
	c.revoked = append(c.revoked, x509.RevocationListEntry{SerialNumber: cert.SerialNumber, RevocationTime: time.Now()})
	c.mu.Unlock()
	c.writeCRL(t)
}

// writeCRL writes the revocation list, replacing the file at once so that a
// member never reads half of it.
func (c *Certs) writeCRL(t testing.TB) {
	t.Helper()
	c.mu.Lock()
	c.crlSeq++
	tmpl := &x509.RevocationList{
		Number:                    big.NewInt(c.crlSeq),
		ThisUpdate:                time.Now().Add(-time.Minute),
		NextUpdate:                time.Now().Add(time.Hour),
		RevokedCertificateEntries: append([]x509.RevocationListEntry(nil), c.revoked...),
	}
	c.mu.Unlock()
	der, err := x509.CreateRevocationList(rand.Reader, tmpl, c.ca, c.caKey)
	if err != nil {
		t.Fatalf("etcdtest: create CRL: %v", err)
	}
	// DER, not PEM: etcd parses the file with x509.ParseRevocationList.
	tmp := c.CRLFile + ".tmp"
	if err := os.WriteFile(tmp, der, 0o600); err != nil {
		t.Fatalf("etcdtest: write CRL: %v", err)
	}
	if err := os.Rename(tmp, c.CRLFile); err != nil {
		t.Fatalf("etcdtest: write CRL: %v", err)
	}
}

// ClientCert issues another client certificate with the given common name
// and returns its certificate and key files. With client certificate
// authentication on, etcd takes the common name as the user name of
// requests that carry no auth token.
func (c *Certs) ClientCert(t testing.TB, commonName string) (certFile, keyFile string) {
	t.Helper()
	return c.issue(t, "client-"+commonName, commonName, x509.ExtKeyUsageClientAuth)
}

// ClientTLS is a client TLS configuration that trusts the CA and presents
// the client certificate.
func (c *Certs) ClientTLS(t testing.TB) *tls.Config {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(c.ClientCertFile, c.ClientKeyFile)
	if err != nil {
		t.Fatalf("etcdtest: load client certificate: %v", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(c.ca)
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
}

func (c *Certs) issue(t testing.TB, name, commonName string, usage x509.ExtKeyUsage) (certFile, keyFile string) {
	t.Helper()
	key := newKey(t)
	c.serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(c.serial),
		Subject:      pkix.Name{CommonName: commonName},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}
	if usage == x509.ExtKeyUsageServerAuth {
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
		tmpl.DNSNames = []string{"localhost"}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.ca, &key.PublicKey, c.caKey)
	if err != nil {
		t.Fatalf("etcdtest: issue %s certificate: %v", name, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatalf("etcdtest: marshal %s key: %v", name, err)
	}
	return c.write(t, name+".pem", "CERTIFICATE", der), c.write(t, name+"-key.pem", "PRIVATE KEY", keyDER)
}

func (c *Certs) write(t testing.TB, name, blockType string, der []byte) string {
	t.Helper()
	path := filepath.Join(c.dir, name)
	data := pem.EncodeToMemory(&pem.Block{Type: blockType, Bytes: der})
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatalf("etcdtest: write %s: %v", name, err)
	}
	return path
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("etcdtest: generate key: %v", err)
	}
	return key
}
