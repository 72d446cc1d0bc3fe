package kubetest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// Version is the Kubernetes release whose kube-apiserver the tests run.
const Version = "v1.37.2"

// stagingVersion is the version its staging modules (k8s.io/api, ...) are published at.
const stagingVersion = "v0.37.2"

// staging are the modules k8s.io/kubernetes requires at v0.0.0 and replaces with its own
// staging directories; a build outside its repository maps them to their published
// versions instead.
var staging = []string{
	"api", "apiextensions-apiserver", "apimachinery", "apiserver", "cli-runtime", "client-go",
	"cloud-provider", "cluster-bootstrap", "code-generator", "component-base", "component-helpers",
	"controller-manager", "cri-api", "cri-client", "cri-streaming", "csi-translation-lib",
	"dynamic-resource-allocation", "endpointslice", "externaljwt", "kms", "kube-aggregator",
	"kube-controller-manager", "kube-proxy", "kube-scheduler", "kubectl", "kubelet", "metrics",
	"mount-utils", "pod-security-admission", "sample-apiserver", "streaming",
}

// scratchModule is the go.mod of the module kube-apiserver is built in.
func scratchModule() string {
	var b strings.Builder
	fmt.Fprintf(&b, "module kubeapiserverbuild\n\ngo 1.26.0\n\nrequire k8s.io/kubernetes %s\n\nreplace (\n", Version)
	for _, m := range staging {
		fmt.Fprintf(&b, "\tk8s.io/%s => k8s.io/%s %s\n", m, m, stagingVersion)
	}
	b.WriteString(")\n")
	return b.String()
}

const scratchTools = `//go:build tools

package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
`

// BinaryPath is where the built kube-apiserver is cached: outside any checkout, so that
// every clone and every CI run on a machine shares one build. KUBE_APISERVER overrides it.
func BinaryPath() (string, error) {
	if p := os.Getenv("KUBE_APISERVER"); p != "" {
		return p, nil
	}
	dir := os.Getenv("XDG_CACHE_HOME")
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", err
		}
		dir = filepath.Join(home, ".cache")
	}
	return filepath.Join(dir, "caddy-leader", "kube-apiserver-"+Version), nil
}

// Build returns the cached kube-apiserver, building it first from the Go module proxy if
// it is missing (minutes on a small machine). A file lock keeps concurrent test binaries
// from building it twice.
func Build() (string, error) {
	path, err := BinaryPath()
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "", err
	}
	lock, err := os.OpenFile(path+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", err
	}
	if _, err := os.Stat(path); err == nil {
		return path, nil // built by whoever held the lock
	}
	dir, err := os.MkdirTemp("", "kube-apiserver-build")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	for name, text := range map[string]string{"go.mod": scratchModule(), "tools.go": scratchTools} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			return "", err
		}
	}
	tmp := path + ".tmp"
	for _, args := range [][]string{{"mod", "tidy"}, {"build", "-trimpath", "-o", tmp, "k8s.io/kubernetes/cmd/kube-apiserver"}} {
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		// The scratch module is not in a workspace and needs its own go.sum.
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			return "", fmt.Errorf("building kube-apiserver %s: go %s: %v\n%s", Version, strings.Join(args, " "), err, out.Bytes())
		}
	}
	return path, os.Rename(tmp, path)
}
