package safety

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/faultproxy"
	"github.com/caddyleader/caddy-leader/internal/testkit/fleet"
)

// Bounds and defaults of a scenario.
const (
	// DefaultRate is the clients' requests per second over the whole fleet.
	DefaultRate = 150
	// DefaultWarmup is how long the clients send before the fault.
	DefaultWarmup = 1500 * time.Millisecond
	// ClientTimeout bounds one client request; a frozen instance answers only after
	// SIGCONT.
	ClientTimeout = 10 * time.Second
	// RecoverTimeout bounds the fleet agreeing on a leader again after a fault.
	RecoverTimeout = 30 * time.Second
	// electTimeout bounds a fresh fleet agreeing on its first leader.
	electTimeout = 15 * time.Second
)

// Env is one fleet's world: the store S it elects through, each instance's fault proxies
// to it, the recording backend behind /gated, and the fleet with the leader it agreed on.
type Env[S any] struct {
	T *testing.T
	// Store is the store the fleet elects through, for the faults that strike it.
	Store S
	// Bin is the Caddy binary the fleet runs.
	Bin string
	// Links are each instance's links to the store, by instance id.
	Links   map[string][]*faultproxy.Proxy
	Backend *Backend
	Cfg     fleet.Config
	Fleet   []*fleet.Instance
	Leader  *fleet.Instance
	Token   int64
	// Shards is every shard's owner and term that the fleet agreed on last (with
	// Cfg.Shards): after Launch and after each scenario.
	Shards []fleet.ShardView
	// Client is the clients' HTTP client.
	Client *http.Client
}

// NewEnv starts the recording backend and returns a world whose fleet (not yet launched)
// runs bin with cfg, its gated requests proxied to the backend.
func NewEnv[S any](t *testing.T, bin string, store S, cfg fleet.Config) *Env[S] {
	t.Helper()
	env := &Env[S]{T: t, Store: store, Bin: bin, Backend: StartBackend(t), Links: map[string][]*faultproxy.Proxy{}, Cfg: cfg}
	env.Cfg.Backend = env.Backend.Server.URL
	return env
}

// LinkEach puts a fault proxy to target (host:port) of its own before each of n
// instances, c0 to c<n-1> (fleet.StartInstances' ids), and gives each the store config
// that store makes from its id and its proxy's address.
func (env *Env[S]) LinkEach(n int, target string, store func(id, addr string) map[string]any) {
	t := env.T
	t.Helper()
	if env.Cfg.InstanceStore == nil {
		env.Cfg.InstanceStore = map[string]map[string]any{}
	}
	for i := range n {
		id := fmt.Sprintf("c%d", i)
		p, err := faultproxy.New(target)
		if err != nil {
			t.Fatalf("fault proxy %s -> %s: %v", id, target, err)
		}
		t.Cleanup(func() { p.Close() })
		env.Links[id] = []*faultproxy.Proxy{p}
		env.Cfg.InstanceStore[id] = store(id, p.Addr())
	}
}

// TTL is the fleet's lease ttl.
func (env *Env[S]) TTL() time.Duration {
	if d, err := time.ParseDuration(env.Cfg.TTL); err == nil {
		return d
	}
	return fleet.DefaultTTL
}

// Launch starts a fleet of n with env.Cfg, waits for its leader, and makes the clients'
// HTTP client.
func (env *Env[S]) Launch(t *testing.T, n int) {
	t.Helper()
	env.LaunchWithin(t, n, electTimeout)
}

// LaunchWithin is Launch with a bound of its own on the fleet agreeing on its leader and
// placing its shards (a fleet of thousands of shards takes longer).
func (env *Env[S]) LaunchWithin(t *testing.T, n int, within time.Duration) {
	t.Helper()
	env.Fleet = fleet.StartInstances(t, env.Bin, n, env.Cfg)
	env.Leader, env.Token = fleet.WaitStableLeader(t, env.Fleet, within)
	if env.Cfg.Shards > 0 {
		env.Shards = fleet.WaitShardsPlaced(t, env.Fleet, within)
	}
	transport := &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 64}
	t.Cleanup(transport.CloseIdleConnections)
	env.Client = &http.Client{Transport: transport, Timeout: ClientTimeout}
}

// Cut blackholes every link of in to the store; Heal undoes Cut and Delay.
func (env *Env[S]) Cut(in *fleet.Instance) {
	for _, p := range env.Links[in.ID] {
		p.Blackhole()
	}
}

