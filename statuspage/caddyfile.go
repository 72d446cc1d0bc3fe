package statuspage

import (
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("leader_status", parseHandler)
	// A responder, ordered as metrics is: after basic_auth and forward_auth, so that the
	// authentication in front of it runs first.
	httpcaddyfile.RegisterDirectiveOrder("leader_status", httpcaddyfile.After, "metrics")
}

func parseHandler(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	var s Handler
	err := s.UnmarshalCaddyfile(h.Dispenser)
	return &s, err
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
