// Command caddy is Caddy with its standard modules, caddy-leader and its Kubernetes store:
// what `xcaddy build --with github.com/caddyleader/caddy-leader/kubernetes` produces,
// buildable with plain `go build` (the process tests use it).
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/caddyleader/caddy-leader"
	_ "github.com/caddyleader/caddy-leader/kubernetes"
)

func main() {
	caddycmd.Main()
}
