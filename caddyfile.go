package caddyleader

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/caddyleader/caddy-leader/etcdbackend"
)

func init() {
	httpcaddyfile.RegisterGlobalOption("leader", parseGlobalOption)
	httpcaddyfile.RegisterHandlerDirective("leader_health", parseHealth)
	httpcaddyfile.RegisterHandlerDirective("leader_gate", parseGate)
	// Both go before basic_auth, leader_health first: each insertion lands right before
	// basic_auth, so the one registered first ends up first. A health check must answer on
	// every instance and never be gated (a follower's 429 would become the gate's 503);
	// written at the top level with a path matcher, as `metrics /metrics` is, it answers
	// before a site-wide gate: `leader_health /health`. It answers every request it
	// matches itself, as respond does.
	httpcaddyfile.RegisterDirectiveOrder("leader_health", httpcaddyfile.Before, "basic_auth")
	// Before basic_auth: a follower turns a request away before it costs a password hash,
	// and the leader's own auth still runs on everything it admits.
	httpcaddyfile.RegisterDirectiveOrder("leader_gate", httpcaddyfile.Before, "basic_auth")
}

// parseGlobalOption sets up the leader app from the global `leader` option:
//
//	leader {
//		endpoints     <url|host:port>...
//		prefix        <key prefix>
//		ttl           <duration>
//		instance_id   <id>
//		advertise     <url>
//		dial_timeout  <duration>
//		drain_timeout <duration>
//		elections     <name>...
//		priority      <n>
//		preempt
//		tls {
//			ca          <file>
//			cert        <file>
//			key         <file>
//			server_name <name>
//		}
//		username      <user>
//		password      <password>
//		step_down_when_unhealthy <url> {
//			interval <duration>
//			timeout  <duration>
//			fails    <n>
//			hold_off <duration>
//		}
//		failsafe [<listen>] {
//			listen  <host:port>
//			url     <url>
//			timeout <duration>
//		}
//		shards        <set> <count> {
//			max_moves <n>
//		}
//		store         <module> {
//			...
//		}
//		job <name> {
//			every    <interval>
//			cron     "<expression>" [<IANA time zone>]
//			election <name>
//			shard_set <set>
//			request  <method> <url> {
//				header <name> <value>
//				body   <text>
//			}
//			timeout       <duration>
//			retries       <n>
//			retry_backoff <duration>
//			overlap       skip|wait
//			missed        run_once|skip
//		}
//	}
//
// job adds a leader-only scheduled job (see Job), and may be repeated with other names: it
// needs exactly one of every and cron, and a request; election and shard_set are
// exclusive (default: the default election).
// store picks the coordination store, a `leader.stores.*` module (`etcd`, `postgres`); see
// each module's UnmarshalCaddyfile for its block. Without it the etcd options above
// (endpoints, prefix, dial_timeout, tls, username, password) configure etcd, and endpoints
// is required; with it they must not be given. endpoints and elections may be repeated and
// accumulate. A bare
// `tls` (no block) means TLS with the system's root CAs. Give the password as a
// placeholder, {env.VAR} or {file.path}, which Caddy expands when it loads the config:
// {$VAR} would write the password itself into the adapted JSON.
func parseGlobalOption(d *caddyfile.Dispenser, existing any) (any, error) {
	if existing != nil {
		d.Next() // onto the option's name, for the error's line number
		return nil, d.Err("the leader global option may appear only once")
	}
	app := new(App)
	if err := app.UnmarshalCaddyfile(d); err != nil {
		return nil, err
	}
	// Caught here as well as in Provision, so that `caddy adapt` already reports it.
	if app.StoreRaw == nil && len(app.Endpoints) == 0 {
		return nil, d.Err("leader: endpoints: at least one etcd endpoint is required")
	}
	for _, name := range app.Elections {
		if err := app.checkNotShard(name); err != nil {
			return nil, d.Errf("leader: elections: %v", err)
		}
	}
	// What a job's block alone cannot tell: whether its shard set is configured.
	if err := app.checkJobs(); err != nil {
		return nil, d.Errf("leader: %v", err)
	}
	return httpcaddyfile.App{Name: "leader", Value: caddyconfig.JSON(app, nil)}, nil
}

