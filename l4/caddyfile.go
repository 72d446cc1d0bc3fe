package leaderl4

import (
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	caddyleader "github.com/caddyleader/caddy-leader"
)

// UnmarshalCaddyfile sets up the gate from Caddyfile tokens. Syntax:
//
//	leader_gate [<election>] {
//		election  <name>
//		follower  close|proxy
//		advertise <host:port>
//		upstream  <host:port>
//		drain     <duration>
//		hold      <duration>
//	}
func (g *Gate) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the handler's name
	if d.NextArg() {
		if err := g.setElection(d.Val()); err != nil {
			return d.Errf("election: %v", err)
		}
	}
	if d.NextArg() {
		return d.ArgErr()
	}
	var followerAt int // the line of `follower`, where a missing companion option is reported
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		option := d.Val()
		if option == "follower" {
			followerAt = d.Line()
		}
		switch option {
		case "election", "follower", "advertise", "upstream", "drain", "hold":
		default:
			return d.Errf("unknown subdirective %q", option)
		}
		if !d.NextArg() {
			return d.ArgErr()
		}
		var err error
		switch option {
		case "election":
			err = g.setElection(d.Val())
		case "follower":
			g.Follower = d.Val()
			if g.Follower != FollowerClose && g.Follower != FollowerProxy {
				err = fmt.Errorf("%q is not one of close, proxy", g.Follower)
			}
		case "advertise":
			g.Advertise = d.Val()
			err = checkHostPort(g.Advertise)
		case "upstream":
			g.Upstream = d.Val()
			err = checkHostPort(g.Upstream)
		case "drain":
			g.Drain, err = parseDuration(d)
		case "hold":
			var hold caddy.Duration
			hold, err = parseDuration(d)
			g.Hold = &hold
		}
		if err != nil {
			return d.Errf("%s: %v", option, err)
		}
		if d.NextArg() {
			return d.ArgErr()
		}
	}
	if err := g.checkProxy(); err != nil {
		return fmt.Errorf("%v, at %s:%d", err, d.File(), followerAt)
	}
	return nil
}

// setElection sets the election, once.
func (g *Gate) setElection(name string) error {
	if g.Election != "" {
		return fmt.Errorf("already set to %q", g.Election)
	}
	if err := caddyleader.CheckElectionName(name); err != nil {
		return err
	}
	g.Election = name
	return nil
}

// parseDuration parses the current token as a duration that is not negative.
func parseDuration(d *caddyfile.Dispenser) (caddy.Duration, error) {
	dur, err := caddy.ParseDuration(d.Val())
	if err != nil {
		return 0, err
	}
	if dur < 0 {
		return 0, errNegative(dur)
	}
	return caddy.Duration(dur), nil
}

// errNegative is a negative duration given where none makes sense.
type errNegative time.Duration

func (e errNegative) Error() string { return time.Duration(e).String() + " is negative" }

// Interface guards
var _ caddyfile.Unmarshaler = (*Gate)(nil)
