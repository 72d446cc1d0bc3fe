package caddyleader

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/jobs"
)

// Defaults of a job.
const (
	DefaultJobTimeout      = time.Minute
	DefaultJobRetryBackoff = time.Second
)

// Job is a leader-only scheduled job: once per slot of its schedule across the fleet, the
// leader of its election (or, for a job on a shard set, the owner of each shard) sends an
// HTTP request to a service. The store records per job the slot last started and last
// finished, under the term that ran it, so a new term reruns a slot its predecessor started
// and did not finish, and never reruns a finished one (see docs/jobs.md).
//
// The request may use these placeholders, expanded for every run:
//
//	{http.leader.token}           the fencing token of the term that runs it
//	{http.leader.election}        the election (a shard's, for a job on a shard set)
//	{http.leader.shard}           the shard's number; empty for a job on an election
//	{http.leader.self}            this instance's instance_id
//	{http.leader.job.name}        the job's name
//	{http.leader.job.slot}        the slot the run is for, RFC 3339 in UTC
//	{http.leader.job.slot_unix}   the same, in Unix seconds
//	{http.leader.job.attempt}     the attempt, from 1
//	{http.leader.job.missed}      how many earlier missed slots this run stands for
//	{http.leader.job.rerun}       true when an earlier term started the slot and ended first
//	{http.leader.job.manual}      true for a run an operator asked for
//
// Every request also carries the headers Leader-Job, Leader-Job-Slot, Leader-Token and
// Leader-Instance. A 2xx answer is success; any other answer, or no answer, is a failed
// attempt.
type Job struct {
	// Every runs the job at every multiple of this interval since the Unix epoch, the
	// same slots on every instance (`every 30s` is due at :00 and :30 of each minute).
	// Exactly one of every and cron is required.
	Every caddy.Duration `json:"every,omitempty"`

	// Cron runs the job at the times of a cron expression: five fields (minute, hour, day
	// of month, month, day of week) or a descriptor such as `@daily`, in time_zone.
	// Exactly one of every and cron is required.
	Cron string `json:"cron,omitempty"`

	// TimeZone is the IANA time zone cron is read in, such as `Europe/Berlin`. Only with
	// cron. Default: UTC.
	TimeZone string `json:"time_zone,omitempty"`

	// Election is the election whose leader runs the job. It joins the election as a
	// `leader_gate` does. Not with shard_set. Default: `default`.
	Election string `json:"election,omitempty"`

	// ShardSet makes the job run once per slot for every shard of this shard set, by
	// that shard's owner under that shard's token. The set must be configured in the
	// app. Not with election. Default: none.
	ShardSet string `json:"shard_set,omitempty"`

	// Request is the HTTP request that runs the job. Required.
	Request *JobRequest `json:"request,omitempty"`

	// Timeout bounds each attempt of a run. Default: 1m.
	Timeout caddy.Duration `json:"timeout,omitempty"`

	// Retries is how many times a failed attempt is tried again within the slot.
	// Default: 0.
	Retries int `json:"retries,omitempty"`

	// RetryBackoff is the wait before the first retry; it doubles for every further one,
	// up to a minute. Default: 1s.
	RetryBackoff caddy.Duration `json:"retry_backoff,omitempty"`

	// Overlap is what happens when a slot comes while the run of an earlier one still
	// runs: `skip` counts it as missed, `wait` runs it as soon as the earlier run ends.
	// Default: skip.
	Overlap string `json:"overlap,omitempty"`

	// Missed is what happens to the slots that came while no instance led: `run_once`
	// runs the newest of them once, as soon as a term can; `skip` counts them and waits
	// for the next slot. Default: run_once.
	Missed string `json:"missed,omitempty"`

	name     string
	poolKey  string // in jobRunners, once joined
	runner   *pooledRunner
	runSpec  jobs.Spec
	observer *candidateObserver // its config's
}