// UnmarshalCaddyfile sets up the app from Caddyfile tokens; see parseGlobalOption for the
// syntax.
func (a *App) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the option's name
	if d.NextArg() {
		return d.ArgErr()
	}
	// Where options that conflict with each other were given, so that the error points at
	// them rather than at the block's closing brace.
	var storeAt, etcdAt, preemptAt, failsafeAt position
	for d.NextBlock(0) {
		switch opt := d.Val(); opt {
		case "elections":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return d.ArgErr()
			}
			for _, name := range args {
				if err := checkElectionName(name); err != nil {
					return d.Errf("elections: %v", err)
				}
			}
			a.Elections = append(a.Elections, args...)
		case "shards":
			name, set, err := unmarshalShardSet(d)
			if err != nil {
				return err
			}
			if _, dup := a.ShardSets[name]; dup {
				return d.Errf("shards: set %q given twice", name)
			}
			if a.ShardSets == nil {
				a.ShardSets = make(map[string]*ShardSet)
			}
			a.ShardSets[name] = set
		case "job":
			name, job, err := unmarshalJob(d)
			if err != nil {
				return err
			}
			if _, dup := a.Jobs[name]; dup {
				return d.Errf("job: %q given twice", name)
			}
			if a.Jobs == nil {
				a.Jobs = make(map[string]*Job)
			}
			a.Jobs[name] = job
		case "instance_id":
			if err := oneArg(d, &a.InstanceID); err != nil {
				return err
			}
			if err := checkUnlessPlaceholder(a.InstanceID, checkInstanceID); err != nil {
				return d.Errf("instance_id: %v", err)
			}
		case "advertise":
			if err := oneArg(d, &a.Advertise); err != nil {
				return err
			}
			if err := checkUnlessPlaceholder(a.Advertise, checkAdvertise); err != nil {
				return d.Errf("advertise: %v", err)
			}
		case "ttl":
			// In JSON a zero ttl is an omitted one; written out here, 0s is a mistake.
			if err := durationArg(d, &a.TTL); err != nil {
				return err
			}
			if err := checkTTL(time.Duration(a.TTL)); err != nil {
				return d.Errf("ttl: %v", err)
			}
		case "drain_timeout":
			if err := positiveDurationArg(d, &a.DrainTimeout, DefaultDrainTimeout); err != nil {
				return err
			}
		case "priority":
			var v string
			if err := oneArg(d, &v); err != nil {
				return err
			}
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				return d.Errf("priority: %q is not a whole number of at least 0 (0 never campaigns)", v)
			}
			a.Priority = &n
		case "preempt":
			preemptAt = at(d)
			if d.NextArg() {
				return d.Err("preempt: takes no value")
			}
			a.Preempt = true
		case "store":
			storeAt = at(d)
			if a.StoreRaw != nil {
				return d.Err("store: given twice")
			}
			if !d.NextArg() {
				return d.ArgErr()
			}
			name := d.Val()
			if _, err := caddy.GetModule("leader.stores." + name); err != nil {
				if mod, ok := storeModules[name]; ok {
					return d.Errf("store: %q is not in this build of Caddy: its module is %s; build with `xcaddy build --with %s` (and the plugin's other --with lines), or from a checkout, `go build ./cmd/caddy` in %s",
						name, mod.path, mod.path, mod.dir)
				}
				return d.Errf("store: %q is not a store; the stores are %s", name, storeNames())
			}
			unm, err := caddyfile.UnmarshalModule(d, "leader.stores."+name)
			if err != nil {
				return err
			}
			a.StoreRaw = caddyconfig.JSONModuleObject(unm, "module", name, nil)
		case "step_down_when_unhealthy":
			if a.StepDown != nil {
				return d.Err("step_down_when_unhealthy: given twice")
			}
			s, err := unmarshalStepDown(d)
			if err != nil {
				return err
			}
			a.StepDown = s
		case "failsafe":
			failsafeAt = at(d)
			if a.Failsafe != nil {
				return d.Err("failsafe: given twice")
			}
			f, err := unmarshalFailsafe(d)
			if err != nil {
				return err
			}
			a.Failsafe = f
		default:
			etcdOpt := at(d)
			if ok, err := a.EtcdStore.unmarshalOption(d, opt); ok || err != nil {
				if err != nil {
					return err
				}
				if etcdAt.line == 0 {
					etcdAt = etcdOpt
				}
				continue
			}
			return d.Errf("unrecognized leader option %q", opt)
		}
	}
	if a.Failsafe != nil && a.Failsafe.Timeout != 0 {
		ttl := cmp.Or(time.Duration(a.TTL), DefaultTTL)
		if err := checkFailsafeTimeout(time.Duration(a.Failsafe.Timeout), ttl); err != nil {
			return failsafeAt.errf("failsafe: timeout: %v; the peers' answers must come within a round, and a round is ttl/3", err)
		}
	}
	if preemptAt.line != 0 && a.Priority != nil && *a.Priority == 0 {
		return preemptAt.errf("preempt: an instance with priority 0 never leads, so it cannot preempt; remove preempt or give it a priority above 0")
	}
	if a.StoreRaw != nil {
		if a.EtcdStore.set() {
			return etcdAt.errf("%s: with `store` (line %d) the top-level etcd options (endpoints, prefix, dial_timeout, tls, username, password) must not be given; put them inside store etcd { }",
				etcdAt.opt, storeAt.line)
		}
		return nil
	}
	return a.EtcdStore.checkCaddyfile(d)
}

