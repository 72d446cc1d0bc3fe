// Package caddyleader lets a fleet of Caddy instances elect one leader through etcd and
// serve chosen routes only on that leader. The `leader` app campaigns; the `leader_gate`
// handler admits a request on the leader and rejects, redirects or forwards it elsewhere;
// the `leader` matcher routes on leadership and the `leader_candidate` matcher on being a
// healthy candidate; the `leader` dynamic upstream source points reverse_proxy at the
// leader; and the `admin.api.leader` module reports elections and takes resign and
// transfer requests.
package caddyleader

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"go.uber.org/zap"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/etcdbackend"
	"github.com/caddyleader/caddy-leader/internal/termconn"

	// The status page registers its own modules (http.handlers.leader_status and
	// admin.api.leader_status); importing it here puts them in every build of the plugin.
	_ "github.com/caddyleader/caddy-leader/statuspage"
)

func init() {
	caddy.RegisterModule(App{})
	caddy.RegisterModule(Gate{})
	caddy.RegisterModule(Matcher{})
}

// Defaults of the leader app.
const (
	DefaultPrefix       = "/caddy-leader/"
	DefaultTTL          = 10 * time.Second
	DefaultDialTimeout  = 5 * time.Second
	DefaultDrainTimeout = 10 * time.Second
	DefaultElection     = "default"

	// maxTTL is where a TTL stops making sense: failover after a crash takes a TTL.
	maxTTL = time.Hour
)