// JobRequest is the HTTP request a job sends for every attempt of a run. Placeholders
// (see Job) are expanded in url, the header values and body.
type JobRequest struct {
	// Method is the HTTP method. Default: GET.
	Method string `json:"method,omitempty"`
	// URL is the absolute http:// or https:// URL to send the request to. Required.
	URL string `json:"url,omitempty"`
	// Headers are added to the request. Default: none.
	Headers http.Header `json:"headers,omitempty"`
	// Body is the request's body. Default: none.
	Body string `json:"body,omitempty"`
}

// schedule builds the job's schedule, or says which field is wrong.
func (j *Job) schedule() (jobs.Schedule, error) {
	switch {
	case j.Every != 0 && j.Cron != "":
		return nil, fmt.Errorf("every and cron: give exactly one")
	case j.Every < 0:
		return nil, fmt.Errorf("every: %s is negative", time.Duration(j.Every))
	case j.Every != 0 && j.Every < caddy.Duration(time.Millisecond):
		return nil, fmt.Errorf("every: %s is below a millisecond", time.Duration(j.Every))
	case j.Every != 0 && j.TimeZone != "":
		return nil, fmt.Errorf("time_zone: only with cron (every counts from the Unix epoch, in no zone)")
	case j.Every != 0:
		return jobs.Every(time.Duration(j.Every)), nil
	case j.Cron == "":
		return nil, fmt.Errorf("every or cron: one is required")
	}
	loc := time.UTC
	if j.TimeZone != "" {
		var err error
		if loc, err = time.LoadLocation(j.TimeZone); err != nil {
			return nil, fmt.Errorf("time_zone: %v", err)
		}
	}
	s, err := jobs.Cron(j.Cron, loc)
	if err != nil {
		return nil, fmt.Errorf("cron: %v", err)
	}
	return s, nil
}

// check fills in the defaults and names the first wrong field; it needs nothing but the job.
// Its errors leave the job's name to the caller.
func (j *Job) check() error {
	if j.Election != "" && j.ShardSet != "" {
		return fmt.Errorf("election and shard_set: give at most one")
	}
	if j.Election != "" {
		if err := checkElectionName(j.Election); err != nil {
			return fmt.Errorf("election: %v", err)
		}
	}
	if j.ShardSet != "" {
		if err := checkShardSetName(j.ShardSet); err != nil {
			return fmt.Errorf("shard_set: %v", err)
		}
	}
	if _, err := j.schedule(); err != nil {
		return err
	}
	if j.Request == nil {
		return fmt.Errorf("request: required")
	}
	if err := j.Request.check(); err != nil {
		return fmt.Errorf("request: %v", err)
	}
	switch {
	case j.Timeout < 0:
		return fmt.Errorf("timeout: %s is negative", time.Duration(j.Timeout))
	case j.Retries < 0:
		return fmt.Errorf("retries: %d is negative", j.Retries)
	case j.RetryBackoff < 0:
		return fmt.Errorf("retry_backoff: %s is negative", time.Duration(j.RetryBackoff))
	}
	switch j.Overlap {
	case "", jobs.OverlapSkip, jobs.OverlapWait:
	default:
		return fmt.Errorf("overlap: %q is neither %s nor %s", j.Overlap, jobs.OverlapSkip, jobs.OverlapWait)
	}
	switch j.Missed {
	case "", jobs.MissedRunOnce, jobs.MissedSkip:
	default:
		return fmt.Errorf("missed: %q is neither %s nor %s", j.Missed, jobs.MissedRunOnce, jobs.MissedSkip)
	}
	return nil
}

// spec is the job as the runner takes it; check has passed.
func (j *Job) spec(name string) jobs.Spec {
	s, _ := j.schedule()
	return jobs.Spec{
		Name:     name,
		Schedule: s,
		Action:   j.Request.action(),
		Timeout:  durationOr(j.Timeout, DefaultJobTimeout),
		Retries:  j.Retries,
		Backoff:  durationOr(j.RetryBackoff, DefaultJobRetryBackoff),
		Overlap:  j.Overlap,
		Missed:   j.Missed,
	}
}