// parseGate sets up the handler from the `leader_gate` directive; see Gate.UnmarshalCaddyfile.
func parseGate(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	g := new(Gate)
	if err := g.UnmarshalCaddyfile(h.Dispenser); err != nil {
		return nil, err
	}
	opt, ok := h.Option("leader").(httpcaddyfile.App)
	if !ok {
		return nil, h.Err("leader_gate needs the global leader option: add `leader { endpoints ... }` to the global options block")
	}
	if g.Follower == FollowerRedirect || g.Follower == FollowerForward {
		var app App
		if err := json.Unmarshal(opt.Value, &app); err == nil && app.Advertise == "" {
			return nil, h.Errf("leader_gate: follower %s needs `advertise <url>` in the global leader option, the URL the leader is reached at", g.Follower)
		}
	}
	return g, nil
}

// UnmarshalCaddyfile sets up the gate from Caddyfile tokens:
//
//	leader_gate [<matcher>] [<election>] {
//		election    <name>
//		shard       <set> <key>
//		follower    reject [<status>] | redirect [307|308] | forward
//		hold        <duration>
//		retry_after <duration>
//		cancel_on_loss
//		admission_times
//		transport   <name> {
//			# reverse_proxy's transport options, for follower forward
//		}
//	}
//
// The election is named once, as the argument or in the block. `shard` routes by key
// instead: a request is admitted on the owner of its key's shard in the shard set <set>
// (see ShardSet), and <key> is text with placeholders, such as {http.request.uri.path.1}.
func (g *Gate) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the directive's name
	if d.NextArg() {
		g.Election = d.Val()
		if d.NextArg() {
			return d.ArgErr()
		}
		if err := checkElectionName(g.Election); err != nil {
			return d.Errf("election: %v", err)
		}
	}
	for d.NextBlock(0) {
		switch opt := d.Val(); opt {
		case "election":
			// Two names for one gate are a mistake whichever should win.
			if g.Election != "" {
				return d.Errf("election: already set to %q", g.Election)
			}
			if g.ShardSet != "" {
				return d.Errf("election: the gate admits for shard set %q already; a gate admits for one election or one shard set", g.ShardSet)
			}
			if err := oneArg(d, &g.Election); err != nil {
				return err
			}
			if err := checkElectionName(g.Election); err != nil {
				return d.Errf("election: %v", err)
			}
		case "follower":
			if !d.NextArg() {
				return d.ArgErr()
			}
			g.Follower = d.Val()
			g.StatusCode = 0 // a repeated follower line must not inherit the previous status
			switch g.Follower {
			case FollowerReject, FollowerRedirect:
			case FollowerForward:
				if d.NextArg() {
					return d.Err("follower forward takes no status")
				}
			default:
				return d.Errf("follower: %q is not one of reject, redirect, forward", g.Follower)
			}
			if d.NextArg() {
				code, err := strconv.Atoi(d.Val())
				if err != nil {
					return d.Errf("follower %s: status %q is not a number", g.Follower, d.Val())
				}
				g.StatusCode = code
				if err := checkFollower(g.Follower, code); err != nil {
					return d.Errf("follower: %v", err)
				}
			}
			if d.NextArg() {
				return d.ArgErr()
			}
		case "retry_after":
			if err := positiveDurationArg(d, &g.RetryAfter, DefaultRetryAfter); err != nil {
				return err
			}
		case "shard":
			if g.Election != "" {
				return d.Errf("shard: the gate admits for election %q already; a gate admits for one election or one shard set", g.Election)
			}
			if err := unmarshalShardRoute(d, &g.ShardSet, &g.ShardKey); err != nil {
				return err
			}
		case "cancel_on_loss":
			if d.NextArg() {
				return d.ArgErr()
			}
			g.CancelOnLoss = true
		case "admission_times":
			if d.NextArg() {
				return d.ArgErr()
			}
			g.AdmissionTimes = true
		case "hold":
			var hold caddy.Duration
			// Zero is meaningful: no hold.
			if err := durationArg(d, &hold); err != nil {
				return err
			}
			g.Hold = &hold
		case "transport":
			if g.TransportRaw != nil {
				return d.Err("transport: already specified")
			}
			if !d.NextArg() {
				return d.ArgErr()
			}
			name := d.Val()
			// The same transports, with the same syntax, as reverse_proxy's.
			unm, err := caddyfile.UnmarshalModule(d, "http.reverse_proxy.transport."+name)
			if err != nil {
				return err
			}
			g.TransportRaw = caddyconfig.JSONModuleObject(unm, "protocol", name, nil)
		default:
			return d.Errf("unrecognized leader_gate option %q", opt)
		}
	}
	// Caught here as well as in Provision, so that `caddy adapt` already reports it.
	if g.TransportRaw != nil && g.Follower != FollowerForward {
		follower := g.Follower
		if follower == "" {
			follower = FollowerReject
		}
		return d.Errf("transport: only `follower forward` uses a transport, not %q", follower)
	}
	return nil
}