// App is the `leader` app. It owns the connection to the coordination store (etcd by
// default, or a `leader.stores.*` module such as `postgres`) and this instance's candidacy
// in every election that the configuration uses: those named by `leader_gate` handlers,
// `leader` and `leader_candidate` matchers and `leader` dynamic upstream sources, and those
// listed in Elections. On etcd each election is one key, `<prefix><election>`, created by a
// compare-and-swap transaction and bound to this instance's lease; its create revision is
// the term's fencing token.
//
// The candidacy survives config reloads: a reload that keeps the same store settings (for
// etcd: endpoints, prefix, dial_timeout, tls and its CA file's contents, username and
// password), ttl, instance_id and advertise neither resigns nor campaigns again (a new drain_timeout, priority or preempt applies at once). On
// shutdown the instance stops admitting gated requests, lets admitted ones finish (up to
// drain_timeout) and revokes its lease so that another instance takes over at once.
type App struct {
	// EtcdStore holds the options of the default store, etcd: endpoints, prefix,
	// dial_timeout, tls, username and password, set at the top level of the app. They are
	// ignored (and must not be set) when store is.
	EtcdStore

	// Store is the coordination store to elect through, a `leader.stores.*` module:
	// `etcd` or `postgres`, or one a plugin adds. Default: etcd, configured by the
	// top-level options above.
	StoreRaw json.RawMessage `json:"store,omitempty" caddy:"namespace=leader.stores inline_key=module"`

	// TTL is the lease TTL: how long after this instance stops renewing (crash, freeze,
	// partition) another instance can take over. A whole number of seconds, from 1s to
	// 1h; the lease is renewed every ttl/3. Default: 10s.
	TTL caddy.Duration `json:"ttl,omitempty"`

	// InstanceID names this instance in the election keys, logs and placeholders. It must
	// be unique within the fleet. Placeholders are expanded. Default: the host name.
	InstanceID string `json:"instance_id,omitempty"`

	// Advertise is the URL at which peers and clients reach this instance when it leads,
	// such as `http://10.0.0.5:8080`, with no query or fragment. It is written into the
	// election key and is required for `follower redirect`, `follower forward` and the
	// `leader` dynamic upstream source. Placeholders are expanded. Default: none, and
	// followers can then only reject.
	Advertise string `json:"advertise,omitempty"`

	// DrainTimeout bounds how long a leader that hands over (shutdown, resign, config
	// without the election) waits for admitted gated requests to finish before it
	// releases the key anyway. Default: 10s.
	DrainTimeout caddy.Duration `json:"drain_timeout,omitempty"`

	// Elections lists elections to take part in even if no handler or matcher uses them,
	// for instance to stand by as a candidate for a gate configured elsewhere. Names are
	// non-empty and have no white space or slash. Default: none.
	Elections []string `json:"elections,omitempty"`

	// ShardSets are named sets of shards, each a fixed number of elections spread over
	// the fleet so that every key has one owner (see ShardSet). `leader_gate` and the
	// `leader` upstreams route a request to its key's shard with `shard <set> <key>`.
	// Default: none.
	ShardSets map[string]*ShardSet `json:"shard_sets,omitempty"`

	// Priority ranks this instance among the candidates free to take a vacant election key
	// (Patroni's failover_priority): the highest wins, because each waits a short step
	// per live, healthy candidate of higher priority before it campaigns. 0 means this
	// instance never campaigns: it only follows (rejects, redirects, forwards), like
	// Patroni's nofailover, and a transfer to it is refused. A reload may change it
	// without starting a new candidacy. Default: 1.
	Priority *int `json:"priority,omitempty"`

	// Preempt makes this instance, while healthy, ask a leader of lower priority to hand
	// over to it, gracefully, as `caddy leader transfer` does: the leader drains first,
	// and is never deposed by force. A reload may change it. Default: false.
	Preempt bool `json:"preempt,omitempty"`

	// StepDown, if set, probes the local service and makes this instance resign and hold
	// off from its elections while the service is unhealthy (keepalived's track_script).
	// It belongs to the config, not the candidacy: a reload may add, change or drop it
	// without starting a new candidacy. Default: none.
	StepDown *StepDown `json:"step_down_when_unhealthy,omitempty"`

	// Failsafe, if set, lets the leader ride out an outage of the store while every live
	// candidate confirms it (see Failsafe). Every instance of the fleet should set it:
	// one without it never confirms, so with it in the roster no leader rides out an
	// outage. An instance without it still respects another's failsafe: before it leads
	// after a term that did not end cleanly, it has a member of that term's roster stop
	// confirming it. Default: off: without the store nobody leads.
	Failsafe *Failsafe `json:"failsafe,omitempty"`

	// Jobs are leader-only scheduled jobs, by name (see Job): once per slot across the
	// fleet, the leader of each job's election sends the job's HTTP request. A reload
	// that keeps a job's name and election keeps its runner, and a run under way goes
	// on. Default: none.
	Jobs map[string]*Job `json:"jobs,omitempty"`

	candidate *elector.Candidate
	backend   elector.Backend // the candidacy's, which keeps the jobs' records
	observer  *candidateObserver
	ctx       caddy.Context
	poolKey   string
	elections map[string]*elector.Election
	shardSets map[string]*shardSet
	logger    *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "leader",
		New: func() caddy.Module { return new(App) },
	}
}

// candidates keeps each candidacy alive across config reloads: a reload provisions the new
// config (LoadOrNew finds the running candidate) before cleaning up the old one (Delete),
// so the reference count never reaches zero while some config still uses it.
var candidates = caddy.NewUsagePool()

// pooledCandidate destroys a candidacy when the last config using it is gone.
type pooledCandidate struct {
	*elector.Candidate
	failsafe *failsafeServer // nil without failsafe
	store    string          // the store's module id (leader.stores.etcd, ...), for messages
	backend  elector.Backend
}

// Destruct implements caddy.Destructor: hand over and leave the fleet.
func (p pooledCandidate) Destruct() error {
	ctx, cancel := context.WithTimeout(context.Background(), p.HandoverTimeout())
	defer cancel()
	err := p.Close(ctx)
	if p.failsafe != nil {
		err = errors.Join(err, p.failsafe.close())
	}
	return err
}

