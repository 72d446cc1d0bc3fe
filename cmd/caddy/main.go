// Command caddy is Caddy with its standard modules and caddy-leader: what `xcaddy build`
// produces, buildable with plain `go build` (the end-to-end tests use it).
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/caddyleader/caddy-leader"
)

func main() {
	caddycmd.Main()
}