// parseHealth sets up the handler from the `leader_health` directive; see
// HealthHandler.UnmarshalCaddyfile.
func parseHealth(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	hh := new(HealthHandler)
	if err := hh.UnmarshalCaddyfile(h.Dispenser); err != nil {
		return nil, err
	}
	if _, ok := h.Option("leader").(httpcaddyfile.App); !ok {
		return nil, h.Err("leader_health needs the global leader option: add `leader { endpoints ... }` to the global options block")
	}
	return hh, nil
}

// UnmarshalCaddyfile sets up the health handler from Caddyfile tokens:
//
//	leader_health [<matcher>] [<election>] {
//		election         <name>
//		shard            <set> <key>
//		leader_status    <code>
//		standby_status   <code>
//		standby_ok
//		unhealthy_status <code>
//	}
//
// The election is named once, as the argument or in the block. `shard` answers by key
// instead: for the shard of the request's key in the shard set <set> (see ShardSet), where
// <key> is text with placeholders, such as {http.request.uri.query.room}; it excludes
// standby_ok.
func (h *HealthHandler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the directive's name
	if d.NextArg() {
		h.Election = d.Val()
		if d.NextArg() {
			return d.ArgErr()
		}
		if err := checkElectionName(h.Election); err != nil {
			return d.Errf("election: %v", err)
		}
	}
	for d.NextBlock(0) {
		switch opt := d.Val(); opt {
		case "election":
			if h.Election != "" {
				return d.Errf("election: already set to %q", h.Election)
			}
			if h.ShardSet != "" {
				return d.Errf("election: the check answers for shard set %q already; it answers for one election or one shard set", h.ShardSet)
			}
			if err := oneArg(d, &h.Election); err != nil {
				return err
			}
			if err := checkElectionName(h.Election); err != nil {
				return d.Errf("election: %v", err)
			}
		case "leader_status", "standby_status", "unhealthy_status":
			var v string
			if err := oneArg(d, &v); err != nil {
				return err
			}
			code, err := strconv.Atoi(v)
			if err != nil {
				return d.Errf("%s: %q is not a number", opt, v)
			}
			if err := checkHealthStatus(code); err != nil {
				return d.Errf("%s: %v", opt, err)
			}
			*map[string]*int{"leader_status": &h.LeaderStatus, "standby_status": &h.StandbyStatus, "unhealthy_status": &h.UnhealthyStatus}[opt] = code
		case "shard":
			if h.Election != "" {
				return d.Errf("shard: the check answers for election %q already; it answers for one election or one shard set", h.Election)
			}
			if err := unmarshalShardRoute(d, &h.ShardSet, &h.ShardKey); err != nil {
				return err
			}
			if h.StandbyOK {
				return d.Err(errStandbyOKWithShard.Error())
			}
		case "standby_ok":
			if d.NextArg() {
				return d.ArgErr()
			}
			if h.ShardSet != "" {
				return d.Err(errStandbyOKWithShard.Error())
			}
			h.StandbyOK = true
		default:
			return d.Errf("unrecognized leader_health option %q", opt)
		}
	}
	return nil
}