// Provision implements caddy.Provisioner. It expands placeholders, fills in defaults,
// checks every field, and joins (or creates, without any network I/O) the candidacy.
func (a *App) Provision(ctx caddy.Context) error {
	a.logger = ctx.Logger()
	a.elections = make(map[string]*elector.Election)
	a.shardSets = make(map[string]*shardSet)
	if err := a.expandAndDefault(); err != nil {
		return err
	}
	if err := a.check(); err != nil {
		return err
	}
	store, err := a.loadStore(ctx)
	if err != nil {
		return err
	}
	key, err := json.Marshal([]any{store.StoreKey(), a.TTL, a.InstanceID, a.Advertise, a.Failsafe.key()})
	if err != nil {
		return err
	}
	a.poolKey = string(key)
	val, _, err := candidates.LoadOrNew(a.poolKey, func() (caddy.Destructor, error) {
		backend, err := store.NewBackend(caddy.Log().Named("leader"))
		if err != nil {
			return nil, err
		}
		c, err := elector.NewCandidate(elector.Config{
			ID:           a.InstanceID,
			URL:          a.Advertise,
			TTL:          time.Duration(a.TTL),
			DrainTimeout: time.Duration(a.DrainTimeout),
			Backend:      backend,
			Priority:     a.electorPriority(),
			Preempt:      a.Preempt,
			Failsafe:     a.Failsafe.electorConfig(),
			Fence:        a.Failsafe.fence(),
		})
		if err != nil {
			return nil, err
		}
		p := pooledCandidate{Candidate: c, store: "the store", backend: backend}
		if m, ok := store.(caddy.Module); ok {
			p.store = m.CaddyModule().ID.Name() + " (" + string(m.CaddyModule().ID) + ")"
		}
		if a.Failsafe != nil {
			if p.failsafe, err = startFailsafeServer(a.Failsafe, c, caddy.Log().Named("leader.failsafe")); err != nil {
				return nil, err
			}
		}
		return p, nil
	})
	if err != nil {
		a.poolKey = ""
		return err
	}
	a.candidate, a.backend = val.(pooledCandidate).Candidate, val.(pooledCandidate).backend
	a.candidate.SetLogger(a.logger)
	if err := registerMetrics(ctx.GetMetricsRegistry()); err != nil {
		return fmt.Errorf("registering metrics: %v", err)
	}
	shardCount := 0
	for _, set := range a.ShardSets {
		shardCount += set.Shards
	}
	observer, err := newCandidateObserver(ctx, a.InstanceID, shardCount)
	if err != nil {
		return fmt.Errorf("loading the events app: %v", err)
	}
	a.candidate.SetObserver(observer)
	a.observer, a.ctx = observer, ctx
	if err := observer.events.On("stopping", exitHandover{a}); err != nil {
		return err
	}
	a.candidate.SetDrainTimeout(time.Duration(a.DrainTimeout))
	a.candidate.SetPriority(a.electorPriority(), a.Preempt)
	for _, name := range a.Elections {
		a.election(name)
	}
	// Every configured set campaigns, used by a route or not: an instance stands by for
	// its shards wherever the requests are routed.
	for name := range a.ShardSets {
		if _, err := a.shardSet(name); err != nil {
			return err
		}
	}
	return a.provisionJobs()
}

func (a *App) expandAndDefault() error {
	if a.StoreRaw == nil {
		if err := a.EtcdStore.expandAndDefault(); err != nil {
			return err
		}
	}
	repl := caddy.NewReplacer()
	a.InstanceID = repl.ReplaceKnown(a.InstanceID, "")
	a.Advertise = repl.ReplaceKnown(a.Advertise, "")
	if a.StepDown != nil {
		a.StepDown.provision()
	}
	if a.Failsafe != nil {
		a.Failsafe.provision(a.Advertise)
	}
	if a.TTL == 0 {
		a.TTL = caddy.Duration(DefaultTTL)
	}
	if a.DrainTimeout == 0 {
		a.DrainTimeout = caddy.Duration(DefaultDrainTimeout)
	}
	if a.InstanceID == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			return fmt.Errorf("instance_id: not set and the host name is unknown (%v): set instance_id", err)
		}
		a.InstanceID = host
	}
	return nil
}

// electorPriority is the priority option as elector.Config.Priority takes it.
func (a *App) electorPriority() int {
	switch {
	case a.Priority == nil:
		return elector.DefaultPriority
	case *a.Priority == 0:
		return elector.NeverLead
	}
	return *a.Priority
}

