package caddyleader

// What this package offers the plugin's modules in other packages (the layer-4 modules in
// l4/, the Kubernetes store in kubernetes/) and third-party store modules.

import (
	"github.com/caddyserver/caddy/v2"

	"github.com/caddyleader/caddy-leader/elector"
)

// JoinElection is how a module of another package (the layer-4 modules of
// github.com/caddyleader/caddy-leader/l4) takes part in an election, as this package's own
// handlers and matchers do: it defaults *name to `default` and checks it, finds the leader
// app of the config being provisioned, and joins the election as one of the config's users,
// so that the app campaigns in it and a reload keeps the candidacy. module names the caller
// in errors.
func JoinElection(ctx caddy.Context, module string, name *string) (*elector.Election, error) {
	_, e, err := joinElection(ctx, module, name)
	return e, err
}

// CheckElectionName checks an election name as the leader app does (non-empty, no white
// space, no slash), for the Caddyfile parsers of other packages. Its error leaves the
// field's name to the caller.
func CheckElectionName(name string) error { return checkElectionName(name) }

// SecretsDigest is the keyed digest of secrets (passwords, the contents of key and token
// files) that a Store's StoreKey includes instead of the secrets themselves, for stores in
// other modules: a reload that changes a secret starts a new candidacy, and the key never
// shows a secret. The key lives only in this process.
func SecretsDigest(secrets ...[]byte) string { return secretsDigest(secrets...) }
