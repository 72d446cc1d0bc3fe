package statuspage

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func init() {
	httpcaddyfile.RegisterDirective("leader_status", parseDirective)
	// A responder, ordered as metrics is: after basic_auth and forward_auth, so that the
	// authentication in front of it runs first.
	httpcaddyfile.RegisterDirectiveOrder("leader_status", httpcaddyfile.After, "metrics")
}

// parseDirective is what RegisterHandlerDirective would do, plus one route: a page mounted
// under a directory (`leader_status /leader-status/*`, or `/leader-status/`) redirects the
// directory's bare path to it, as a user expects, where Caddy would otherwise answer an
// empty 200.
func parseDirective(h httpcaddyfile.Helper) ([]httpcaddyfile.ConfigValue, error) {
	if !h.Next() {
		return nil, h.ArgErr()
	}
	matcherSet, err := h.ExtractMatcherSet()
	if err != nil {
		return nil, err
	}
	var s Handler
	if err := s.UnmarshalCaddyfile(h.Dispenser); err != nil {
		return nil, err
	}
	routes := h.NewRoute(matcherSet, &s)
	if dir, ok := mountDir(matcherSet); ok {
		redirect := &caddyhttp.StaticResponse{StatusCode: caddyhttp.WeakString(strconv.Itoa(http.StatusPermanentRedirect)),
			Headers: http.Header{"Location": {dir + "/"}}}
		bare := caddy.ModuleMap{"path": caddyconfig.JSON([]string{dir}, nil)}
		routes = append(routes, h.NewRoute(bare, redirect)...)
	}
	return routes, nil
}

// mountDir is the directory a matcher set of one path mounts the page under (`/x` for
// `/x/` or `/x/*`).
func mountDir(set caddy.ModuleMap) (string, bool) {
	var paths []string
	if len(set) != 1 || json.Unmarshal(set["path"], &paths) != nil || len(paths) != 1 {
		return "", false
	}
	dir, ok := strings.CutSuffix(strings.TrimSuffix(paths[0], "*"), "/")
	return dir, ok && dir != "" && !strings.ContainsAny(dir, "*")
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	leader_status [<matcher>] {
//		title     <text>
//		elections  <name...>
//		admin_link <url>
//	}
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the directive's name
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		var err error
		switch d.Val() {
		case "title":
			h.Title, err = singleArg(d)
		case "admin_link":
			h.AdminLink, err = singleArg(d)
		case "elections":
			names := d.RemainingArgs()
			if len(names) == 0 {
				return d.ArgErr()
			}
			h.Elections = append(h.Elections, names...)
		default:
			return d.Errf("unrecognized leader_status option %q", d.Val())
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// singleArg reads an option's one argument.
func singleArg(d *caddyfile.Dispenser) (string, error) {
	if !d.NextArg() {
		return "", d.ArgErr()
	}
	v := d.Val()
	if d.NextArg() {
		return "", d.ArgErr()
	}
	return v, nil
}

// Interface guards
var (
	_ caddyfile.Unmarshaler = (*Handler)(nil)
)