// loadStore provisions the store module, or the top-level etcd options when there is none.
func (a *App) loadStore(ctx caddy.Context) (Store, error) {
	if a.StoreRaw == nil {
		// expandAndDefault and check did the rest.
		if err := a.EtcdStore.load(); err != nil {
			return nil, err
		}
		return &a.EtcdStore, nil
	}
	if a.EtcdStore.set() {
		return nil, fmt.Errorf("store: the top-level etcd options (endpoints, prefix, dial_timeout, tls, username, password) configure the default store; with store, set them inside it")
	}
	mod, err := ctx.LoadModule(a, "StoreRaw")
	if err != nil {
		return nil, fmt.Errorf("store: %v", err)
	}
	store, ok := mod.(Store)
	if !ok {
		return nil, fmt.Errorf("store: module %T is not a leader store", mod)
	}
	return store, nil
}

// check names the first field that is wrong and why.
func (a *App) check() error {
	if a.StoreRaw == nil {
		if err := a.EtcdStore.check(); err != nil {
			return err
		}
	}
	if err := checkTTL(time.Duration(a.TTL)); err != nil {
		return fmt.Errorf("ttl: %v", err)
	}
	if a.Preempt && a.Priority != nil && *a.Priority == 0 {
		return errors.New("preempt: an instance with priority 0 never leads, so it cannot preempt; remove preempt or give it a priority above 0")
	}
	if a.DrainTimeout < 0 {
		return fmt.Errorf("drain_timeout: %s is negative", time.Duration(a.DrainTimeout))
	}
	if err := checkInstanceID(a.InstanceID); err != nil {
		return fmt.Errorf("instance_id: %v", err)
	}
	if a.Advertise != "" {
		if err := checkAdvertise(a.Advertise); err != nil {
			return fmt.Errorf("advertise: %v", err)
		}
	}
	for _, name := range a.Elections {
		if err := checkElectionName(name); err != nil {
			return fmt.Errorf("elections: %v", err)
		}
		if err := a.checkNotShard(name); err != nil {
			return fmt.Errorf("elections: %v", err)
		}
	}
	if a.Priority != nil && *a.Priority < 0 {
		return fmt.Errorf("priority: %d is negative (0 never campaigns)", *a.Priority)
	}
	for name, set := range a.ShardSets {
		if set == nil {
			return fmt.Errorf("shard_sets: %s: empty; it needs `shards`", name)
		}
		if err := set.check(name); err != nil {
			return err
		}
	}
	if a.Failsafe != nil {
		if err := a.Failsafe.check(time.Duration(a.TTL)); err != nil {
			return err
		}
	}
	if err := a.checkJobs(); err != nil {
		return err
	}
	if a.StepDown != nil {
		return a.StepDown.check()
	}
	return nil
}

// The checks below serve both Provision (JSON) and the Caddyfile parser, which runs them at
// adapt time so that the error carries the Caddyfile line. Their errors leave the field's
// name to the caller.

// checkEndpoint checks an etcd endpoint's form and that its port is a TCP port.
func checkEndpoint(ep string) error {
	if strings.Contains(ep, ",") {
		return fmt.Errorf("endpoint %q holds a comma: separate endpoints with spaces", ep)
	}
	if err := etcdbackend.CheckEndpoint(ep); err != nil {
		return err
	}
	hostport := ep
	if u, err := url.Parse(ep); err == nil && strings.Contains(ep, "://") {
		hostport = u.Host
	}
	host, port, _ := net.SplitHostPort(hostport)
	if err := checkPort(port); err != nil {
		return fmt.Errorf("endpoint %q: %v", ep, err)
	}
	// A mistyped scheme (`http//h:2379`, `http:/h:2379`) would otherwise pass as a host.
	if net.ParseIP(host) == nil && strings.Trim(host, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_") != "" {
		return fmt.Errorf("endpoint %q: host %q is neither a host name nor an IP address", ep, host)
	}
	return nil
}