func durationOr(d caddy.Duration, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return time.Duration(d)
}

// jobRunners keeps each job's runner across config reloads, keyed by the candidacy, the
// election or shard set and the job's name: a reload that keeps them finds the running
// runner (LoadOrNew before the old config's Delete) and gives it the new spec when the new
// config starts, so a run under way goes on and no slot runs twice; a job whose election changes is another key,
// so another runner. The runner stops when its last config is gone.
var jobRunners = caddy.NewUsagePool()

// pooledRunner is a job's runner as jobRunners keeps it.
type pooledRunner struct {
	*jobs.Runner
	name      string
	elections []*elector.Election // what it runs under, in shard order
	start     sync.Once
	// config is the job of the config whose spec runs, for the admin API's summary.
	config atomic.Pointer[Job]
	// observer is that config's, to emit the job's events with.
	observer atomic.Pointer[candidateObserver]

	// users are the jobs of the configs that started with the runner and are not cleaned
	// up yet, oldest first; the newest one's spec runs. A config that started and then
	// failed (another app did not start) is cleaned up, and the one before runs on.
	mu    sync.Mutex
	users []*Job
}

// use makes j's config the one whose spec runs: it has just started.
func (p *pooledRunner) use(j *Job) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.users = append(p.users, j)
	p.apply(j)
}

// release forgets j's config; if its spec was running, the newest remaining one's runs.
func (p *pooledRunner) release(j *Job) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.users)
	p.users = slices.DeleteFunc(p.users, func(u *Job) bool { return u == j })
	if len(p.users) > 0 && len(p.users) < n && p.config.Load() == j {
		p.apply(p.users[len(p.users)-1])
	}
}

// apply runs j's spec from the runner's next run on. p.mu is held.
func (p *pooledRunner) apply(j *Job) {
	if p.config.Swap(j) != j {
		p.Update(j.runSpec)
	}
	p.observer.Store(j.observer)
}

// Destruct implements caddy.Destructor: cancel any run and wait for it to end.
func (p *pooledRunner) Destruct() error {
	p.Stop()
	return nil
}

// provisionJobs joins every job's election or shard set and takes its runner from
// jobRunners (creating it, not starting it, if this is the first config with it); check
// has passed.
func (a *App) provisionJobs() error {
	if len(a.Jobs) == 0 {
		return nil
	}
	store, _ := a.backend.(jobs.Store)
	for name, j := range a.Jobs {
		if store == nil {
			return fmt.Errorf("jobs: %s: the store (%T) keeps no job records, so it cannot run jobs", name, a.backend)
		}
		elections, shardNums, where, err := a.jobLeads(j)
		if err != nil {
			return fmt.Errorf("jobs: %s: %v", name, err)
		}
		key, _ := json.Marshal([]string{a.poolKey, where, name})
		spec := j.spec(name)
		val, _, err := jobRunners.LoadOrNew(string(key), func() (caddy.Destructor, error) {
			p := &pooledRunner{name: name, elections: elections}
			p.config.Store(j)
			p.observer.Store(a.observer)
			leads := make([]jobs.Lead, len(elections))
			for i, e := range elections {
				leads[i] = e
			}
			p.Runner = jobs.NewRunner(spec, store, leads, shardNums, jobs.Config{
				Instance: a.InstanceID,
				Logger:   caddy.Log().Named("leader.jobs"),
				Events:   p.events(),
			})
			return p, nil
		})
		if err != nil {
			return fmt.Errorf("jobs: %s: %v", name, err)
		}
		j.name, j.poolKey, j.runner = name, string(key), val.(*pooledRunner)
		j.runSpec, j.observer = spec, a.observer
		initJobSeries(name)
	}
	return nil
}

