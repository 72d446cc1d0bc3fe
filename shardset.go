package caddyleader

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/internal/termconn"
	"github.com/caddyleader/caddy-leader/shards"
)

// ShardSet is a named set of shards: a fixed number of elections, `<set>.0` to
// `<set>.<shards-1>`, each with its own terms and fencing tokens, spread over the fleet so
// that every key has one owner at a time. A key's shard is FNV-1a (64 bits) of the key
// modulo Shards (see package shards, whose test vector users can check their own code
// against); a shard's preferred owner is the live, healthy candidate with the highest
// rendezvous score for it, weighted by priority (priority 0 owns nothing). Every instance
// computes the placement itself from the candidates the store lists, so no coordinator
// is needed: the preferred owner campaigns first when a shard is vacant, and asks any
// other owner for a graceful transfer (with the usual drain) when it joins, a few shards
// at a time. On shutdown an instance hands all its shards over at once; after a crash its
// shards move once its lease runs out, as any election's key does.
//
// Changing Shards re-maps keys to shards: it is a planned operation (see docs/shards.md).
type ShardSet struct {
	// Shards is the number of shards, from 1 to 65536. Every instance of the fleet must
	// use the same number. Required.
	Shards int `json:"shards,omitempty"`

	// MaxMoves bounds how many shards this instance draws to itself at once when it
	// joins the fleet (or becomes healthy, or raises its priority): each move is a
	// graceful transfer that drains the previous owner. Default: 4.
	MaxMoves int `json:"max_moves,omitempty"`
}

// Limits of a shard set.
const (
	maxShards       = 1 << 16
	DefaultMaxMoves = 4
)

// shardSet is a provisioned shard set: its elections, in shard order.
type shardSet struct {
	name      string
	elections []*elector.Election
}

// shardElection is the name of shard s's election in set.
func shardElection(set string, s int) string { return set + "." + strconv.Itoa(s) }

// check names the first bad field of the set named name.
func (s *ShardSet) check(name string) error {
	if err := checkShardSetName(name); err != nil {
		return fmt.Errorf("shard_sets: %v", err)
	}
	switch {
	case s.Shards < 1 || s.Shards > maxShards:
		return fmt.Errorf("shard_sets: %s: shards: %d is not from 1 to %d", name, s.Shards, maxShards)
	case s.MaxMoves < 0:
		return fmt.Errorf("shard_sets: %s: max_moves: %d is negative", name, s.MaxMoves)
	}
	return nil
}

// checkShardSetName checks a shard set's name: an election name without a dot, so that
// no shard's election (`<set>.<n>`) can be another set's.
func checkShardSetName(name string) error {
	if err := checkElectionName(name); err != nil || strings.Contains(name, ".") {
		return fmt.Errorf("shard set name %q must be non-empty and have no white space, slash or dot", name)
	}
	return nil
}

// shardSet returns the provisioned shard set named name, joining its elections (as this
// config's users) on first use.
func (a *App) shardSet(name string) (*shardSet, error) {
	if set, ok := a.shardSets[name]; ok {
		return set, nil
	}
	cfg, ok := a.ShardSets[name]
	if !ok {
		return nil, fmt.Errorf("no shard set %q is configured in the leader app (add `shards %s <count>` to the global leader option)", name, name)
	}
	if running := a.runningShardCount(name); running != 0 && running != cfg.Shards {
		// The running set's elections are shared with this config (one per name in the
		// process), and would route keys by the new count while they still own shards
		// placed by the old one: a key would get a second owner.
		return nil, fmt.Errorf("shard_sets: %s: shards: %d, but this process runs the set with %d: a set's count cannot change with a reload (docs/shards.md: start a set under a new name, move the routes to it, then remove the old one)",
			name, cfg.Shards, running)
	}
	moves := cfg.MaxMoves
	if moves == 0 {
		moves = DefaultMaxMoves
	}
	slots := make(chan struct{}, moves)
	set := &shardSet{name: name, elections: make([]*elector.Election, cfg.Shards)}
	// One beacon per renewal carries the heartbeats of every shard this instance owns,
	// where the store can order it with the keys (etcd); elsewhere each key is rewritten.
	a.candidate.GroupHeartbeats(name)
	summary := a.candidate.MoveLog(name, cfg.Shards)
	for s := range set.elections {
		e := a.election(shardElection(name, s))
		shard := s
		e.SetPlacement(func(id string, priority int) float64 { return shards.Score(id, shard, priority) }, slots)
		e.ShareRegistry(name)
		termconn.For(e).SetMetricGroup(name)
		e.SetMoveLog(summary)
		set.elections[s] = e
	}
	a.shardSets[name] = set
	shardSetsInUse.Store(name, cfg.Shards)
	return set, nil
}