// UnmarshalCaddyfile sets up the matcher from Caddyfile tokens:
//
//	leader [<election>] {
//		shard <set> <key>
//	}
//
// With `shard`, it matches where this instance owns the request's key's shard in the shard
// set <set>.
func (m *Matcher) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	// A matcher repeated in one set arrives as several segments. One Matcher holds one
	// election, so only repeats of the same election can be merged.
	seen := false
	for d.Next() {
		election := ""
		if d.NextArg() {
			election = d.Val()
			if err := checkElectionName(election); err != nil {
				return d.Errf("leader: %v", err)
			}
		}
		if seen && electionOrDefault(election) != electionOrDefault(m.Election) {
			return d.Errf("leader: a matcher set can test one election, not both %q and %q", electionOrDefault(m.Election), electionOrDefault(election))
		}
		if !seen {
			m.Election = election
		}
		seen = true
		if d.NextArg() {
			return d.ArgErr()
		}
		for nesting := d.Nesting(); d.NextBlock(nesting); {
			switch d.Val() {
			case "shard":
				if m.Election != "" {
					return d.Errf("leader: shard: the matcher tests election %q already; it tests one election or one shard set", m.Election)
				}
				if err := unmarshalShardRoute(d, &m.ShardSet, &m.ShardKey); err != nil {
					return err
				}
			default:
				return d.Errf("leader: unknown option %q (the option is shard)", d.Val())
			}
		}
	}
	return nil
}

func electionOrDefault(name string) string {
	if name == "" {
		return DefaultElection
	}
	return name
}

// UnmarshalCaddyfile sets up the dynamic upstream source from the tokens of reverse_proxy's
// `dynamic` subdirective:
//
//	dynamic leader [<election>] {
//		shard <set> <key>
//	}
//
// With `shard`, each request goes to the owner of its key's shard in the shard set <set>
// instead of the leader of an election.
func (u *LeaderUpstreams) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the source's name
	if d.NextArg() {
		u.Election = d.Val()
		if err := checkElectionName(u.Election); err != nil {
			return d.Errf("dynamic leader: %v", err)
		}
	}
	if d.NextArg() {
		return d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch d.Val() {
		case "shard":
			if u.Election != "" {
				return d.Errf("dynamic leader: shard: the source follows election %q already; it follows one election or one shard set", u.Election)
			}
			if err := unmarshalShardRoute(d, &u.ShardSet, &u.ShardKey); err != nil {
				return err
			}
		default:
			return d.Errf("dynamic leader: unknown option %q (the option is shard)", d.Val())
		}
	}
	return nil
}

// UnmarshalCaddyfile sets up the matcher from Caddyfile tokens:
//
//	leader_candidate [<election>]
func (m *CandidateMatcher) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	for d.Next() {
		if d.NextArg() {
			m.Election = d.Val()
			if err := checkElectionName(m.Election); err != nil {
				return d.Errf("leader_candidate: %v", err)
			}
		}
		if d.NextArg() {
			return d.ArgErr()
		}
		if d.NextBlock(0) {
			return d.Err("the leader_candidate matcher takes no block")
		}
	}
	return nil
}

