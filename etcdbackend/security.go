package etcdbackend

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
)

// TLSFiles names the PEM files of a client TLS configuration for etcd, as etcdctl's
// --cacert, --cert, --key and --server-name flags do.
type TLSFiles struct {
	// CA holds the certificates of the CAs that sign the etcd members' server certificates.
	// Empty means the system's root CAs.
	CA string
	// Cert and Key are the client certificate and its private key, presented to members that
	// run with --client-cert-auth. Both or neither.
	Cert, Key string
	// ServerName is the name the members' certificates must be valid for. Empty means the
	// host of the endpoint dialled.
	ServerName string
}

// LoadTLS checks the files and returns the client TLS configuration, and the bytes of the
// CA file (so that a caller can notice when they change). Its errors name the field that
// is wrong, as the leader app's JSON spells it: tls.ca, tls.cert, tls.key.
//
// The configuration comes from etcd's own transport.TLSInfo, whose client configuration
// reads the client certificate and key again on every handshake: a certificate rotated in
// place (cert-manager, Vault PKI) is presented on the next connection, without a reload.
// Their contents are therefore not returned: they say nothing about which candidacy this
// is. The CA is read once, here.
func LoadTLS(f TLSFiles) (*tls.Config, []byte, error) {
	if err := f.Check(); err != nil {
		return nil, nil, err
	}
	var ca []byte
	if f.CA != "" {
		pem, err := os.ReadFile(f.CA)
		if err != nil {
			return nil, nil, fmt.Errorf("tls.ca: cannot read the CA file: %v", err)
		}
		if !x509.NewCertPool().AppendCertsFromPEM(pem) {
			return nil, nil, fmt.Errorf("tls.ca: %s holds no PEM-encoded certificate", f.CA)
		}
		ca = pem
	}
	if f.Cert != "" {
		if err := checkKeyPair(f); err != nil {
			return nil, nil, err
		}
	}
	info := transport.TLSInfo{CertFile: f.Cert, KeyFile: f.Key, TrustedCAFile: f.CA, ServerName: f.ServerName}
	cfg, err := info.ClientConfig()
	if err != nil {
		return nil, nil, fmt.Errorf("tls: %v", err)
	}
	cfg.MinVersion = tls.VersionTLS12
	cfg.ServerName = f.ServerName
	return cfg, ca, nil
}

// checkKeyPair reads the client certificate and key once, so that a wrong file is reported
// by field when the config loads rather than at the first handshake.
func checkKeyPair(f TLSFiles) error {
	certPEM, err := os.ReadFile(f.Cert)
	if err != nil {
		return fmt.Errorf("tls.cert: cannot read the client certificate: %v", err)
	}
	keyPEM, err := os.ReadFile(f.Key)
	if err != nil {
		return fmt.Errorf("tls.key: cannot read the private key: %v", err)
	}
	// X509KeyPair's errors never quote the key itself.
	if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
		return fmt.Errorf("tls.cert: %s with key %s: %v", f.Cert, f.Key, err)
	}
	return nil
}

// Check reports a client certificate without its key, or a key without its certificate,
// without reading any file.
func (f TLSFiles) Check() error {
	switch {
	case f.Cert != "" && f.Key == "":
		return errors.New("tls.key: the client certificate (tls.cert) needs its private key")
	case f.Key != "" && f.Cert == "":
		return errors.New("tls.cert: the private key (tls.key) needs its client certificate")
	}
	return nil
}

// CheckSecurity reports endpoints and credentials that cannot work together. withTLS says
// whether a TLS configuration is given. Its errors name the field, as the leader app's JSON
// spells it.
//
// etcd's client would ignore a TLS configuration for http:// endpoints and connect in plain
// text, so that is refused.
func CheckSecurity(endpoints []string, withTLS bool, username, password string) error {
	switch plain := firstWithScheme(endpoints, "http://"); {
	case plain != "" && withTLS:
		return fmt.Errorf("tls: endpoint %q is plain http://; write https:// or host:port to connect with TLS", plain)
	case password != "" && username == "":
		return errors.New("password: set without a username")
	case username != "" && password == "":
		return fmt.Errorf("password: user %q has no password; etcd's client only logs in with both (to authenticate by client certificate, leave username out)", username)
	}
	return nil
}

// CheckSchemes reports endpoints that mix http:// and https://. etcd's client dials every
// endpoint with the scheme of the first one, so with both, some endpoints could never be
// reached.
func CheckSchemes(endpoints []string) error {
	plain, secure := firstWithScheme(endpoints, "http://"), firstWithScheme(endpoints, "https://")
	if plain != "" && secure != "" {
		return fmt.Errorf("endpoints: %q and %q mix http:// and https://; the etcd client dials every endpoint with the first one's scheme, so use one scheme (or host:port, which follows tls)", plain, secure)
	}
	return nil
}

func firstWithScheme(endpoints []string, scheme string) string {
	for _, ep := range endpoints {
		if strings.HasPrefix(ep, scheme) {
			return ep
		}
	}
	return ""
}

