package caddyleader

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/elector/electortest"
	"github.com/caddyleader/caddy-leader/etcdbackend"
	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
	"github.com/caddyleader/caddy-leader/internal/testkit/fleet"
	"github.com/caddyleader/caddy-leader/internal/testkit/freeport"
	"github.com/caddyleader/caddy-leader/jobs"
)

func init() {
	caddy.RegisterModule(memoryStoreModule{})
}

// memoryStores are the in-memory stores the test store module serves, by name.
var memoryStores sync.Map // string -> *electortest.Store

// memoryStoreModule is `leader.stores.jobs_test_.memory`, a store of the tests only: the
// in-memory store of elector/electortest registered under a name, so that a whole config
// (jobs included) can be loaded without a store server. Its id is one level below the
// stores' namespace, so that the lists of stores (caddy.GetModules) do not show it.
type memoryStoreModule struct {
	Name string `json:"name"`
}

func (memoryStoreModule) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "leader.stores.jobs_test_.memory", New: func() caddy.Module { return new(memoryStoreModule) }}
}

func (m memoryStoreModule) StoreKey() string { return "jobs_test_.memory:" + m.Name }

func (m memoryStoreModule) NewBackend(*zap.Logger) (elector.Backend, error) {
	s, ok := memoryStores.Load(m.Name)
	if !ok {
		return nil, fmt.Errorf("no memory store %q", m.Name)
	}
	return s.(*electortest.Store).Client(), nil
}

// newMemoryStore makes an in-memory store that configs name as {"module": "jobs_test_.memory",
// "name": <the test's name>}.
func newMemoryStore(t *testing.T) (*electortest.Store, string) {
	t.Helper()
	s := electortest.NewStore()
	name := t.Name()
	memoryStores.Store(name, s)
	t.Cleanup(func() { memoryStores.Delete(name) })
	return s, name
}

// jobService is the service a job calls: it records every request, and holds each one
// until release is closed if hold is set.
type jobService struct {
	*httptest.Server
	mu       sync.Mutex
	requests []*http.Request
	bodies   []string
	inFlight int
	maxIn    int
	hold     chan struct{}
	arrived  chan struct{}
	status   int
	// cancelled counts the held requests whose client gave up before release.
	cancelled int
}

func newJobService(t *testing.T) *jobService {
	s := &jobService{arrived: make(chan struct{}, 100), status: http.StatusOK}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		// A copy: the server may reuse what it handed the handler once the handler returns.
		s.requests = append(s.requests, r.Clone(context.Background()))
		s.bodies = append(s.bodies, string(body))
		s.inFlight++
		s.maxIn = max(s.maxIn, s.inFlight)
		hold, status := s.hold, s.status
		s.mu.Unlock()
		// Never blocks: with nobody reading (a test that already failed), a run every slot
		// filled the buffer, the handler hung, and with it the server's shutdown and the
		// test binary until its timeout.
		select {
		case s.arrived <- struct{}{}:
		default:
		}
		if hold != nil {
			select {
			case <-hold:
			case <-r.Context().Done():
				s.mu.Lock()
				s.cancelled++
				s.mu.Unlock()
			}
		}
		s.mu.Lock()
		s.inFlight--
		s.mu.Unlock()
		w.WriteHeader(status)
		fmt.Fprint(w, strings.Repeat("x", 600))
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *jobService) seen() ([]*http.Request, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*http.Request(nil), s.requests...), s.maxIn
}

