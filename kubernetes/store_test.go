package kubernetes

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddyleader/caddy-leader/internal/testkit/goldentest"
)

func TestCaddyfileAdapt(t *testing.T) {
	t.Setenv("HOSTNAME", "node-a")
	goldentest.RunDir(t, "testdata/caddyfile_adapt")
}

func TestProvision(t *testing.T) {
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: secret}}]
contexts: [{name: x, context: {cluster: c, user: u, namespace: web}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("LEADER_NS", "web")
	for _, tc := range []struct {
		name    string
		store   Store
		wantErr string
	}{
		{"defaults", Store{}, ""},
		{"namespace_placeholder", Store{Namespace: "{env.LEADER_NS}"}, ""},
		{"kubeconfig", Store{Kubeconfig: kubeconfig}, ""},
		{"kubeconfig_missing", Store{Kubeconfig: filepath.Join(dir, "none")}, "kubeconfig: open "},
		{"kubeconfig_not_one", Store{Kubeconfig: filepath.Join(dir)}, "kubeconfig: read "},
		{"namespace_upper_case", Store{Namespace: "Web"}, `namespace: "Web" is not a namespace name`},
		{"namespace_empty_placeholder", Store{Namespace: "{env.LEADER_NOT_SET}"}, "namespace: "},
		{"prefix", Store{LeasePrefix: "-x"}, "lease_prefix: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.store
			err := s.Provision(caddy.Context{})
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("Provision: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.wantErr)):
				t.Fatalf("Provision = %v, want an error starting %q", err, tc.wantErr)
			}
		})
	}
}

// TestStoreKey checks that a changed kubeconfig file changes the key without showing it.
func TestStoreKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kubeconfig")
	key := func(token string) string {
		t.Helper()
		text := "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: \"https://127.0.0.1:1\"}}]\n" +
			"users: [{name: u, user: {token: " + token + "}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		s := Store{Kubeconfig: path}
		if err := s.Provision(caddy.Context{}); err != nil {
			t.Fatal(err)
		}
		return s.StoreKey()
	}
	a, b := key("token-one"), key("token-two")
	if a == b {
		t.Error("a new token in the kubeconfig file left the store key as it was")
	}
	if strings.Contains(a+b, "token-") {
		t.Errorf("the store key shows the token: %s", a)
	}
}