// effectiveTLS is the TLS configuration the client uses: the given one, or for https://
// endpoints without one, TLS with the system's root CAs.
func effectiveTLS(cfg Config) *tls.Config {
	if cfg.TLS != nil {
		return cfg.TLS
	}
	for _, ep := range cfg.Endpoints {
		if strings.HasPrefix(ep, "https://") {
			return &tls.Config{MinVersion: tls.VersionTLS12}
		}
	}
	return nil
}

// tlsCredentials is gRPC's TLS transport with two additions. It remembers why the last
// connection failed its TLS handshake, because gRPC reports only "context deadline
// exceeded" to a request that waited for a connection. And it verifies the server name
// given in the TLS configuration, which gRPC would replace with the endpoint's host.
type tlsCredentials struct {
	credentials.TransportCredentials
	serverName string
	failure    *tlsFailureLog
}

// tlsFailureLog holds the reason the newest TLS connection failed; "" once one works.
type tlsFailureLog struct {
	mu     sync.Mutex
	reason string
}

func (l *tlsFailureLog) set(reason string) {
	l.mu.Lock()
	l.reason = reason
	l.mu.Unlock()
}

func (l *tlsFailureLog) get() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.reason
}

func newTLSCredentials(cfg *tls.Config, failure *tlsFailureLog) credentials.TransportCredentials {
	return &tlsCredentials{
		TransportCredentials: credentials.NewTLS(cfg),
		serverName:           cfg.ServerName,
		failure:              failure,
	}
}

func (c *tlsCredentials) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	if c.serverName != "" {
		authority = c.serverName
	}
	conn, info, err := c.TransportCredentials.ClientHandshake(ctx, authority, raw)
	if err != nil {
		if ctx.Err() == nil {
			c.failure.set(fmt.Sprintf("with %s: %v", raw.RemoteAddr(), err))
		}
		return nil, nil, err
	}
	return &firstReadConn{Conn: conn, failure: c.failure}, info, nil
}

func (c *tlsCredentials) Clone() credentials.TransportCredentials {
	return &tlsCredentials{TransportCredentials: c.TransportCredentials.Clone(), serverName: c.serverName, failure: c.failure}
}

// firstReadConn reports how the first read after the handshake went. With TLS 1.3 a member
// that rejects the client certificate says so only then, with an alert.
type firstReadConn struct {
	net.Conn
	failure *tlsFailureLog
	once    sync.Once
}

func (c *firstReadConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.once.Do(func() {
		switch {
		case err == nil:
			c.failure.set("")
		case strings.Contains(err.Error(), "remote error: tls: "):
			c.failure.set(fmt.Sprintf("with %s: %v (the etcd member rejected the client certificate: check tls.cert, tls.key and the members' --trusted-ca-file)", c.RemoteAddr(), err))
		}
	})
	return n, err
}

// dialOptions are the gRPC options that put tlsCredentials in place of the etcd client's.
func (b *Backend) dialOptions() []grpc.DialOption {
	if b.tls == nil {
		return nil
	}
	return []grpc.DialOption{grpc.WithTransportCredentials(newTLSCredentials(b.tls, &b.tlsFailure))}
}

// describedError says what went wrong in words an operator can act on, and still unwraps
// to the etcd client's error.
type describedError struct {
	msg string
	err error
}

func (e *describedError) Error() string { return e.msg }
func (e *describedError) Unwrap() error { return e.err }

// describe turns the etcd client's authentication and TLS errors into ones that name the
// cause; other errors pass unchanged. It never includes the password.
func (b *Backend) describe(err error) error {
	if err == nil {
		return nil
	}
	var done *describedError
	if errors.As(err, &done) {
		return err
	}
	user := b.cfg.Username
	switch etcdErr := rpctypes.Error(err); {
	case errors.Is(etcdErr, rpctypes.ErrAuthFailed):
		return &describedError{fmt.Sprintf("etcd authentication failed for user %q: wrong user name or password (%v)", user, etcdErr), err}
	case errors.Is(etcdErr, rpctypes.ErrPermissionDenied):
		who := "this client"
		if user != "" {
			who = fmt.Sprintf("user %q", user)
		}
		return &describedError{fmt.Sprintf("etcd denied %s access to keys under %q: grant its role readwrite on that prefix (%v)", who, b.cfg.Prefix, etcdErr), err}
	case user == "" && (errors.Is(etcdErr, rpctypes.ErrUserEmpty) || errors.Is(etcdErr, rpctypes.ErrInvalidAuthToken)):
		return &describedError{fmt.Sprintf("etcd requires authentication: set username and password (%v)", etcdErr), err}
	}
	if reason := b.tlsFailure.get(); reason != "" && waitedForConnection(err) {
		return &describedError{fmt.Sprintf("etcd TLS handshake failed: %s (%v)", reason, err), err}
	}
	return err
}

// waitedForConnection reports whether err is what a request gets when no connection to etcd
// could be made: its deadline passed while it waited, or the transport was unavailable.
func waitedForConnection(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	s, ok := status.FromError(err)
	return ok && (s.Code() == codes.DeadlineExceeded || s.Code() == codes.Unavailable)
}
