// Package kubernetes is the leader app's store on Kubernetes Lease objects, the
// `leader.stores.kubernetes` module.
package kubernetes

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"

	caddyleader "github.com/caddyleader/caddy-leader"
	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/kubernetes/kubebackend"
)

func init() {
	caddy.RegisterModule(Store{})
}

// Store is the `leader.stores.kubernetes` module: elections in coordination.k8s.io/v1
// Lease objects of one namespace, so that a fleet on Kubernetes needs no etcd or database
// of its own. Each instance's lease is a Lease object it renews; each election is a Lease
// object whose holder names it. A Lease has no expiry of its own: the other instances delete
// one that has not changed for its duration, by their own clocks. The fencing token is the
// API server's etcd revision when the term began, so it rises across a delete and re-create
// of the object. The service account needs get, list, watch, create, update and delete on
// leases in the namespace, nothing else. See docs/kubernetes.md.
type Store struct {
	// Namespace holds the Lease objects. Placeholders such as `{env.POD_NAMESPACE}` are
	// expanded. Default: the pod's own namespace (from its service account), or with
	// kubeconfig the namespace of its current context, else `default`.
	Namespace string `json:"namespace,omitempty"`

	// Kubeconfig is a kubeconfig file to reach the API server with, for an instance that
	// does not run in a pod; its current context picks the cluster and the credentials.
	// Placeholders are expanded. Default: none, the pod's service account (in-cluster
	// credentials: the token, CA and address Kubernetes mounts into every pod).
	Kubeconfig string `json:"kubeconfig,omitempty"`

	// LeasePrefix begins the name of every Lease object the store writes: lower-case
	// letters, digits, `-` and `.` (not first). Election `name` is the object
	// `<lease_prefix><name>-<hash>`, the lease of an instance `<lease_prefix>lease-<id>`.
	// Default: `caddy-leader-`.
	LeasePrefix string `json:"lease_prefix,omitempty"`

	kubeconfig []byte // the kubeconfig file's contents, for StoreKey
}

// CaddyModule returns the Caddy module information.
func (Store) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "leader.stores.kubernetes",
		New: func() caddy.Module { return new(Store) },
	}
}

// Provision implements caddy.Provisioner: it expands placeholders and checks every field,
// without connecting.
func (s *Store) Provision(caddy.Context) error {
	repl := caddy.NewReplacer()
	for _, f := range []struct {
		name string
		val  *string
	}{{"namespace", &s.Namespace}, {"kubeconfig", &s.Kubeconfig}, {"lease_prefix", &s.LeasePrefix}} {
		v, err := repl.ReplaceOrErr(*f.val, true, false)
		if err != nil {
			return fmt.Errorf("%s: %v", f.name, err)
		}
		*f.val = v
	}
	if s.LeasePrefix == "" {
		s.LeasePrefix = kubebackend.DefaultPrefix
	}
	if err := kubebackend.CheckPrefix(s.LeasePrefix); err != nil {
		return fmt.Errorf("lease_prefix: %v", err)
	}
	if err := checkNamespace(s.Namespace); err != nil {
		return fmt.Errorf("namespace: %v", err)
	}
	if s.Kubeconfig != "" {
		data, err := os.ReadFile(s.Kubeconfig)
		if err != nil {
			return fmt.Errorf("kubeconfig: %v", err)
		}
		if _, _, err := kubebackend.RESTConfig(s.Kubeconfig); err != nil {
			return fmt.Errorf("kubeconfig: %v", err)
		}
		s.kubeconfig = data
	}
	return nil
}

// checkNamespace reports whether ns is empty or a DNS label, as namespaces are.
func checkNamespace(ns string) error {
	if len(ns) > 63 {
		return fmt.Errorf("%q is longer than 63 characters", ns)
	}
	for i, r := range ns {
		ok := r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' && i > 0 && i < len(ns)-1
		if !ok {
			return fmt.Errorf("%q is not a namespace name (lower-case letters, digits and '-' inside)", ns)
		}
	}
	return nil
}

func (s *Store) config(logger *zap.Logger) kubebackend.Config {
	return kubebackend.Config{Kubeconfig: s.Kubeconfig, Namespace: s.Namespace, Prefix: s.LeasePrefix, Logger: logger}
}

// StoreKey implements caddyleader.Store. The kubeconfig file, which may hold a token, goes
// in only as a digest.
func (s *Store) StoreKey() string {
	key, _ := json.Marshal([]any{"kubernetes", s.Namespace, s.Kubeconfig, s.LeasePrefix, caddyleader.SecretsDigest(s.kubeconfig)})
	return string(key)
}

// NewBackend implements caddyleader.Store.
func (s *Store) NewBackend(logger *zap.Logger) (elector.Backend, error) {
	return kubebackend.New(s.config(logger.Named("kubernetes")))
}

// UnmarshalCaddyfile sets up the store from the `store kubernetes` block of the leader
// global option:
//
//	store kubernetes {
//		namespace    <namespace>
//		kubeconfig   <file>
//		lease_prefix <prefix>
//	}
func (s *Store) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the store's name
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		opt := d.Val()
		dst := map[string]*string{"namespace": &s.Namespace, "kubeconfig": &s.Kubeconfig, "lease_prefix": &s.LeasePrefix}[opt]
		if dst == nil {
			return d.Errf("unrecognized kubernetes store option %q", opt)
		}
		if *dst != "" {
			return d.Errf("%s: given twice", opt)
		}
		if !d.NextArg() {
			return d.Errf("%s: needs a value", opt)
		}
		*dst = d.Val()
		if d.NextArg() {
			return d.Errf("%s: takes one value", opt)
		}
		if opt == "lease_prefix" {
			if err := kubebackend.CheckPrefix(s.LeasePrefix); err != nil {
				return d.Errf("lease_prefix: %v", err)
			}
		}
	}
	return nil
}

// Interface guards
var (
	_ caddyleader.Store     = (*Store)(nil)
	_ caddy.Provisioner     = (*Store)(nil)
	_ caddyfile.Unmarshaler = (*Store)(nil)
)
