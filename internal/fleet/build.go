package fleet

import (
	"bytes"
	"fmt"
	"os/exec"
	"strings"
)

// Packages of this module that build the binaries a fleet runs.
const (
	caddyPackage     = "github.com/caddyleader/caddy-leader/cmd/caddy"
	etcdLocalPackage = "github.com/caddyleader/caddy-leader/cmd/etcd-local"
)

// BuildCaddy builds the module's Caddy command (cmd/caddy) into out, with the race
// detector if race is set. The go command finds the module from the working directory,
// so it must be inside the module; `go test` runs it with the same toolchain, since it
// puts its own GOROOT/bin first in PATH.
func BuildCaddy(out string, race bool) error {
	return BuildCaddyPackage(out, caddyPackage, race)
}

// BuildCaddyPackage is BuildCaddy for another Caddy command, such as a nested module's
// (kubernetes/cmd/caddy, with its store); run it from inside that module.
func BuildCaddyPackage(out, pkg string, race bool) error {
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
