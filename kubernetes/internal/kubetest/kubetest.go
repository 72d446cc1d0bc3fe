// Package kubetest runs a real kube-apiserver on 127.0.0.1, on an etcd of its own, for tests.
package kubetest

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
	"github.com/caddyleader/caddy-leader/internal/testkit/freeport"
)

// Options change the API server Start runs.
type Options struct {
	// RBAC, if set, authorizes requests by RBAC instead of allowing everything. The admin
	// token (Server.Kubeconfig) is in system:masters either way.
	RBAC bool
}

// Server is a running kube-apiserver and its etcd.
type Server struct {
	// URL is the API server's https:// address.
	URL string
	// Etcd is the API server's storage.
	Etcd *etcdtest.Cluster

	dir, bin string
	args     []string
	tokens   map[string]string // user -> token

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has exited
}

// Start builds (once, see Build) and starts a kube-apiserver with its own etcd, and returns
// once it is ready. Without a binary it fails the test under CI=true and skips it
// elsewhere. t.Cleanup stops both. With -short (the quick tier of tests) it skips the test
// instead: a real store is for the full run.
func Start(t testing.TB, o Options) *Server {
	t.Helper()
	if testing.Short() {
		t.Skip("kubetest: starts a kube-apiserver; skipped with -short")
	}
	bin, err := Build()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("kubetest: %v", err)
		}
		t.Skipf("kubetest: no kube-apiserver (set KUBE_APISERVER or let the build finish): %v", err)
	}
	s := &Server{Etcd: etcdtest.Start(t, 1), dir: t.TempDir(), bin: bin, tokens: map[string]string{}}
	port := freeport.MustPick(t, 1)[0]
	s.URL = fmt.Sprintf("https://127.0.0.1:%d", port)
	for _, user := range []string{"admin", "caddy", "nobody"} {
		var b [16]byte
		rand.Read(b[:])
		s.tokens[user] = hex.EncodeToString(b[:])
	}
	tokens := fmt.Sprintf("%s,admin,admin,\"system:masters\"\n%s,caddy,caddy\n%s,nobody,nobody\n", s.tokens["admin"], s.tokens["caddy"], s.tokens["nobody"])
	s.write(t, "tokens.csv", tokens)
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	s.write(t, "sa.key", string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})))
	pub, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	s.write(t, "sa.pub", string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub})))
	authz := "AlwaysAllow"
	if o.RBAC {
		authz = "RBAC"
	}
	s.args = []string{
		"--etcd-servers=" + strings.Join(s.Etcd.Endpoints(), ","),
		fmt.Sprintf("--secure-port=%d", port),
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--cert-dir=" + filepath.Join(s.dir, "certs"),
		"--token-auth-file=" + filepath.Join(s.dir, "tokens.csv"),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + filepath.Join(s.dir, "sa.pub"),
		"--service-account-signing-key-file=" + filepath.Join(s.dir, "sa.key"),
		"--service-cluster-ip-range=10.0.0.0/24",
		"--authorization-mode=" + authz,
		"--endpoint-reconciler-type=none",
		"--anonymous-auth=false",
		"--profiling=false",
		"--enable-priority-and-fairness=false",
		"--v=0",
	}
	s.Start(t)
	t.Cleanup(func() { s.Stop(t) })
	return s
}

func (s *Server) write(t testing.TB, name, text string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(s.dir, name), []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
}

// Start starts the API server (again, after Stop) and waits until it is ready.
func (s *Server) Start(t testing.TB) {
	t.Helper()
	log, err := os.OpenFile(filepath.Join(s.dir, "kube-apiserver.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	cmd := exec.Command(s.bin, s.args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("kubetest: start kube-apiserver: %v", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	s.mu.Lock()
	s.cmd, s.exited = cmd, exited
	s.mu.Unlock()
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		req, _ := http.NewRequest("GET", s.URL+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+s.tokens["admin"])
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 && s.namespaceReady(t) {
				return
			}
		}
		select {
		case <-exited:
			t.Fatalf("kubetest: kube-apiserver exited during start; log:\n%s", s.tail())
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("kubetest: kube-apiserver not ready within 2m; log:\n%s", s.tail())
		}
	}
}

// namespaceReady reports whether the default namespace exists: the API server creates it
// shortly after it reports ready.
func (s *Server) namespaceReady(t testing.TB) bool {
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	req, _ := http.NewRequest("GET", s.URL+"/api/v1/namespaces/default", nil)
	req.Header.Set("Authorization", "Bearer "+s.tokens["admin"])
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == 200
}

func (s *Server) tail() string {
	data, _ := os.ReadFile(filepath.Join(s.dir, "kube-apiserver.log"))
	if len(data) > 4000 {
		data = data[len(data)-4000:]
	}
	return string(data)
}

// Stop stops the API server (SIGTERM, then SIGKILL after 10s) and waits for it to exit.
func (s *Server) Stop(t testing.TB) {
	s.mu.Lock()
	cmd, done := s.cmd, s.exited
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		<-done
	}
}

// Kubeconfig writes a kubeconfig file for user ("admin", in system:masters; "caddy" or
// "nobody", with no rights unless given some) in namespace ns, reaching the API server at
// server (s.URL, or a proxy in front of it), and returns its path.
func (s *Server) Kubeconfig(t testing.TB, user, ns, server string) string {
	t.Helper()
	if server == "" {
		server = s.URL
	}
	token, ok := s.tokens[user]
	if !ok {
		t.Fatalf("kubetest: no user %q", user)
	}
	text := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: %s
    insecure-skip-tls-verify: true
users:
- name: %s
  user:
    token: %s
contexts:
- name: test
  context:
    cluster: test
    user: %s
    namespace: %s
current-context: test
`, server, user, token, user, ns)
	path := filepath.Join(t.TempDir(), user+".kubeconfig")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// Token returns user's bearer token.
func (s *Server) Token(user string) string { return s.tokens[user] }