// TestJobRequest: the request of one attempt, its placeholders and headers, and what
// counts as success.
func TestJobRequest(t *testing.T) {
	svc := newJobService(t)
	slot := time.Date(2026, 11, 28, 3, 0, 0, 0, time.UTC)
	run := jobs.Run{Job: "cleanup", Election: "rooms.3", Shard: 3, Slot: slot, Token: 42, Instance: "node-a", Attempt: 2, Missed: 1, Rerun: true}
	req := &JobRequest{
		Method:  http.MethodPost,
		URL:     svc.URL + "/jobs/{http.leader.job.name}?shard={http.leader.shard}&at={http.leader.job.slot_unix}",
		Headers: http.Header{"X-Fencing-Token": {"{http.leader.token}"}},
		Body:    "{http.leader.election} {http.leader.self} {http.leader.job.slot} {http.leader.job.attempt} {http.leader.job.missed} {http.leader.job.rerun} {http.leader.job.manual}",
	}
	if err := req.action()(context.Background(), run); err != nil {
		t.Fatal(err)
	}
	reqs, _ := svc.seen()
	got := reqs[0]
	for _, c := range []struct{ what, got, want string }{
		{"method", got.Method, http.MethodPost},
		{"path", got.URL.Path, "/jobs/cleanup"},
		{"query", got.URL.RawQuery, fmt.Sprintf("shard=3&at=%d", slot.Unix())},
		{"X-Fencing-Token", got.Header.Get("X-Fencing-Token"), "42"},
		{"body", svc.bodies[0], "rooms.3 node-a 2026-11-28T03:00:00Z 2 1 true false"},
		{headerJob, got.Header.Get(headerJob), "cleanup"},
		{headerJobSlot, got.Header.Get(headerJobSlot), "2026-11-28T03:00:00Z"},
		{headerToken, got.Header.Get(headerToken), "42"},
		{headerInstance, got.Header.Get(headerInstance), "node-a"},
	} {
		t.Run(c.what, func(t *testing.T) {
			if c.got != c.want {
				t.Errorf("%q, want %q", c.got, c.want)
			}
		})
	}

	t.Run("a_job_on_an_election_has_no_shard", func(t *testing.T) {
		r := &JobRequest{URL: svc.URL + "/?shard={http.leader.shard}"}
		if err := r.action()(context.Background(), jobs.Run{Shard: -1}); err != nil {
			t.Fatal(err)
		}
		reqs, _ := svc.seen()
		if got := reqs[len(reqs)-1]; got.Method != http.MethodGet || got.URL.RawQuery != "shard=" {
			t.Errorf("%s ?%s, want GET ?shard=", got.Method, got.URL.RawQuery)
		}
	})
	t.Run("a_non_2xx_answer_fails_with_the_start_of_its_body", func(t *testing.T) {
		svc.mu.Lock()
		svc.status = http.StatusConflict
		svc.mu.Unlock()
		err := (&JobRequest{URL: svc.URL}).action()(context.Background(), jobs.Run{Shard: -1})
		if err == nil || !strings.Contains(err.Error(), "HTTP 409") {
			t.Fatalf("error %v, want one naming HTTP 409", err)
		}
		if !strings.HasSuffix(err.Error(), ": "+strings.Repeat("x", maxFailureBody)) {
			t.Errorf("error %q, want it to end with the first %d bytes of the body", err, maxFailureBody)
		}
	})
}

// loadJobConfig loads a config whose leader app elects through the in-memory store
// and runs the given jobs (JSON).
func loadJobConfig(t *testing.T, storeName, jobsJSON string) {
	t.Helper()
	config := fmt.Sprintf(`{"admin": {"disabled": true, "config": {"persist": false}},
		"apps": {"leader": {"store": {"module": "jobs_test_.memory", "name": %q}, "ttl": "1s",
			"instance_id": "node-a", "advertise": "http://127.0.0.1:1", "jobs": %s}}}`, storeName, jobsJSON)
	if err := caddy.Load([]byte(config), true); err != nil {
		t.Fatal(err)
	}
}

// TestJobRunsOnLeader: a loaded config's job sends its request from the leader, under the
// election's term.
func TestJobRunsOnLeader(t *testing.T) {
	_, store := newMemoryStore(t)
	svc := newJobService(t)
	loadJobConfig(t, store, fmt.Sprintf(`{"tick": {"every": "50ms", "request": {"url": %q}}}`, svc.URL+"/tick"))
	t.Cleanup(func() { _ = caddy.Stop() })
	select {
	case <-svc.arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("the job never ran")
	}
	reqs, _ := svc.seen()
	e := runningElections()[DefaultElection]
	if got, want := reqs[0].Header.Get(headerToken), fmt.Sprint(e.Term().Token); got != want || want == "0" {
		t.Errorf("%s %s, want the term's token %s", headerToken, got, want)
	}
}