// initJobSeries exports job name's counters at 0 before its first run: Prometheus's
// increase() and rate() see no increase in a series' first sample, so the first failure
// or missed slot would otherwise go unseen by the alerts (deploy/prometheus/alerts.yml).
func initJobSeries(name string) {
	for _, result := range []string{jobs.ResultOK, jobs.ResultFailed, jobs.ResultTimeout, jobs.ResultCancelled} {
		metrics.jobRuns.WithLabelValues(name, result)
	}
	for _, why := range []string{jobs.MissedNoLeader, jobs.MissedOverlap} {
		metrics.jobMissed.WithLabelValues(name, why)
	}
}

// checkJobs names the first wrong field of a job (App.check).
func (a *App) checkJobs() error {
	for name, j := range a.Jobs {
		if j == nil {
			return fmt.Errorf("jobs: %s: empty; it needs a schedule and a request", name)
		}
		if err := checkJobName(name); err != nil {
			return fmt.Errorf("jobs: %v", err)
		}
		if err := j.check(); err != nil {
			return fmt.Errorf("jobs: %s: %v", name, err)
		}
		if set := j.ShardSet; set != "" && a.ShardSets[set] == nil {
			return fmt.Errorf("jobs: %s: shard_set: no shard set %q is configured (add `shards %s <count>` to the global leader option)", name, set, set)
		}
		if j.Election != "" {
			if err := a.checkNotShard(j.Election); err != nil {
				return fmt.Errorf("jobs: %s: election: %v", name, err)
			}
		}
	}
	return nil
}

// jobLeads joins what job j runs under: its election, or every shard of its set. where
// names it in the runner's pool key.
func (a *App) jobLeads(j *Job) (leads []*elector.Election, shardNums []int, where string, err error) {
	if j.ShardSet != "" {
		set, err := a.shardSet(j.ShardSet)
		if err != nil {
			return nil, nil, "", fmt.Errorf("shard_set: %v", err)
		}
		for i := range set.elections {
			shardNums = append(shardNums, i)
		}
		return set.elections, shardNums, "shard_set " + j.ShardSet, nil
	}
	if j.Election == "" {
		j.Election = DefaultElection
	}
	return []*elector.Election{a.election(j.Election)}, nil, "election " + j.Election, nil
}

// checkJobName checks a job's name: it is a path segment of the admin API and a label.
func checkJobName(name string) error {
	if name == "" || strings.ContainsAny(name, " \t\r\n/?#%") {
		return fmt.Errorf("job name %q must be non-empty and have no white space, slash, ?, # or %%", name)
	}
	return nil
}

// startJobs starts the runners of the config's jobs; a runner kept from the config before
// runs on, with this config's spec from its next run.
func (a *App) startJobs() {
	for _, j := range a.Jobs {
		// Only now, not in Provision: a config that fails to load after provisioning
		// the app must leave the running job as the running config has it.
		j.runner.use(j)
		j.runner.start.Do(j.runner.Start)
		for _, e := range j.runner.elections {
			// The same handler whichever config registers it: it finds the runners of
			// every loaded config.
			e.HandleErrands(func(_ context.Context, from string, errand []byte) { doJobErrand(e, from, errand) })
		}
	}
}

// cleanupJobs lets go of the config's runners; a runner that no config uses any more stops.
func (a *App) cleanupJobs() error {
	var firstErr error
	for _, j := range a.Jobs {
		if j == nil || j.poolKey == "" {
			continue
		}
		j.runner.release(j)
		if _, err := jobRunners.Delete(j.poolKey); err != nil && firstErr == nil {
			firstErr = err
		}
		j.poolKey = ""
	}
	return firstErr
}

// runningJobs are the runners of every loaded config, by job name; a job that a reload
// moved to another election (or candidacy) has two while both configs are loaded.
func runningJobs() map[string][]*pooledRunner {
	found := make(map[string][]*pooledRunner)
	jobRunners.Range(func(_, v any) bool {
		p := v.(*pooledRunner)
		found[p.name] = append(found[p.name], p)
		return true
	})
	return found
}

// Interface guards
var _ caddy.Destructor = (*pooledRunner)(nil)