// checkPort checks that a URL's or host:port's port is a TCP port number, which neither
// url.Parse nor net.SplitHostPort does.
func checkPort(port string) error {
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("port %q is not a number from 1 to 65535", port)
	}
	return nil
}

// checkTTL checks a lease TTL against what the elector and etcd accept and what makes sense.
func checkTTL(ttl time.Duration) error {
	switch {
	case ttl < elector.MinTTL:
		return fmt.Errorf("%s is below the minimum of %s", ttl, elector.MinTTL)
	case ttl > maxTTL:
		return fmt.Errorf("%s is above the maximum of %s (failover after a crash takes one ttl)", ttl, maxTTL)
	case ttl%time.Second != 0:
		return fmt.Errorf("%s is not a whole number of seconds (etcd leases count in seconds)", ttl)
	}
	return nil
}

// checkAdvertise checks the URL peers and clients reach this instance at.
func checkAdvertise(advertise string) error {
	u, err := url.Parse(advertise)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%q is not an http:// or https:// URL with a host", advertise)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("%q must not have a query or fragment", advertise)
	}
	if port := u.Port(); port != "" {
		if err := checkPort(port); err != nil {
			return fmt.Errorf("%q: %v", advertise, err)
		}
	}
	return nil
}

func checkInstanceID(id string) error {
	if strings.ContainsAny(id, " \t\r\n") {
		return fmt.Errorf("%q contains white space", id)
	}
	return nil
}

func checkElectionName(name string) error {
	// Beside each election key live <key>/intent and <key>/candidates/: a slash in a
	// name could make one election's key another's.
	if name == "" || strings.ContainsAny(name, " \t\r\n/") {
		return fmt.Errorf("election name %q must be non-empty and have no white space or slash", name)
	}
	return nil
}

// checkNotShard refuses a plain election named as one of the app's shard sets or as one of
// its shards (`<set>.<n>`): the latter would silently be that shard, and either would
// report its metrics under the set's label, which makes /metrics fail for the whole
// instance.
func (a *App) checkNotShard(name string) error {
	set, _, _ := strings.Cut(name, ".")
	if cfg, ok := a.ShardSets[set]; ok && cfg != nil {
		return fmt.Errorf("election name %q clashes with shard set %q, whose shards are the elections %s to %s: rename the election or the set",
			name, set, shardElection(set, 0), shardElection(set, cfg.Shards-1))
	}
	return nil
}

// election returns the named election and makes this config one of its users.
func (a *App) election(name string) *elector.Election {
	if e, ok := a.elections[name]; ok {
		return e
	}
	e := a.candidate.Election(name)
	a.elections[name] = e
	// The connections cut when a term ends are reported with this config's events app.
	termconn.For(e).SetReporter(a.observer.connectionsCut)
	return e
}

// Start implements caddy.App: keep a lease and campaign in every election this config uses.
// It returns at once; an unreachable etcd only delays leadership (gated routes fail closed).
func (a *App) Start() error {
	a.candidate.Start()
	inSet := make(map[*elector.Election]bool)
	for _, set := range a.shardSets {
		for _, e := range set.elections {
			inSet[e] = true
		}
		go a.startShardSet(set)
	}
	for _, e := range a.elections {
		if !inSet[e] {
			e.Start()
		}
	}
	if a.StepDown != nil {
		go a.watchHealth(a.ctx)
	}
	a.startJobs()
	return nil
}

// exitHandover hands leadership over on Caddy's `stopping` event, which is emitted before
// any app stops: when the process is exiting, leadership is handed over while the HTTP
// server still serves, so that requests reaching this instance during its shutdown are
// forwarded or redirected to the successor instead of failing.
type exitHandover struct{ app *App }

// Handle implements caddyevents.Handler.
func (h exitHandover) Handle(context.Context, caddy.Event) error {
	if caddy.Exiting() {
		return h.app.leave()
	}
	return nil
}

