package fleet

import (
	"cmp"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/caddyleader/caddy-leader/shards"
)

// DefaultTTL is an instance's lease TTL unless its Config says otherwise: etcd's minimum
// for its default 1s election timeout, so that failovers take seconds.
const DefaultTTL = 2 * time.Second

// Config is what differs between the configurations the tests give an instance. Ports,
// instance id and directories come from the instance.
type Config struct {
	// Endpoints are the etcd endpoints of the leader app.
	Endpoints []string
	// Store, when set, is the leader app's store module (`{"module": "postgres", ...}`),
	// which replaces Endpoints.
	Store map[string]any
	// InstanceStore, where it has an entry for an instance's id, replaces Store for that
	// instance: each instance can reach the database through a proxy of its own, under an
	// application_name of its own.
	InstanceStore map[string]map[string]any
	// InstanceEndpoints, where it has an entry for an instance's id, replaces Endpoints for
	// that instance: each instance can reach etcd through proxies of its own.
	InstanceEndpoints map[string][]string
	// DrainTimeout is the leader app's drain_timeout as written in JSON; empty leaves the
	// default.
	DrainTimeout string
	// CancelOnLoss sets leader_gate's cancel_on_loss.
	CancelOnLoss bool
	// TTL is the leader app's ttl as written in JSON; empty means DefaultTTL.
	TTL string
	// Follower is leader_gate's follower mode; empty means reject.
	Follower string
	// FollowerStatus is leader_gate's status_code; 0 leaves the default.
	FollowerStatus int
	// Variant ends every /gated response body, so that two configs differ harmlessly.
	Variant string
	// Hold is leader_gate's hold as written in JSON; empty leaves the default.
	Hold string
	// Backend, when set, is the URL of an upstream that admitted /gated requests are
	// proxied to (instead of a static response), with the serving instance and token in
	// the X-Served-By and X-Fencing-Token headers. Two more headers time the gate's
	// decision on the instance that served the request: X-Gate-Entered is set just before
	// leader_gate runs, X-Admitted-At when the proxy sends the admitted request on (both
	// `{time.now}`, Go's time.Time format). A Variant is sent as X-Config-Variant.
	Backend string
	// FailsafePorts, where it has an entry for an instance's id, turns on the leader
	// app's failsafe for that instance, listening on 127.0.0.1 at that port.
	FailsafePorts map[string]int
	// FailsafeURLs, where it has an entry for an instance's id, is the URL the others
	// reach that instance's failsafe listener at (a fault proxy, say).
	FailsafeURLs map[string]string
	// Priority, where it has an entry for an instance's id, is the leader app's priority
	// for that instance; the default leaves it out.
	Priority map[string]int
	// HandlePath, when set (say `/api`), moves the gated route under that prefix as
	// Caddy's handle_path does: `<HandlePath>/gated*` is matched and the prefix stripped
	// before the gate, and `/gated*` alone is not routed at all.
	HandlePath string
	// AccessLog turns on the HTTP server's access log (into the instance's log), in which
	// every request each instance handled can be counted, forwarded ones included.
	AccessLog bool
	// Apps, when set, adds apps to the instance's configuration (the layer-4 tests add
	// caddy-l4's `layer4` app).
	Apps func(in *Instance) map[string]any
	// Routes, when set, adds routes to the instance's HTTP server ahead of the fixed ones
	// (the status page tests mount leader_status).
	Routes func(in *Instance) []map[string]any
	// AdminOrigins, when set, are origins the instance's admin endpoint accepts besides
	// its own address (a browser following a link from one of them to the admin API).
	AdminOrigins func(in *Instance) []string
	// Shards, when above 0, gives the leader app a shard set of that many shards, named
	// ShardSet, and routes /gated by key through it: the gate admits a request on the
	// owner of its key's shard (ShardKey), and the backend is sent the shard as X-Shard.
	Shards int
	// MaxMoves is the shard set's max_moves; 0 leaves the default.
	MaxMoves int
	// ShardKey is the gate's shard_key; empty means ShardKeyPath, the path segment after
	// /gated, so that `/gated/<key>` routes by key (see ShardKeys).
	ShardKey string
	// MoreShardSets are shard sets the leader app has besides ShardSet, by name and shard
	// count; no fixed route gates by them (Routes can, with leader_gate's shard_set).
	MoreShardSets map[string]int
	// Jobs, when set, is the leader app's jobs field (scheduled jobs), as JSON would have it.
	Jobs map[string]any
}