// position is where an option was given, for an error found after the block is read.
type position struct {
	opt, file string
	line      int
}

func at(d *caddyfile.Dispenser) position {
	return position{opt: d.Val(), file: d.File(), line: d.Line()}
}

// errf is Dispenser.Errf at the option's position.
func (p position) errf(format string, args ...any) error {
	return fmt.Errorf(format+", at %s:%d", append(args, p.file, p.line)...)
}

// storeModules are the stores that live in modules of their own (so that the root module
// never pulls their dependencies), by name: where a build that lacks one finds it.
var storeModules = map[string]struct{ path, dir string }{
	"kubernetes": {"github.com/caddyleader/caddy-leader/kubernetes", "kubernetes/"},
}

// storeNames lists the registered stores, for an error that names an unknown one.
func storeNames() string {
	var names []string
	for _, m := range caddy.GetModules("leader.stores") {
		names = append(names, "`"+m.ID.Name()+"`")
	}
	return strings.Join(names, ", ")
}

func oneArg(d *caddyfile.Dispenser, dst *string) error {
	opt := d.Val()
	if !d.NextArg() {
		return d.Errf("%s: missing value", opt)
	}
	*dst = d.Val()
	if d.NextArg() {
		return d.Errf("%s: takes exactly one value", opt)
	}
	return nil
}

func durationArg(d *caddyfile.Dispenser, dst *caddy.Duration) error {
	opt := d.Val()
	var s string
	if err := oneArg(d, &s); err != nil {
		return err
	}
	dur, err := caddy.ParseDuration(s)
	if err != nil {
		return d.Errf("%s: %q is not a duration: %v", opt, s, err)
	}
	if dur < 0 {
		return d.Errf("%s: %s is negative", opt, dur)
	}
	*dst = caddy.Duration(dur)
	return nil
}

// positiveDurationArg is durationArg for an option whose zero value stands for its default
// in JSON: written out in a Caddyfile, a zero would silently become def, so it is an error.
func positiveDurationArg(d *caddyfile.Dispenser, dst *caddy.Duration, def time.Duration) error {
	opt := d.Val()
	if err := durationArg(d, dst); err != nil {
		return err
	}
	if *dst == 0 {
		return d.Errf("%s: 0s is not allowed (leave %s out for its default, %s)", opt, opt, def)
	}
	return nil
}

// unreadableFileWarning says that a file the config names cannot be read here, where the
// Caddyfile is adapted: loading the config will fail the same way unless it is loaded on
// another machine (adapted in a build, say), which is why this is a warning and not an
// error. Empty when the file can be read, or its name is a placeholder.
func unreadableFileWarning(file string, line int, option, path string) string {
	if strings.Contains(path, "{") {
		return ""
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("%s:%d: %s: %q cannot be read here (%v): loading this config will fail unless the file exists where Caddy runs",
			file, line, option, path, errors.Unwrap(err))
	}
	f.Close()
	return ""
}

// warnUnreadableFile logs unreadableFileWarning at adapt time.
func warnUnreadableFile(d *caddyfile.Dispenser, option, path string) {
	if msg := unreadableFileWarning(d.File(), d.Line(), option, path); msg != "" {
		caddy.Log().Named("caddyfile").Warn(msg, zap.String("option", option))
	}
}

// withoutPlaceholders returns the values known at adapt time: those without a placeholder.
func withoutPlaceholders(values []string) []string {
	var known []string
	for _, v := range values {
		if !strings.Contains(v, "{") {
			known = append(known, v)
		}
	}
	return known
}

// literalPasswordWarning says why a password written out in the Caddyfile is a risk, and
// what to write instead; empty for a placeholder. A literal password lands in the adapted
// JSON, which `caddy adapt` prints and the admin API serves.
func literalPasswordWarning(file string, line int, password string) string {
	if strings.Contains(password, "{env.") || strings.Contains(password, "{file.") {
		return ""
	}
	return fmt.Sprintf("%s:%d: password is written out: it is copied into the adapted JSON, which `caddy adapt` prints and the admin API serves; use {env.VAR} or {file./path/to/secret}, which Caddy expands when it loads the config", file, line)
}