// TestJobReloadDuringRun: a reload while a run is under way keeps the job's runner: the
// run goes on (it is not cancelled) and no second run of the job starts beside it, and
// the next run has the new config's request.
func TestJobReloadDuringRun(t *testing.T) {
	_, store := newMemoryStore(t)
	svc := newJobService(t)
	release := make(chan struct{})
	svc.hold = release
	job := func(header string) string {
		return fmt.Sprintf(`{"tick": {"every": "20ms", "request": {"url": %q, "headers": {"X-Config": [%q]}}}}`, svc.URL, header)
	}
	loadJobConfig(t, store, job("first"))
	t.Cleanup(func() { _ = caddy.Stop() })
	select {
	case <-svc.arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("the job never ran")
	}
	loadJobConfig(t, store, job("second"))
	// Slots come every 20ms while the first run is held: had the reload made a second
	// runner, it would send a request now.
	var count int
	jobRunners.Range(func(any, any) bool { count++; return true })
	if count != 1 {
		t.Errorf("%d runners after the reload, want 1", count)
	}
	svc.mu.Lock()
	svc.hold = nil
	svc.mu.Unlock()
	close(release)
	waitUntil(t, "a run with the new config", func() bool {
		reqs, _ := svc.seen()
		return reqs[len(reqs)-1].Header.Get("X-Config") == "second"
	})
	_, maxIn := svc.seen()
	if maxIn != 1 {
		t.Errorf("%d requests of the job at once, want 1", maxIn)
	}
	if svc.cancelled != 0 {
		t.Errorf("the run under way at the reload was cancelled")
	}
}