// ShardSet is the name of the shard set of a Config with Shards.
const ShardSet = "keys"

// ShardKeyPath is the default shard key: the path segment after /gated.
const ShardKeyPath = "{http.request.uri.path.1}"

// ShardKeys returns, for a Config with Shards, one key per shard (key i falls into shard
// i), so that clients that cycle through them load every shard alike; nil without Shards.
func (c Config) ShardKeys() []string {
	if c.Shards <= 0 {
		return nil
	}
	keys := make([]string, c.Shards)
	found := 0
	for n := 0; found < c.Shards; n++ {
		k := "k" + strconv.Itoa(n)
		if s := shards.Of(k, c.Shards); keys[s] == "" {
			keys[s] = k
			found++
		}
	}
	return keys
}

// ShardElection is the name of shard s's election in a Config with Shards.
func ShardElection(s int) string { return ShardSet + "." + strconv.Itoa(s) }

// JSON renders c as the complete Caddy configuration of instance in:
//
//	/gated*  leader_gate, then 200 "<self> <token> <method> <variant>" (under HandlePath if set)
//	/leader  200 "<self> <token>" where the leader matcher matches, else 503
//	/health  200 while the instance is a healthy candidate (leader_candidate), else 503
//	/whoami  200 "<self> <leader id> <token> <is_leader>" after the leader matcher ran
//	/plain   200 "plain", touching nothing of the plugin (a control for /gated)
func (c Config) JSON(in *Instance) []byte {
	ttlText := c.TTL
	if ttlText == "" {
		ttlText = DefaultTTL.String()
	}
	follower := c.Follower
	if follower == "" {
		follower = "reject"
	}
	gate := map[string]any{"handler": "leader_gate", "follower": follower}
	if c.FollowerStatus != 0 {
		gate["status_code"] = c.FollowerStatus
	}
	if c.Hold != "" {
		gate["hold"] = c.Hold
	}
	if c.CancelOnLoss {
		gate["cancel_on_loss"] = true
	}
	if c.Shards > 0 {
		gate["shard_set"], gate["shard_key"] = ShardSet, cmp.Or(c.ShardKey, ShardKeyPath)
	}
	endpoints := c.Endpoints
	if eps, ok := c.InstanceEndpoints[in.ID]; ok {
		endpoints = eps
	}
	respond := func(status int, body string) map[string]any {
		return map[string]any{"handler": "static_response", "status_code": status, "body": body}
	}
	route := func(match []map[string]any, handle ...map[string]any) map[string]any {
		r := map[string]any{"handle": handle, "terminal": true}
		if match != nil {
			r["match"] = match
		}
		return r
	}
	path := func(p string) []map[string]any { return []map[string]any{{"path": []string{p}}} }
	leader := []map[string]any{{"leader": map[string]any{}}}
	subroute := func(routes ...map[string]any) map[string]any {
		return map[string]any{"handler": "subroute", "routes": routes}
	}
	const whoami = "{http.leader.self} {http.leader.id} {http.leader.token} {http.leader.is_leader}"
	gated := respond(200, "{http.leader.self} {http.leader.token} {http.request.method} "+c.Variant)
	gatedRoute := route(path("/gated*"), gate, gated)
	if c.Backend != "" {
		set := map[string][]string{
			"X-Served-By":     {"{http.leader.self}"},
			"X-Fencing-Token": {"{http.leader.token}"},
			"X-Admitted-At":   {"{time.now}"},
			"X-Original-URI":  {"{http.request.orig_uri}"},
		}
		if c.Variant != "" {
			set["X-Config-Variant"] = []string{c.Variant}
		}
		if c.Shards > 0 {
			set["X-Shard"] = []string{"{http.leader.shard}"}
		}
		gated = map[string]any{
			"handler":   "reverse_proxy",
			"upstreams": []map[string]any{{"dial": strings.TrimPrefix(c.Backend, "http://")}},
			"headers":   map[string]any{"request": map[string]any{"set": set}},
		}
		entered := map[string]any{"handler": "headers", "request": map[string]any{"set": map[string][]string{
			"X-Gate-Entered": {"{time.now}"},
		}}}
		gatedRoute = route(path("/gated*"), entered, gate, gated)
	}
	if c.HandlePath != "" {
		// What the Caddyfile's handle_path adapts to; the rewrite's route is not terminal.
		strip := map[string]any{"handle": []any{map[string]any{"handler": "rewrite", "strip_path_prefix": c.HandlePath}}}
		gatedRoute = route(path(c.HandlePath+"/gated*"), subroute(strip, gatedRoute))
	}

	leaderApp := map[string]any{
		"endpoints":   endpoints,
		"ttl":         ttlText,
		"instance_id": in.ID,
		"advertise":   in.URL(),
	}
	store := c.Store
	if s, ok := c.InstanceStore[in.ID]; ok {
		store = s
	}
	if store != nil {
		delete(leaderApp, "endpoints")
		leaderApp["store"] = store
	}
	if c.DrainTimeout != "" {
		leaderApp["drain_timeout"] = c.DrainTimeout
	}
	sets := make(map[string]any)
	if c.Shards > 0 {
		set := map[string]any{"shards": c.Shards}
		if c.MaxMoves > 0 {
			set["max_moves"] = c.MaxMoves
		}
		sets[ShardSet] = set
	}
	for name, n := range c.MoreShardSets {
		sets[name] = map[string]any{"shards": n}
	}
	if len(sets) > 0 {
		leaderApp["shard_sets"] = sets
	}
	if p, ok := c.Priority[in.ID]; ok {
		leaderApp["priority"] = p
	}
	if len(c.Jobs) > 0 {
		leaderApp["jobs"] = c.Jobs
	}
	if port, ok := c.FailsafePorts[in.ID]; ok {
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		url := "http://" + addr
		if u, ok := c.FailsafeURLs[in.ID]; ok {
			url = u
		}
		leaderApp["failsafe"] = map[string]any{"listen": addr, "url": url}
	}
	var extra []any
	if c.Routes != nil {
		for _, r := range c.Routes(in) {
			extra = append(extra, r)
		}
	}
	server := map[string]any{
		"listen":          []string{fmt.Sprintf("127.0.0.1:%d", in.HTTPPort)},
		"automatic_https": map[string]any{"disable": true},
		"routes": append(extra,
			gatedRoute,
			route(path("/leader"), subroute(
				route(leader, respond(200, "{http.leader.self} {http.leader.token}")),
				route(nil, respond(503, "not the leader")),
			)),
			route(path("/health"), subroute(
				route([]map[string]any{{"leader_candidate": map[string]any{}}}, respond(200, "healthy")),
				route(nil, respond(503, "not a healthy candidate")),
			)),
			route(path("/whoami"), subroute(
				route(leader, respond(200, whoami)),
				route(nil, respond(200, whoami)),
			)),
			route(path("/plain"), respond(200, "plain")),
		),
	}
	if c.AccessLog {
		server["logs"] = map[string]any{}
	}
	apps := map[string]any{
		"leader": leaderApp,
		"http": map[string]any{
			"grace_period": "2s",
			"servers":      map[string]any{"e2e": server},
		},
	}
	if c.Apps != nil {
		for name, app := range c.Apps(in) {
			apps[name] = app
		}
	}
	admin := map[string]any{
		"listen": fmt.Sprintf("127.0.0.1:%d", in.AdminPort),
		"config": map[string]any{"persist": false},
	}
	if c.AdminOrigins != nil {
		// Caddy accepts only the listed origins once any is: its own address goes first.
		admin["origins"] = append([]string{fmt.Sprintf("127.0.0.1:%d", in.AdminPort)}, c.AdminOrigins(in)...)
	}
	cfg := map[string]any{
		"admin":   admin,
		"storage": map[string]any{"module": "file_system", "root": filepath.Join(in.Dir, "storage")},
		// The leader app's own log at DEBUG: a shard's "became leader" is there (its set
		// sums its moves up at INFO), and ShardsLedSince reads it.
		"logging": map[string]any{"logs": map[string]any{
			"default": map[string]any{"level": "INFO", "exclude": []string{"leader"}},
			"leader":  map[string]any{"level": "DEBUG", "include": []string{"leader"}},
		}},
		"apps": apps,
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		panic(err) // maps of strings and numbers always marshal
	}
	return b
}