// runningShardCount is the count of set as the elections this process runs show it (one
// more than the highest shard), 0 when it runs none of the set's shards.
func (a *App) runningShardCount(set string) int {
	count := 0
	for _, e := range a.candidate.Elections() {
		name := e.Name()
		if !strings.HasPrefix(name, set+".") {
			continue
		}
		if n, err := strconv.Atoi(name[len(set)+1:]); err == nil && n >= count {
			count = n + 1
		}
	}
	return count
}

// startShardSet starts the elections of set once the store shows that this instance's count
// is the fleet's (see elector.Candidate.FleetShardCount). An instance with another count
// never campaigns in the set: its gates, matchers and upstreams know no owner of any shard,
// so it admits and forwards none of the set's requests, and it says why.
func (a *App) startShardSet(set *shardSet) {
	own := len(set.elections)
	fleet, err := a.candidate.RetryFleetShardCount(a.ctx, set.name, own)
	if err != nil {
		return // this config was replaced or stopped before the store answered
	}
	if fleet != own {
		shardCountProblems.Store(set.name, fmt.Sprintf("this instance has %d shards in set %q but the fleet has %d (the count published in the store): it owns, admits and routes none of the set's keys; configure `shards %s %d` (docs/shards.md tells how to change a set's count)",
			own, set.name, fleet, set.name, fleet))
		a.logger.Error("this instance's shard count differs from the fleet's: a key would hash to another shard than on the rest of the fleet, so this instance stays out of the set: it owns, admits and routes none of its keys",
			zap.String("set", set.name), zap.Int("shards", own), zap.Int("fleet_shards", fleet))
		return
	}
	shardCountProblems.Delete(set.name)
	if a.ctx.Err() != nil {
		return // replaced meanwhile: the new config starts what it keeps
	}
	for _, e := range set.elections {
		e.Start()
	}
}

// shardCountProblems maps the name of every shard set whose count in this process differs
// from the fleet's to a sentence that says so, for the admin API and `caddy leader status`.
var shardCountProblems sync.Map

// shardCountProblem is the problem with set's count, if any.
func shardCountProblem(set string) string {
	p, _ := shardCountProblems.Load(set)
	s, _ := p.(string)
	return s
}

// unmarshalShardSet parses, in the leader global option,
//
//	shards <name> <count> {
//		max_moves <n>
//	}
func unmarshalShardSet(d *caddyfile.Dispenser) (string, *ShardSet, error) {
	var name, count string
	if !d.NextArg() {
		return "", nil, d.ArgErr()
	}
	name = d.Val()
	if err := checkShardSetName(name); err != nil {
		return "", nil, d.Errf("shards: %v", err)
	}
	if !d.NextArg() {
		return "", nil, d.Errf("shards %s: the number of shards is missing", name)
	}
	count = d.Val()
	set := new(ShardSet)
	n, err := strconv.Atoi(count)
	if err != nil || n < 1 || n > maxShards {
		return "", nil, d.Errf("shards %s: %q is not a number of shards from 1 to %d", name, count, maxShards)
	}
	set.Shards = n
	if d.NextArg() {
		return "", nil, d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch d.Val() {
		case "max_moves":
			var v string
			if err := oneArg(d, &v); err != nil {
				return "", nil, err
			}
			m, err := strconv.Atoi(v)
			if err != nil || m < 1 {
				return "", nil, d.Errf("max_moves: %q is not a whole number of at least 1", v)
			}
			set.MaxMoves = m
		default:
			return "", nil, d.Errf("shards: unknown option %q (the option is max_moves)", d.Val())
		}
	}
	return name, set, nil
}