// TestJobsOperate: the admin API and `caddy leader jobs` list the jobs and run one now on
// the leader, which counts it and emits its events; elsewhere they say why not.
func TestJobsOperate(t *testing.T) {
	mem, store := newMemoryStore(t)
	svc := newJobService(t)
	recorded.Lock()
	recorded.events = nil
	recorded.Unlock()
	// node-b leads election `elsewhere` before this instance joins it.
	_, es := fleet.StartCandidate(t, elector.Config{ID: "node-b", URL: "http://node-b.test", TTL: time.Second,
		DrainTimeout: time.Second, Backend: mem.Client(), Logger: zaptest.NewLogger(t)}, "elsewhere")
	waitUntil(t, "node-b leads elsewhere", func() bool { return es[0].Term().Holds() })
	// Counters are process-wide and keep counting (over -count=N too).
	okBefore := counterValue(t, metrics.jobRuns.WithLabelValues("report", jobs.ResultOK))
	adminPort := freeport.MustPick(t, 1)[0]
	admin := fmt.Sprintf("127.0.0.1:%d", adminPort)
	config := fmt.Sprintf(`{"admin": {"listen": %q},
		"apps": {
			"leader": {"store": {"module": "jobs_test_.memory", "name": %q}, "ttl": "1s",
				"instance_id": "node-a", "advertise": "http://127.0.0.1:1", "jobs": {
					"report": {"every": "1h", "request": {"method": "POST", "url": %q}},
					"remote": {"every": "1h", "election": "elsewhere", "request": {"url": %q}}}},
			"events": {"subscriptions": [{
				"events": [%q, %q],
				"handlers": [{"handler": "leader_test_recorder"}]}]}}}`,
		admin, store, svc.URL+"/report?manual={http.leader.job.manual}", svc.URL, EventJobStarted, EventJobFinished)
	if err := caddy.Load([]byte(config), true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	// A job that has not run here yet has its counters at 0, so that the alerts' increase()
	// sees its first failure or missed slot.
	for _, series := range []string{`caddy_leader_job_runs_total{job_name="remote",result="failed"}`,
		`caddy_leader_job_missed_slots_total{job_name="remote",reason="no leader"}`} {
		if got := metric(t, adminPort, series); got < 0 {
			t.Errorf("%s is not exported before the job's first run", series)
		}
	}

	var out strings.Builder
	waitUntil(t, "a run of report starts on demand", func() bool {
		out.Reset()
		return leaderRunJob(&out, admin, "report", -1) == nil
	})
	if !strings.Contains(out.String(), "job report: run started on node-a under default") {
		t.Errorf("caddy leader jobs run printed %q", out.String())
	}
	finished := waitEvent(t, EventJobFinished)
	if d := finished.Data; d["job"] != "report" || d["result"] != jobs.ResultOK || d["manual"] != true || d["self"] != "node-a" {
		t.Errorf("%s data %v", EventJobFinished, d)
	}
	waitEvent(t, EventJobStarted)
	if reqs, _ := svc.seen(); len(reqs) != 1 || reqs[0].URL.RawQuery != "manual=true" {
		t.Errorf("the service saw %d requests, the first ?%s; want one, ?manual=true", len(reqs), reqs[0].URL.RawQuery)
	}
	if got := metric(t, adminPort, `caddy_leader_job_runs_total{job_name="report",result="ok"}`); got != okBefore+1 {
		t.Errorf("caddy_leader_job_runs_total{job_name=report,result=ok} = %v, want %v", got, okBefore+1)
	}

	t.Run("table", func(t *testing.T) {
		var table strings.Builder
		if err := leaderJobs(&table, admin, false); err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"JOB", "report", "default", "remote", "elsewhere", "every 1h0m0s"} {
			if !strings.Contains(table.String(), want) {
				t.Errorf("the table lacks %q:\n%s", want, table.String())
			}
		}
	})
	for _, c := range []struct {
		name, job string
		shard     int
		want      string
	}{
		{"unknown_job", "nightly", -1, `no job "nightly" is configured on this instance (HTTP 404)`},
		{"shard_of_a_job_on_an_election", "report", 2, "runs on an election, not a shard set: leave shard out (HTTP 400)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := leaderRunJob(io.Discard, admin, c.job, c.shard)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want one containing %q", err, c.want)
			}
		})
	}
	t.Run("another_instance_leads_and_is_asked", func(t *testing.T) {
		var out strings.Builder
		if err := leaderRunJob(&out, admin, "remote", -1); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out.String(), "asked node-b, the leader of elsewhere") {
			t.Errorf("the command says %q, want that it asked node-b", out.String())
		}
	})
}

