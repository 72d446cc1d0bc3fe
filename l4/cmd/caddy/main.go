// Command caddy is Caddy with its standard modules, caddy-l4 and both modules of
// caddy-leader: what `xcaddy build --with github.com/caddyleader/caddy-leader --with
// github.com/caddyleader/caddy-leader/l4` produces, buildable with plain `go build` (the
// layer-4 end-to-end tests use it).
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"
	_ "github.com/mholt/caddy-l4"

	_ "github.com/caddyleader/caddy-leader"
	_ "github.com/caddyleader/caddy-leader/l4"
)

func main() {
	caddycmd.Main()
}