// unmarshalShardRoute parses `shard <set> <key>` into set and key, for the gate and the
// leader upstreams.
func unmarshalShardRoute(d *caddyfile.Dispenser, set, key *string) error {
	if *set != "" {
		return d.Errf("shard: already set to %q", *set)
	}
	args := d.RemainingArgs()
	if len(args) != 2 {
		return d.Err("shard: wants a shard set and the request's key, as in `shard rooms {http.request.uri.path.1}`")
	}
	if err := checkShardSetName(args[0]); err != nil {
		return d.Errf("shard: %v", err)
	}
	if _, err := parseShardKey(args[1]); err != nil {
		return d.Errf("shard: %v", err)
	}
	*set, *key = args[0], args[1]
	return nil
}

// shardSetsInUse maps the name of every shard set of the configs loaded in this process to
// its number of shards, so that process-wide reporting (metrics, events, the admin API)
// can tell a shard's election from a plain one and sum a set's shards instead of showing
// each.
var shardSetsInUse sync.Map

// shardOf reports whether the election named election is a shard of a set in use, and
// which.
func shardOf(election string) (set string, shard int, ok bool) {
	dot := strings.LastIndexByte(election, '.')
	if dot < 0 {
		return "", 0, false
	}
	count, ok := shardSetsInUse.Load(election[:dot])
	if !ok {
		return "", 0, false
	}
	n, err := strconv.Atoi(election[dot+1:])
	if err != nil || n < 0 || n >= count.(int) || strconv.Itoa(n) != election[dot+1:] {
		return "", 0, false
	}
	return election[:dot], n, true
}

// metricLabel is the election label of election's metrics: its shard set's name for a
// shard's election (a set is counted as one), else its own name.
func metricLabel(election string) string {
	if set, _, ok := shardOf(election); ok {
		return set
	}
	return election
}

// checkShardRoute checks the shard options of a gate, matcher or upstream source: a set and
// its key come together, without an election; it names the first bad field.
func checkShardRoute(election, set, key string) error {
	switch {
	case set == "" && key == "":
		return nil
	case set == "":
		return errors.New("shard_key: needs shard_set")
	case key == "":
		return fmt.Errorf("shard_set: %q needs shard_key, the request's key", set)
	case election != "":
		return fmt.Errorf("election: one election or one shard set, not both (%q and set %q)", election, set)
	}
	if err := checkShardSetName(set); err != nil {
		return fmt.Errorf("shard_set: %v", err)
	}
	if _, err := parseShardKey(key); err != nil {
		return fmt.Errorf("shard_key: %v", err)
	}
	return nil
}

// joinShardSet is how a matcher or upstream source named module that routes by key
// provisions (as joinElection for an election): it checks the options, finds the leader
// app and its shard set, and returns them with the parsed key.
func joinShardSet(ctx caddy.Context, module, election, setName, key string) (*App, *shardSet, shardKey, error) {
	if err := checkShardRoute(election, setName, key); err != nil {
		return nil, nil, shardKey{}, fmt.Errorf("%s: %v", module, err)
	}
	app, err := appFrom(ctx, module)
	if err != nil {
		return nil, nil, shardKey{}, err
	}
	set, err := app.shardSet(setName)
	if err != nil {
		return nil, nil, shardKey{}, fmt.Errorf("%s: shard_set: %v", module, err)
	}
	k, _ := parseShardKey(key) // checked
	return app, set, k, nil
}