// warnLiteralPassword logs literalPasswordWarning at adapt time, as Caddy's own Caddyfile
// parsers log their warnings.
func warnLiteralPassword(d *caddyfile.Dispenser, password string) {
	if msg := literalPasswordWarning(d.File(), d.Line(), password); msg != "" {
		caddy.Log().Named("caddyfile").Warn(msg, zap.String("option", "password"))
	}
}

// checkUnlessPlaceholder runs check on a value that is known at adapt time; a runtime
// placeholder ({env.X}, {file.path}) is checked by Provision once expanded. ({$VAR} is
// already expanded by the Caddyfile lexer.)
func checkUnlessPlaceholder(value string, check func(string) error) error {
	if strings.Contains(value, "{") {
		return nil
	}
	return check(value)
}

// Interface guards
var (
	_ caddyfile.Unmarshaler = (*App)(nil)
	_ caddyfile.Unmarshaler = (*Gate)(nil)
	_ caddyfile.Unmarshaler = (*Matcher)(nil)
	_ caddyfile.Unmarshaler = (*LeaderUpstreams)(nil)
	_ caddyfile.Unmarshaler = (*CandidateMatcher)(nil)
	_ caddyfile.Unmarshaler = (*HealthHandler)(nil)
)

// UnmarshalCaddyfile sets up the etcd store from the `store etcd` block of the leader
// global option:
//
//	store etcd {
//		endpoints    <url|host:port>...
//		prefix       <key prefix>
//		dial_timeout <duration>
//		tls {
//			ca          <file>
//			cert        <file>
//			key         <file>
//			server_name <name>
//		}
//		username     <user>
//		password     <password>
//	}
//
// The options mean what they mean at the top level of the leader option.
func (s *EtcdStore) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the store's name
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		ok, err := s.unmarshalOption(d, d.Val())
		if err != nil {
			return err
		}
		if !ok {
			return d.Errf("unrecognized etcd store option %q", d.Val())
		}
	}
	if len(s.Endpoints) == 0 {
		return d.Err("store etcd: endpoints: at least one etcd endpoint is required")
	}
	return s.checkCaddyfile(d)
}

// checkCaddyfile checks the credentials at adapt time as well as in Provision, so that
// `caddy adapt` already reports them; an endpoint or credential that is a placeholder is
// checked only once expanded.
func (s *EtcdStore) checkCaddyfile(d *caddyfile.Dispenser) error {
	if err := s.checkCredentials(); err != nil {
		return d.Err(err.Error())
	}
	return nil
}

// unmarshalOption parses one etcd option, opt, if it is one; it reports whether it was.
func (s *EtcdStore) unmarshalOption(d *caddyfile.Dispenser, opt string) (bool, error) {
	switch opt {
	case "endpoints":
		args := d.RemainingArgs()
		if len(args) == 0 {
			return true, d.Err("endpoints: at least one etcd endpoint is required")
		}
		for _, ep := range args {
			if err := checkUnlessPlaceholder(ep, checkEndpoint); err != nil {
				return true, d.Errf("endpoints: %v", err)
			}
		}
		s.Endpoints = append(s.Endpoints, args...)
		if err := etcdbackend.CheckSchemes(withoutPlaceholders(s.Endpoints)); err != nil {
			return true, d.Err(err.Error()) // it names endpoints itself
		}
	case "prefix":
		if err := oneArg(d, &s.Prefix); err != nil {
			return true, err
		}
		if err := checkUnlessPlaceholder(s.Prefix, checkPrefix); err != nil {
			return true, d.Errf("prefix: %v", err)
		}
	case "dial_timeout":
		if err := positiveDurationArg(d, &s.DialTimeout, DefaultDialTimeout); err != nil {
			return true, err
		}
	case "tls":
		if s.TLS != nil {
			return true, d.Err("tls: given twice; put every tls option in one block")
		}
		if d.NextArg() {
			return true, d.ArgErr()
		}
		s.TLS = new(EtcdTLS)
		for nesting := d.Nesting(); d.NextBlock(nesting); {
			var dst *string
			sub := d.Val()
			switch sub {
			case "ca":
				dst = &s.TLS.CA
			case "cert":
				dst = &s.TLS.Cert
			case "key":
				dst = &s.TLS.Key
			case "server_name":
				dst = &s.TLS.ServerName
			default:
				return true, d.Errf("unrecognized leader tls option %q", sub)
			}
			if err := oneArg(d, dst); err != nil {
				return true, err
			}
			if sub != "server_name" {
				warnUnreadableFile(d, "tls "+sub, *dst)
			}
		}
		if err := s.TLS.files().Check(); err != nil {
			return true, d.Err(err.Error())
		}
	case "username":
		if err := oneArg(d, &s.Username); err != nil {
			return true, err
		}
	case "password":
		if err := oneArg(d, &s.Password); err != nil {
			return true, err
		}
		warnLiteralPassword(d, s.Password)
	default:
		return false, nil
	}
	return true, nil
}

