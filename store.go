package caddyleader

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/etcdbackend"
)

func init() {
	caddy.RegisterModule(EtcdStore{})
}

// Store is what a `leader.stores.*` module provides: the coordination store the leader app
// elects through. A plugin adds a store (Consul, a Kubernetes Lease) by registering a module
// in that namespace whose backend passes elector/electortest's conformance suite.
type Store interface {
	// StoreKey identifies the store's settings. A config reload whose store has the same
	// key (and the same ttl, instance_id and advertise) keeps the candidacy: no new lease,
	// no new election. Secrets go in only as a keyed digest (see secretsDigest).
	StoreKey() string
	// NewBackend returns a backend that has not connected yet: creating one must not block
	// (Caddy validates configs by provisioning them).
	NewBackend(logger *zap.Logger) (elector.Backend, error)
}

// EtcdStore is the `leader.stores.etcd` module, the default store: an etcd cluster. Each
// election is one etcd key, `<prefix><election>`, created by a compare-and-swap transaction
// and bound to this instance's lease; its create revision is the term's fencing token. Its
// options may also be set at the top level of the leader app, as before stores existed.
type EtcdStore struct {
	// Endpoints are the etcd client URLs (`http://host:port`, `https://host:port`) or bare
	// `host:port` addresses of the etcd cluster; `http://` and `https://` cannot be mixed.
	// Placeholders such as `{env.ETCD_ENDPOINT}` are expanded. Required: there is no
	// default, and at least one endpoint must be given.
	Endpoints []string `json:"endpoints,omitempty"`

	// Prefix is the etcd key namespace of the elections: election `name` is the key
	// `<prefix>name`. Default: `/caddy-leader/`.
	Prefix string `json:"prefix,omitempty"`

	// DialTimeout bounds establishing a connection to an etcd endpoint. Default: 5s.
	DialTimeout caddy.Duration `json:"dial_timeout,omitempty"`

	// TLS makes the connection to etcd use TLS with the given CA, client certificate and
	// server name. With it, `host:port` endpoints use TLS too, and `http://` endpoints are
	// an error rather than a silent plain-text connection. Without it, `https://` endpoints
	// use TLS with the system's root CAs and no client certificate, and `http://` and
	// `host:port` endpoints connect in plain text. The client certificate and key are
	// read again for every new connection, so a rotated certificate is used without a
	// reload and this instance keeps its leadership. The CA file is read when the config
	// loads; a reload after it changes starts a new candidacy that uses it. Default: none.
	TLS *EtcdTLS `json:"tls,omitempty"`

	// Username is the etcd user to log in as, for an etcd cluster with authentication
	// enabled. The user's role needs readwrite permission on the keys under prefix, and
	// nothing else. It requires password. Placeholders such as `{env.ETCD_USER}` are
	// expanded. Default: no login (etcd can instead take the common name of the client
	// certificate as the user name, when its members run with `--client-cert-auth`).
	Username string `json:"username,omitempty"`

	// Password is the password of username, which it requires. Give a placeholder such as
	// `{env.ETCD_PASSWORD}` or `{file./run/secrets/etcd-password}` rather than the password
	// itself, which anyone who can read Caddy's config (its admin API too) would see; a
	// placeholder that expands to nothing is an error. It is never logged. Default: none.
	Password string `json:"password,omitempty"`

	tlsCfg  *tls.Config // loaded from TLS by provision
	secrets string      // a digest of the password and the TLS files' contents
}

// CaddyModule returns the Caddy module information.
func (EtcdStore) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "leader.stores.etcd",
		New: func() caddy.Module { return new(EtcdStore) },
	}
}

// Provision implements caddy.Provisioner.
func (s *EtcdStore) Provision(caddy.Context) error {
	if err := s.expandAndDefault(); err != nil {
		return err
	}
	if err := s.check(); err != nil {
		return err
	}
	return s.load()
}

// expandAndDefault expands placeholders and fills in defaults.
func (s *EtcdStore) expandAndDefault() error {
	repl := caddy.NewReplacer()
	for i, ep := range s.Endpoints {
		s.Endpoints[i] = repl.ReplaceKnown(ep, "")
	}
	s.Prefix = repl.ReplaceKnown(s.Prefix, "")
	if err := s.expandSecurity(repl); err != nil {
		return err
	}
	if s.Prefix == "" {
		s.Prefix = DefaultPrefix
	}
	if s.DialTimeout == 0 {
		s.DialTimeout = caddy.Duration(DefaultDialTimeout)
	}
	return nil
}

// check names the first field that is wrong and why, without reading any file.
func (s *EtcdStore) check() error {
	if len(s.Endpoints) == 0 {
		return fmt.Errorf("endpoints: at least one etcd endpoint is required")
	}
	for _, ep := range s.Endpoints {
		if err := checkEndpoint(ep); err != nil {
			return fmt.Errorf("endpoints: %v", err)
		}
	}
	if err := checkPrefix(s.Prefix); err != nil {
		return fmt.Errorf("prefix: %v", err)
	}
	if s.DialTimeout < 0 {
		return fmt.Errorf("dial_timeout: %s is negative", time.Duration(s.DialTimeout))
	}
	return s.checkSecurity()
}

// checkPrefix refuses a key prefix that does not end with a slash: the election's name is
// appended to it as it is, so "caddy" would make the key "caddydefault".
func checkPrefix(prefix string) error {
	if !strings.HasSuffix(prefix, "/") {
		return fmt.Errorf("%q does not end with /: the election's name is appended to it (the key would be %q); write %q", prefix, prefix+DefaultElection, prefix+"/")
	}
	return nil
}

// load reads the TLS files.
func (s *EtcdStore) load() error {
	cfg, secrets, err := s.loadSecurity()
	if err != nil {
		return err
	}
	s.tlsCfg, s.secrets = cfg, secrets
	return nil
}

// set reports whether any etcd option is set.
func (s *EtcdStore) set() bool {
	return len(s.Endpoints) > 0 || s.Prefix != "" || s.DialTimeout != 0 || s.TLS != nil || s.Username != "" || s.Password != ""
}

// StoreKey implements Store.
func (s *EtcdStore) StoreKey() string {
	key, _ := json.Marshal([]any{"etcd", s.Endpoints, s.Prefix, s.DialTimeout, s.TLS, s.Username, s.secrets})
	return string(key)
}

// NewBackend implements Store.
func (s *EtcdStore) NewBackend(logger *zap.Logger) (elector.Backend, error) {
	return etcdbackend.New(etcdbackend.Config{
		Endpoints:   s.Endpoints,
		Prefix:      s.Prefix,
		DialTimeout: time.Duration(s.DialTimeout),
		Logger:      logger.Named("etcd"),
		TLS:         s.tlsCfg,
		Username:    s.Username,
		Password:    s.Password,
	})
}

// Interface guards
var (
	_ Store             = (*EtcdStore)(nil)
	_ caddy.Provisioner = (*EtcdStore)(nil)
)
