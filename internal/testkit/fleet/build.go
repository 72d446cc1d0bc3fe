package fleet

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Packages of this module that build the binaries a fleet runs.
const (
	// CaddyPackage is the root module's Caddy command.
	CaddyPackage     = "github.com/caddyleader/caddy-leader/cmd/caddy"
	etcdLocalPackage = "github.com/caddyleader/caddy-leader/cmd/etcd-local"
)

// BuildCaddy builds the module's Caddy command (cmd/caddy) into out, with the race
// detector if race is set. The go command finds the module from the working directory,
// so it must be inside the module; `go test` runs it with the same toolchain, since it
// puts its own GOROOT/bin first in PATH.
func BuildCaddy(out string, race bool) error {
	return BuildPackage(out, CaddyPackage, race)
}

// BuildPackage builds the command pkg into out, with the race detector if race is set, from
// the module of the working directory (a nested module's tests build its own Caddy).
func BuildPackage(out, pkg string, race bool) error {
	args := []string{"build", "-o", out}
	if race {
		args = append(args, "-race")
	}
	return goBuild(append(args, pkg)...)
}

// BuildEtcdLocal builds the loopback etcd (cmd/etcd-local) into out.
func BuildEtcdLocal(out string) error {
	return goBuild("build", "-o", out, etcdLocalPackage)
}

func goBuild(args ...string) error {
	cmd := exec.Command("go", args...)
	var output bytes.Buffer
	cmd.Stdout, cmd.Stderr = &output, &output
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, output.Bytes())
	}
	return nil
}

// MainWithCaddy is the TestMain of a package of end-to-end tests: unless -short, it builds
// the Caddy command pkg (with the race detector if E2E_CADDY_RACE=1) into a temporary
// directory, sets *bin to it, runs the tests and removes the directory. It returns the
// exit code for os.Exit.
func MainWithCaddy(m *testing.M, pkg string, bin *string) int {
	flag.Parse()
	if testing.Short() {
		return m.Run() // every test skips itself
	}
	dir, err := os.MkdirTemp("", "caddy-leader-e2e-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
		return 1
	}
	defer os.RemoveAll(dir)
	*bin = filepath.Join(dir, "caddy")
	if err := BuildPackage(*bin, pkg, os.Getenv("E2E_CADDY_RACE") == "1"); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
		return 1
	}
	return m.Run()
}