// leave hands over every election and campaigns no more; Destruct revokes the lease.
//
// A peer that has not yet heard of the release may still forward a request here, on a
// connection it keeps alive; once the HTTP server shuts down, such a request fails with a
// reset connection, which the peer cannot tell from one the application saw, so it cannot
// send it on. So the process lingers, serving, until this instance itself has seen who
// leads next (its watch hears of it as early as the peers' do), and exitLinger after that:
// requests forwarded meanwhile are refused as "not leader" and sent on by the peer. The
// successor does not wait for any of it.
func (a *App) leave() error {
	ctx, cancel := context.WithTimeout(context.Background(), a.candidate.HandoverTimeout())
	defer cancel()
	var led []*elector.Election
	for _, e := range a.candidate.Elections() {
		if e.Term().Holds() {
			led = append(led, e)
		}
	}
	err := a.candidate.Leave(ctx)
	if len(led) > 0 {
		linger, stop := context.WithTimeout(context.Background(), exitLingerMax)
		defer stop()
		for _, e := range led {
			for linger.Err() == nil {
				changed := e.Changed()
				if t := e.Term(); t.LeaderKnown() && !t.Holds() {
					break
				}
				select {
				case <-changed:
				case <-linger.Done():
				}
			}
		}
		time.Sleep(exitLinger)
	}
	return err
}

// exitLinger is how long an exiting leader goes on serving after it has seen its
// successor (see App.leave): a peer's watch hears of the release within a round trip of
// this instance's; exitLingerMax bounds the wait for the successor itself.
const (
	exitLinger    = 25 * time.Millisecond
	exitLingerMax = time.Second
)

// Stop implements caddy.App. On a reload it does nothing: the next config keeps the
// candidacy. When the process exits it hands over (if the `stopping` event did not already),
// instead of after the HTTP server's grace period, so that the fleet has a new leader as
// soon as possible.
func (a *App) Stop() error {
	if !caddy.Exiting() {
		return nil
	}
	return a.leave()
}

// Cleanup implements caddy.CleanerUpper. It also runs after a failed Provision, so it
// tolerates a half-provisioned app.
func (a *App) Cleanup() error {
	// The runners first: a runner that stops cancels its run before its elections go.
	jobsErr := a.cleanupJobs()
	if a.candidate != nil {
		for _, e := range a.elections {
			a.candidate.Release(e)
		}
	}
	if a.poolKey != "" {
		_, err := candidates.Delete(a.poolKey)
		return errors.Join(jobsErr, err)
	}
	return jobsErr
}

// joinElection is how a handler, matcher or upstream source named module provisions: it
// defaults and checks the election name in *name, finds the leader app, and joins the
// election as one of the config's users.
func joinElection(ctx caddy.Context, module string, name *string) (*App, *elector.Election, error) {
	if *name == "" {
		*name = DefaultElection
	}
	if err := checkElectionName(*name); err != nil {
		return nil, nil, fmt.Errorf("%s: election: %v", module, err)
	}
	app, err := appFrom(ctx, module)
	if err != nil {
		return nil, nil, err
	}
	if err := app.checkNotShard(*name); err != nil {
		return nil, nil, fmt.Errorf("%s: election: %v", module, err)
	}
	return app, app.election(*name), nil
}

// appFrom finds the leader app of the config being provisioned, for a handler or matcher.
func appFrom(ctx caddy.Context, module string) (*App, error) {
	v, err := ctx.AppIfConfigured("leader")
	switch {
	case errors.Is(err, caddy.ErrNotConfigured):
		return nil, fmt.Errorf("%s: needs the leader app, which is not configured: add the global `leader { endpoints ... }` option (Caddyfile) or apps.leader (JSON)", module)
	case err != nil:
		return nil, fmt.Errorf("%s: the leader app failed to load: %v", module, err)
	}
	return v.(*App), nil
}

// Interface guards
var (
	_ caddy.App           = (*App)(nil)
	_ caddy.Provisioner   = (*App)(nil)
	_ caddy.CleanerUpper  = (*App)(nil)
	_ caddy.Destructor    = pooledCandidate{}
	_ caddyevents.Handler = exitHandover{}
)