// Heal undoes Cut and Delay.
func (env *Env[S]) Heal(in *fleet.Instance) {
	for _, p := range env.Links[in.ID] {
		p.Heal()
	}
}

// Delay makes every link of in to the store deliver each chunk d late, in both directions.
func (env *Env[S]) Delay(in *fleet.Instance, d time.Duration) {
	for _, p := range env.Links[in.ID] {
		p.Delay(d)
	}
}

// Post sends one gated POST to in, with the request id the backend records.
func (env *Env[S]) Post(in *fleet.Instance, path, id string) Outcome {
	return env.PostMarked(in, path, id, "")
}

// PostMarked is Post with Caddy-Leader-Forwarded-By set to mark, unless it is empty.
func (env *Env[S]) PostMarked(in *fleet.Instance, path, id, mark string) Outcome {
	req, _ := http.NewRequest(http.MethodPost, in.URL()+path, strings.NewReader(`{"write":"`+id+`"}`))
	req.Header.Set("X-Req-Id", id)
	if mark != "" {
		req.Header.Set("Caddy-Leader-Forwarded-By", mark)
	}
	resp, err := env.Client.Do(req)
	if err != nil {
		return Outcome{ReqID: id, Target: in.ID, Err: err}
	}
	resp.Body.Close()
	return Outcome{ReqID: id, Target: in.ID, Status: resp.StatusCode, RetryAfter: resp.Header.Get("Retry-After")}
}

// WaitArrival waits until the backend has logged request id, and returns its record.
func (env *Env[S]) WaitArrival(id string, within time.Duration, done bool) Arrival {
	env.T.Helper()
	deadline := time.Now().Add(within)
	for {
		for _, a := range env.Backend.Log() {
			if a.ReqID == id && (!done || !a.Done.IsZero()) {
				return a
			}
		}
		if time.Now().After(deadline) {
			what := "arrived at"
			if done {
				what = "finished at"
			}
			env.T.Fatalf("request %s not %s the backend within %v", id, what, within)
		}
		time.Sleep(fleet.PollInterval)
	}
}

// Run is one scenario in progress.
type Run[S any] struct {
	*Env[S]
	Load      *LoadRun             // the clients' load
	FaultAt   time.Time            // when the fault began
	Survivors []*fleet.Instance    // the instances that must agree on a leader at the end
	Extra     []Outcome            // client requests sent besides the load
	Marks     map[string]time.Time // see Mark
	Notes     []string             // the results table's notes, when a check sets none
	// Struck names the shards whose keys the fault struck, when it struck some and not the
	// instance: only they bound the old owner's last admission (see CheckShards).
	Struck []int
}

// Mark records the time of a named moment of the fault, for its checks.
func (s *Run[S]) Mark(name string) { s.Marks[name] = time.Now() }

// Change says what a scenario expects of leadership.
type Change int

const (
	MayChange  Change = iota // safety only: a new term may or may not begin
	MustChange               // a new term must begin after the fault
	NoChange                 // the term in place before the fault must be the only one
)

// Scenario is one fault and what to check of it.
type Scenario[S any] struct {
	Name string        // the subtest's and the results table's
	Load time.Duration // how long the clients send, from the warmup before the fault
	// Warmup is how long the clients send before the fault; 0 means DefaultWarmup.
	Warmup time.Duration
	// Rate is the clients' requests per second; 0 means DefaultRate.
	Rate   int
	Frozen bool // the old leader is frozen: it may be frozen mid-request
	// Renews: the fault slows the leader's links without cutting them, so renewals sent
	// after it can still succeed and move its lease deadline on; its last admission is then
	// not bounded by ttl after the fault (double admission is still checked).
	Renews bool
	// NoErrors: every client request must be answered 200 (no fault, or a graceful one).
	NoErrors bool
	Change   Change
	// Config changes the fleet's configuration, where a test starts a fleet per scenario.
	Config func(*fleet.Config)
	// Fault strikes at the end of the warmup and returns when it and its repair are done.
	Fault func(s *Run[S])
	// Check makes the scenario's own checks of the report.
	Check func(t *testing.T, s *Run[S], rep *Report)
}