// unmarshalJob reads a `job <name> { ... }` block (see parseGlobalOption) and checks it as
// Provision will, so that the error carries the line.
func unmarshalJob(d *caddyfile.Dispenser) (string, *Job, error) {
	start := at(d)
	if !d.NextArg() {
		return "", nil, d.Err("job: the job's name is missing")
	}
	name := d.Val()
	if err := checkJobName(name); err != nil {
		return "", nil, d.Errf("job: %v", err)
	}
	if d.NextArg() {
		return "", nil, d.Errf("job %s: takes a name and a block", name)
	}
	j := new(Job)
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		var err error
		switch opt {
		case "every":
			if err = durationArg(d, &j.Every); err == nil && j.Every == 0 {
				err = d.Err("every: 0s is not an interval")
			}
		case "cron":
			args := d.RemainingArgs()
			if len(args) == 0 || len(args) > 2 {
				return "", nil, d.Errf("job %s: cron: give the expression, quoted, and optionally a time zone", name)
			}
			j.Cron = args[0]
			if len(args) == 2 {
				j.TimeZone = args[1]
			}
		case "election":
			err = oneArg(d, &j.Election)
		case "shard_set":
			err = oneArg(d, &j.ShardSet)
		case "request":
			j.Request, err = unmarshalJobRequest(d)
		case "timeout":
			err = positiveDurationArg(d, &j.Timeout, DefaultJobTimeout)
		case "retries":
			var v string
			if err = oneArg(d, &v); err == nil {
				if j.Retries, err = strconv.Atoi(v); err != nil || j.Retries < 0 {
					err = d.Errf("retries: %q is not a whole number of at least 0", v)
				}
			}
		case "retry_backoff":
			err = positiveDurationArg(d, &j.RetryBackoff, DefaultJobRetryBackoff)
		case "overlap":
			err = oneArg(d, &j.Overlap)
		case "missed":
			err = oneArg(d, &j.Missed)
		default:
			return "", nil, d.Errf("job %s: unknown option %q", name, opt)
		}
		if err != nil {
			return "", nil, fmt.Errorf("job %s: %w", name, err)
		}
	}
	if err := j.check(); err != nil {
		return "", nil, start.errf("job %s: %v", name, err)
	}
	return name, j, nil
}

// unmarshalJobRequest reads `request <method> <url> { header <name> <value>; body <text> }`.
func unmarshalJobRequest(d *caddyfile.Dispenser) (*JobRequest, error) {
	args := d.RemainingArgs()
	if len(args) != 2 {
		return nil, d.Err("request: give the method and the URL")
	}
	r := &JobRequest{Method: args[0], URL: args[1]}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch d.Val() {
		case "header":
			args := d.RemainingArgs()
			if len(args) != 2 {
				return nil, d.Err("header: give the name and the value")
			}
			if r.Headers == nil {
				r.Headers = make(map[string][]string)
			}
			r.Headers.Add(args[0], args[1])
		case "body":
			if err := oneArg(d, &r.Body); err != nil {
				return nil, err
			}
		default:
			return nil, d.Errf("request: unknown option %q (the options are header and body)", d.Val())
		}
	}
	return r, nil
}