// TestJobProvisionErrors: a job's bad field is named, with the job's name, in JSON as in
// the Caddyfile (whose parser runs the same checks, see the error_global_job_* goldens).
func TestJobProvisionErrors(t *testing.T) {
	_, store := newMemoryStore(t)
	get := &JobRequest{URL: "http://127.0.0.1:9000/"}
	tests := []struct {
		name    string
		jobs    map[string]*Job
		sets    map[string]*ShardSet
		wantErr string
	}{
		{name: "empty_job", jobs: map[string]*Job{"cleanup": nil}, wantErr: "jobs: cleanup: empty"},
		{name: "name_with_slash", jobs: map[string]*Job{"a/b": {Every: caddy.Duration(time.Minute), Request: get}}, wantErr: `jobs: job name "a/b"`},
		{name: "no_schedule", jobs: map[string]*Job{"cleanup": {Request: get}}, wantErr: "jobs: cleanup: every or cron: one is required"},
		{name: "every_and_cron", jobs: map[string]*Job{"cleanup": {Every: caddy.Duration(time.Minute), Cron: "@daily", Request: get}}, wantErr: "jobs: cleanup: every and cron: give exactly one"},
		{name: "every_below_a_millisecond", jobs: map[string]*Job{"cleanup": {Every: 10, Request: get}}, wantErr: "jobs: cleanup: every: 10ns is below a millisecond"},
		{name: "time_zone_with_every", jobs: map[string]*Job{"cleanup": {Every: caddy.Duration(time.Minute), TimeZone: "UTC", Request: get}}, wantErr: "jobs: cleanup: time_zone: only with cron"},
		{name: "cron_bad", jobs: map[string]*Job{"cleanup": {Cron: "0 3 * *", Request: get}}, wantErr: `jobs: cleanup: cron: cron expression "0 3 * *"`},
		{name: "time_zone_unknown", jobs: map[string]*Job{"cleanup": {Cron: "@daily", TimeZone: "Mars/Olympus", Request: get}}, wantErr: "jobs: cleanup: time_zone: unknown time zone Mars/Olympus"},
		{name: "no_request", jobs: map[string]*Job{"cleanup": {Every: caddy.Duration(time.Minute)}}, wantErr: "jobs: cleanup: request: required"},
		{name: "request_without_url", jobs: map[string]*Job{"cleanup": {Every: caddy.Duration(time.Minute), Request: &JobRequest{}}}, wantErr: "jobs: cleanup: request: url: required"},
		{name: "timeout_negative", jobs: map[string]*Job{"cleanup": {Every: caddy.Duration(time.Minute), Request: get, Timeout: caddy.Duration(-time.Second)}}, wantErr: "jobs: cleanup: timeout: -1s is negative"},
		{name: "retry_backoff_negative", jobs: map[string]*Job{"cleanup": {Every: caddy.Duration(time.Minute), Request: get, RetryBackoff: caddy.Duration(-time.Second)}}, wantErr: "jobs: cleanup: retry_backoff: -1s is negative"},
		{name: "overlap_unknown", jobs: map[string]*Job{"cleanup": {Every: caddy.Duration(time.Minute), Request: get, Overlap: "queue"}}, wantErr: `jobs: cleanup: overlap: "queue"`},
		{name: "missed_unknown", jobs: map[string]*Job{"cleanup": {Every: caddy.Duration(time.Minute), Request: get, Missed: "all"}}, wantErr: `jobs: cleanup: missed: "all"`},
		{name: "shard_set_unknown", jobs: map[string]*Job{"cleanup": {Every: caddy.Duration(time.Minute), Request: get, ShardSet: "rooms"}}, wantErr: `jobs: cleanup: shard_set: no shard set "rooms" is configured`},
		{name: "election_is_a_shard", sets: map[string]*ShardSet{"rooms": {Shards: 2}},
			jobs: map[string]*Job{"cleanup": {Every: caddy.Duration(time.Minute), Request: get, Election: "rooms.1"}}, wantErr: `jobs: cleanup: election: election name "rooms.1" clashes with shard set "rooms"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			app := App{StoreRaw: json.RawMessage(fmt.Sprintf(`{"module": "jobs_test_.memory", "name": %q}`, store)),
				InstanceID: "node-a", Jobs: tt.jobs, ShardSets: tt.sets}
			err := app.Provision(newProvisionContext(t))
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("got error %v, want one containing %q", err, tt.wantErr)
			}
			if err := app.Cleanup(); err != nil {
				t.Errorf("Cleanup after failed Provision: %v", err)
			}
		})
	}
}

// TestJobFailedReloadKeepsSpec: a config that fails to load after its leader app has
// provisioned leaves the running job as it was: its new request is never sent.
func TestJobFailedReloadKeepsSpec(t *testing.T) {
	_, store := newMemoryStore(t)
	svc := newJobService(t)
	config := func(header, routes string) []byte {
		return []byte(fmt.Sprintf(`{"admin": {"disabled": true, "config": {"persist": false}},
			"apps": {
				"leader": {"store": {"module": "jobs_test_.memory", "name": %q}, "ttl": "1s",
					"instance_id": "node-a", "shard_sets": {"rooms": {"shards": 2}}, "jobs": {
						"tick": {"every": "20ms", "request": {"url": %q, "headers": {"X-Config": [%q]}}}}},
				"http": {"servers": {"s": {"listen": ["127.0.0.1:0"], "routes": [%s]}}}}}`, store, svc.URL, header, routes))
	}
	if err := caddy.Load(config("first", ""), true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	<-svc.arrived
	// The gate provisions the leader app (it looks it up), then fails on its election.
	bad := `{"handle": [{"handler": "leader_gate", "election": "rooms.1"}]}`
	if err := caddy.Load(config("second", bad), true); err == nil || !strings.Contains(err.Error(), "rooms.1") {
		t.Fatalf("loading the bad config: %v, want an error naming rooms.1", err)
	}
	reqs, _ := svc.seen()
	seen := len(reqs)
	waitUntil(t, "three more runs", func() bool { reqs, _ := svc.seen(); return len(reqs) >= seen+3 })
	reqs, _ = svc.seen()
	for i, r := range reqs {
		if got := r.Header.Get("X-Config"); got != "first" {
			t.Fatalf("request %d carries X-Config %q: the config that failed to load changed the job", i, got)
		}
	}
}

// TestJobOnEtcd: on a real etcd, the leader runs the job under its term's token and the
// store keeps its record, which GET /leader/jobs reads back; once it resigns, it sends no
// more requests and a run asked of it names the new leader.
func TestJobOnEtcd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and Caddy")
	}
	cluster := etcdtest.Start(t, 1)
	probe, err := etcdbackend.New(etcdbackend.Config{Endpoints: cluster.Endpoints(), Prefix: "/jobs-test/"})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := any(probe).(jobs.Store); !ok {
		t.Skip("etcdbackend keeps no job records in this build")
	}
	svc := newJobService(t)
	adminPort := freeport.MustPick(t, 1)[0]
	admin := fmt.Sprintf("127.0.0.1:%d", adminPort)
	config := fmt.Sprintf(`{"admin": {"listen": %q},
		"apps": {"leader": {"endpoints": [%q], "prefix": "/jobs-test/", "ttl": "2s", "drain_timeout": "1s",
			"instance_id": "node-a", "advertise": "http://127.0.0.1:1", "jobs": {
				"tick": {"every": "50ms", "election": "jobs-etcd", "request": {"url": %q}}}}}}`,
		admin, cluster.Endpoint(0), svc.URL)
	if err := caddy.Load([]byte(config), true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	<-svc.arrived
	e := runningElections()["jobs-etcd"]
	token := e.Term().Token
	var answer jobsAnswer
	waitUntil(t, "the record shows a finished run", func() bool {
		if err := adminCall(admin, http.MethodGet, "/leader/jobs", &answer); err != nil {
			t.Fatal(err)
		}
		rec := answer.Jobs[0].Leads[0].Record
		return rec != nil && rec.Finished != nil
	})
	if fin := answer.Jobs[0].Leads[0].Record.Finished; fin.Token != token || fin.By != "node-a" || fin.Result != jobs.ResultOK {
		t.Errorf("finished %+v, want ok by node-a under token %d", fin, token)
	}

	b := startInstanceUnder(t, cluster.Endpoints(), "/jobs-test/", "node-b", "http://node-b.test", "jobs-etcd", 2*time.Second, false)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// A follower asks the leader to run the job now, through the store: the leader's
	// runner runs it and records it as a manual run.
	waitUntil(t, "node-b following node-a", func() bool { return b.election.Term().Leader.ID == "node-a" })
	errand, _ := json.Marshal(jobErrand{Job: "tick"})
	if err := b.election.AskLeader(ctx, errand); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the manual run the follower asked for", func() bool {
		if err := adminCall(admin, http.MethodGet, "/leader/jobs", &answer); err != nil {
			t.Fatal(err)
		}
		m := answer.Jobs[0].Leads[0].Record.Manual
		if m == nil {
			// The leader refuses an errand while a scheduled run is under way (a run
			// every slot here): the follower asks again, as a user would.
			_ = b.election.AskLeader(ctx, errand)
		}
		return m != nil && m.By == "node-a" && m.Result == jobs.ResultOK
	})

	if err := e.Resign(ctx, time.Hour); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "node-b leads, as node-a sees it", func() bool {
		return b.election.Term().Holds() && e.Term().Leader.ID == "node-b"
	})
	reqs, _ := svc.seen()
	after := len(reqs)
	var out strings.Builder
	if err := leaderRunJob(&out, admin, "tick", -1); err != nil || !strings.Contains(out.String(), "asked node-b") {
		t.Errorf("run on the old leader: %v, %q; want it to ask node-b", err, out.String())
	}
	// Slots come every 50ms: a runner that went on would have sent requests meanwhile.
	waitUntil(t, "several slots pass", func() bool { return time.Since(b.election.Term().Leader.Since) > 300*time.Millisecond })
	if reqs, _ := svc.seen(); len(reqs) != after {
		t.Errorf("%d requests after the handover, want none", len(reqs)-after)
	}
}

// TestJobMissedSlots: slots that come while a run is held are counted as missed for
// overlap, in the metric and as leader_job_missed events.
func TestJobMissedSlots(t *testing.T) {
	_, store := newMemoryStore(t)
	svc := newJobService(t)
	release := make(chan struct{})
	svc.hold = release
	defer close(release)
	recorded.Lock()
	recorded.events = nil
	recorded.Unlock()
	missedBefore := counterValue(t, metrics.jobMissed.WithLabelValues("held", jobs.MissedOverlap))
	config := fmt.Sprintf(`{"admin": {"disabled": true, "config": {"persist": false}},
		"apps": {
			"leader": {"store": {"module": "jobs_test_.memory", "name": %q}, "ttl": "1s",
				"instance_id": "node-a", "jobs": {
					"held": {"every": "20ms", "request": {"url": %q}}}},
			"events": {"subscriptions": [{"events": [%q], "handlers": [{"handler": "leader_test_recorder"}]}]}}}`,
		store, svc.URL, EventJobMissed)
	if err := caddy.Load([]byte(config), true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	missed := waitEvent(t, EventJobMissed)
	if d := missed.Data; d["job"] != "held" || d["reason"] != jobs.MissedOverlap || d["election"] != DefaultElection || d["self"] != "node-a" {
		t.Errorf("%s data %v", EventJobMissed, d)
	}
	if got := counterValue(t, metrics.jobMissed.WithLabelValues("held", jobs.MissedOverlap)); got < missedBefore+1 {
		t.Errorf("caddy_leader_job_missed_slots_total{job_name=held,reason=overlap} = %v, want at least %v", got, missedBefore+1)
	}
}

// counterValue reads a counter of this process.
func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// TestJobOnShardSet: a job on a shard set runs for every shard, under that shard's token.
func TestJobOnShardSet(t *testing.T) {
	_, store := newMemoryStore(t)
	svc := newJobService(t)
	config := fmt.Sprintf(`{"admin": {"disabled": true, "config": {"persist": false}},
		"apps": {"leader": {"store": {"module": "jobs_test_.memory", "name": %q}, "ttl": "1s",
			"instance_id": "node-a", "shard_sets": {"rooms": {"shards": 3}}, "jobs": {
				"compact": {"every": "50ms", "shard_set": "rooms", "request": {"url": %q}}}}}}`,
		store, svc.URL+"/?shard={http.leader.shard}&election={http.leader.election}")
	if err := caddy.Load([]byte(config), true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	running := runningElections()
	for s := range 3 {
		t.Run(fmt.Sprintf("shard_%d", s), func(t *testing.T) {
			election := shardElection("rooms", s)
			waitUntil(t, "a run for "+election, func() bool {
				reqs, _ := svc.seen()
				for _, r := range reqs {
					if r.URL.Query().Get("shard") == fmt.Sprint(s) {
						return true
					}
				}
				return false
			})
			reqs, _ := svc.seen()
			for _, r := range reqs {
				if r.URL.Query().Get("shard") != fmt.Sprint(s) {
					continue
				}
				if got := r.URL.Query().Get("election"); got != election {
					t.Errorf("election %q, want %q", got, election)
				}
				if got, want := r.Header.Get(headerToken), fmt.Sprint(running[election].Term().Token); got != want {
					t.Errorf("%s %s, want the shard's token %s", headerToken, got, want)
				}
			}
		})
	}
	post := func(uri string) (*httptest.ResponseRecorder, error) {
		w := httptest.NewRecorder()
		return w, serveAdmin(w, httptest.NewRequest(http.MethodPost, uri, nil))
	}
	t.Run("run_now_needs_the_shard", func(t *testing.T) {
		_, err := post("/leader/jobs/compact/run")
		var apiErr caddy.APIError
		if !errors.As(err, &apiErr) || apiErr.HTTPStatus != http.StatusBadRequest || !strings.Contains(err.Error(), "give ?shard=<n>, n from 0 to 2") {
			t.Errorf("error %v, want a 400 asking for a shard from 0 to 2", err)
		}
	})
	t.Run("run_now_on_a_shard", func(t *testing.T) {
		var w *httptest.ResponseRecorder
		waitUntil(t, "a run of shard 1 on demand", func() bool {
			var err error
			w, err = post("/leader/jobs/compact/run?shard=1")
			return err == nil // a scheduled run under way is ErrBusy: ask again
		})
		var answer jobRunAnswer
		if err := json.Unmarshal(w.Body.Bytes(), &answer); err != nil {
			t.Fatal(err)
		}
		if run := answer.Run; w.Code != http.StatusAccepted || run == nil || run.Shard != 1 || run.Election != "rooms.1" || !run.Manual {
			t.Errorf("%d %+v, want 202 and a manual run of shard 1", w.Code, answer)
		}
	})
}

func init() {
	caddy.RegisterModule(failingApp{})
}

// failingApp is an app of the tests only whose Start fails, as an HTTP app's does when its
// port is taken.
type failingApp struct{}

func (failingApp) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "jobs_test_failing_app", New: func() caddy.Module { return new(failingApp) }}
}
func (failingApp) Start() error { return errors.New("failing on purpose") }
func (failingApp) Stop() error  { return nil }

// TestJobFailedStartKeepsSpec: a config whose other app fails to start, after the leader
// app started (Caddy starts apps in random order, hence several tries), leaves the running
// job with the running config's request.
func TestJobFailedStartKeepsSpec(t *testing.T) {
	_, store := newMemoryStore(t)
	svc := newJobService(t)
	config := func(header, more string) []byte {
		return []byte(fmt.Sprintf(`{"admin": {"disabled": true, "config": {"persist": false}},
			"apps": {%s
				"leader": {"store": {"module": "jobs_test_.memory", "name": %q}, "ttl": "1s",
					"instance_id": "node-a", "jobs": {
						"tick": {"every": "20ms", "request": {"url": %q, "headers": {"X-Config": [%q]}}}}}}}`, more, store, svc.URL, header))
	}
	if err := caddy.Load(config("first", ""), true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	<-svc.arrived
	for try := range 10 {
		if err := caddy.Load(config(fmt.Sprint("failed-", try), `"jobs_test_failing_app": {},`), true); err == nil {
			t.Fatal("the config with the failing app loaded")
		}
	}
	reqs, _ := svc.seen()
	seen := len(reqs)
	waitUntil(t, "three more runs", func() bool { reqs, _ := svc.seen(); return len(reqs) >= seen+3 })
	reqs, _ = svc.seen()
	for _, r := range reqs[seen:] {
		if got := r.Header.Get("X-Config"); got != "first" {
			t.Fatalf("a run after the failed loads carries X-Config %q, want the running config's, first", got)
		}
	}
}
