// Command caddy is Caddy with its standard modules and caddy-leader with its status page:
// what `xcaddy build --with github.com/caddyleader/caddy-leader --with
// github.com/caddyleader/caddy-leader/statuspage` produces, buildable with plain `go build` (the end-to-end tests use it).
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/caddyleader/caddy-leader"
	_ "github.com/caddyleader/caddy-leader/statuspage"
)

func main() {
	caddycmd.Main()
}