// RunOn runs sc on env, whose fleet may have been through scenarios before: only
// the backend's arrivals from this scenario's load on are checked. It leaves env.Leader
// and env.Token at the leader the survivors agree on at the end.
func RunOn[S any](t *testing.T, env *Env[S], sc Scenario[S]) Report {
	warmup, rate := sc.Warmup, sc.Rate
	if warmup == 0 {
		warmup = DefaultWarmup
	}
	if rate == 0 {
		rate = DefaultRate
	}
	s := &Run[S]{Env: env, Survivors: env.Fleet, Marks: map[string]time.Time{}}
	s.Load = NewLoadRun(env.Fleet, env.Client)
	s.Load.Keys = env.Cfg.ShardKeys()
	loadStart := time.Now()
	loaded := make(chan struct{})
	go func() {
		defer close(loaded)
		s.Load.Run(rate, sc.Load)
	}()
	time.Sleep(warmup)
	s.FaultAt = time.Now()
	if sc.Fault != nil {
		sc.Fault(s)
	}
	select {
	case <-loaded:
	case <-time.After(time.Until(loadStart.Add(sc.Load)) + ClientTimeout + 5*time.Second):
		t.Fatalf("the load did not finish")
	}
	loadEnd := loadStart.Add(sc.Load)

	results := append(append([]Outcome(nil), s.Load.Results...), s.Extra...)
	var rep Report
	if env.Cfg.Shards > 0 {
		faulted := ""
		if env.Leader != nil {
			faulted = env.Leader.ID // the instance the fault strikes
		}
		rep = CheckShards(sc.Name, results, env.Backend.Since(loadStart), s.FaultAt, loadEnd, faulted, s.Struck...)
	} else {
		rep = Check(sc.Name, results, env.Backend.Since(loadStart), env.Token, s.FaultAt, loadEnd)
	}
	rep.Frozen = sc.Frozen
	rep.Renews = sc.Renews
	if rep.Notes == "" {
		rep.Notes = strings.Join(s.Notes, "; ")
	}
	if sc.Check != nil {
		sc.Check(t, s, &rep)
	}
	CheckReport(t, sc.Change, &rep, env.TTL())
	if sc.NoErrors {
		CheckNoErrors(t, results)
	}

	// Whatever happened, the fleet must end up with one leader that all agree on, and with
	// every shard at its preferred owner.
	env.Leader, env.Token = fleet.WaitStableLeader(t, s.Survivors, RecoverTimeout)
	env.Fleet = s.Survivors
	if env.Cfg.Shards > 0 {
		env.Shards = fleet.WaitShardsPlaced(t, env.Fleet, RecoverTimeout)
	}
	return rep
}

// CheckReport fails the test for what must never happen, and for what the scenario expects
// of a fleet whose lease ttl is ttl.
func CheckReport(t *testing.T, want Change, rep *Report, ttl time.Duration) {
	t.Helper()
	t.Logf("%s: %s", rep.Scenario, rep.Row())
	for _, p := range rep.Problems {
		t.Log(p)
	}
	if rep.Unstamp > 0 {
		t.Errorf("%d requests reached the backend without a token or gate stamps", rep.Unstamp)
	}
	if rep.Double > 0 {
		t.Errorf("DOUBLE LEADERSHIP: %d requests admitted under an older term after a newer term had admitted", rep.Double)
	}
	if rep.Wrong > 0 {
		t.Errorf("%d requests reached the backend with the token of another instance's term", rep.Wrong)
	}
	if own := rep.Stale - rep.StaleWrong; own > 0 && !rep.Frozen {
		t.Errorf("%d stale arrivals (besides those with a wrong token), and the old leader was not frozen", own)
	}
	switch want {
	case NoChange:
		if rep.Shards > 0 && rep.ShardsMoved > 0 {
			t.Errorf("%d shards moved, want none", rep.ShardsMoved)
		}
		if rep.Shards == 0 && len(rep.Terms) != 1 {
			t.Errorf("terms %v, want the one term from before", rep.Terms)
		}
	case MustChange:
		if rep.Takeover < 0 {
			t.Errorf("no new term served a request after the fault (terms %v)", rep.Terms)
		}
	}
	// A leader cut off, frozen or without its store stops admitting by its lease deadline, at
	// most ttl after the fault; only a graceful stop or a reload can keep it longer.
	if rep.Takeover >= 0 && rep.OldLastAdmit > ttl && !rep.Renews {
		t.Errorf("the old leader admitted requests until %v after the fault, later than its lease deadline allows (ttl %v)", rep.OldLastAdmit, ttl)
	}
}

// CheckNoErrors fails the test for every client request not answered 200.
func CheckNoErrors(t *testing.T, results []Outcome) {
	t.Helper()
	for _, o := range results {
		if o.Status != http.StatusOK {
			t.Errorf("request %s to %s: status %d, error %v; want 200", o.ReqID, o.Target, o.Status, o.Err)
		}
	}
}
