package caddyleader

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"encoding/hex"
	"fmt"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddyleader/caddy-leader/etcdbackend"
)

// EtcdTLS is the client side of TLS to etcd, like etcdctl's --cacert, --cert, --key and
// --server-name. An empty one (`"tls": {}`) means TLS with the system's root CAs and no
// client certificate. File names may hold placeholders such as `{env.ETCD_CA}`.
type EtcdTLS struct {
	// CA is the PEM file with the certificates of the CAs that sign the etcd members'
	// server certificates. It replaces the system's root CAs, and must hold at least one
	// certificate. Default: the system's root CAs.
	CA string `json:"ca,omitempty"`

	// Cert is the PEM file with the client certificate to present to etcd members that
	// run with `--client-cert-auth`. It requires key. It is read again, with key, for
	// every new connection to etcd, so a certificate renewed in place (by cert-manager or
	// Vault's PKI, say) is used without a reload and without a new candidacy. Replace
	// both files at once (write new files and rename them over the old ones). Default: no
	// client certificate.
	Cert string `json:"cert,omitempty"`

	// Key is the PEM file with the private key of cert, which requires it. Default: none.
	Key string `json:"key,omitempty"`

	// ServerName is the name the members' server certificates must be valid for, when it
	// is not the host of the endpoints (endpoints given as IP addresses, say). Default:
	// the host of each endpoint.
	ServerName string `json:"server_name,omitempty"`
}

func (t *EtcdTLS) files() etcdbackend.TLSFiles {
	return etcdbackend.TLSFiles{CA: t.CA, Cert: t.Cert, Key: t.Key, ServerName: t.ServerName}
}

// expandSecurity expands the placeholders of tls, username and password. A placeholder
// that comes out empty (an unset variable, a missing file) is an error, not a silent
// anonymous login or a silent fallback to the system's CAs. Unknown placeholders stay as
// written, so a password may contain braces. The replacer's errors name the placeholder,
// never the value it expanded to.
func (s *EtcdStore) expandSecurity(repl *caddy.Replacer) error {
	fields := []struct {
		name string
		val  *string
	}{{"username", &s.Username}, {"password", &s.Password}}
	if t := s.TLS; t != nil {
		fields = append(fields, []struct {
			name string
			val  *string
		}{{"tls.ca", &t.CA}, {"tls.cert", &t.Cert}, {"tls.key", &t.Key}, {"tls.server_name", &t.ServerName}}...)
	}
	for _, f := range fields {
		v, err := repl.ReplaceOrErr(*f.val, true, false)
		if err != nil {
			return fmt.Errorf("%s: %v", f.name, err)
		}
		*f.val = v
	}
	return nil
}

// checkSecurity names the first of tls, username, password and endpoints that cannot work
// with the others, without reading any file.
func (s *EtcdStore) checkSecurity() error {
	if err := s.checkCredentials(); err != nil {
		return err
	}
	return etcdbackend.CheckSchemes(s.Endpoints)
}

// checkCredentials is the part of checkSecurity that the Caddyfile adapter checks too: a
// client certificate without its key or the other way round, a password without a
// username or the other way round, and tls with http:// endpoints.
func (s *EtcdStore) checkCredentials() error {
	if s.TLS != nil {
		if err := s.TLS.files().Check(); err != nil {
			return err
		}
	}
	return etcdbackend.CheckSecurity(s.Endpoints, s.TLS != nil, s.Username, s.Password)
}

// loadSecurity checks the TLS files and returns the etcd client's TLS configuration (nil
// without tls) and a digest of the secrets: the password and the CA file's contents. The
// digest goes into the candidacy's pool key, so that a reload with a new password or CA
// starts a new candidacy, yet the key, which lives as long as the process, holds no secret:
// it is keyed with a random per-process value, so it cannot even be used to test guesses of
// the password. The client certificate and key are left out: the client reads them again on
// every handshake, so a certificate rotated in place needs no new candidacy, and a reload
// after a rotation must not hand leadership over.
func (s *EtcdStore) loadSecurity() (*tls.Config, string, error) {
	var cfg *tls.Config
	var read []byte
	if s.TLS != nil {
		var err error
		if cfg, read, err = etcdbackend.LoadTLS(s.TLS.files()); err != nil {
			return nil, "", err
		}
	}
	return cfg, secretsDigest([]byte(s.Password), read), nil
}

// secretsDigest is the keyed digest of secrets that goes into pool keys (see loadSecurity).
func secretsDigest(secrets ...[]byte) string {
	mac := hmac.New(sha256.New, poolKeySecret)
	for _, b := range secrets {
		_ = binary.Write(mac, binary.BigEndian, uint64(len(b)))
		mac.Write(b)
	}
	return hex.EncodeToString(mac.Sum(nil))
}

// poolKeySecret keys the digest of secrets in pool keys; pool keys live only in this
// process, so a per-process value is enough.
var poolKeySecret = func() []byte {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand since Go 1.24)
	return b
}()
