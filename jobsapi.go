package caddyleader

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddyleader/caddy-leader/jobs"
)

// JobStatus is one scheduled job as GET /leader/jobs reports it.
type JobStatus struct {
	// Job is the job's name.
	Job string `json:"job"`
	// Election is the election that runs it, ShardSet the set whose shards do.
	Election string `json:"election,omitempty"`
	ShardSet string `json:"shard_set,omitempty"`
	// Schedule is `every <interval>` or `cron <expression> [<zone>]`.
	Schedule string `json:"schedule"`
	// Request is the request's method and URL, as configured (headers and body left out:
	// they may hold secrets).
	Request string `json:"request"`
	// Timeout, Retries, Overlap and Missed are the job's settings, defaults filled in.
	Timeout string `json:"timeout"`
	Retries int    `json:"retries"`
	Overlap string `json:"overlap"`
	Missed  string `json:"missed"`
	// Leads are the job under its election, or under each shard of its set.
	Leads []jobs.Status `json:"leads"`
}

// jobsAnswer is GET /leader/jobs's answer.
type jobsAnswer struct {
	Jobs []JobStatus `json:"jobs"`
}

// serveJobs answers under /leader/jobs; rest is the path after it.
func serveJobs(w http.ResponseWriter, r *http.Request, rest string) error {
	if rest == "" {
		if r.Method != http.MethodGet {
			return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: errors.New("use GET")}
		}
		w.Header().Set("Content-Type", "application/json")
		return json.NewEncoder(w).Encode(jobsAnswer{Jobs: listJobs(r.Context())})
	}
	name, ok := strings.CutSuffix(rest, "/run")
	if !ok || strings.Contains(name, "/") {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no such leader endpoint: %s", r.URL.Path)}
	}
	if r.Method != http.MethodPost {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: errors.New("use POST")}
	}
	return runJobNow(w, r, name)
}

func listJobs(ctx context.Context) []JobStatus {
	list := []JobStatus{}
	for _, runners := range runningJobs() {
		for _, p := range runners {
			list = append(list, p.status(ctx))
		}
	}
	sort.Slice(list, func(i, j int) bool {
		if list[i].Job != list[j].Job {
			return list[i].Job < list[j].Job
		}
		return list[i].Election+list[i].ShardSet < list[j].Election+list[j].ShardSet
	})
	return list
}

// status is the job as GET /leader/jobs reports it.
func (p *pooledRunner) status(ctx context.Context) JobStatus {
	j := p.config.Load()
	st := JobStatus{Job: p.name, Election: j.Election, ShardSet: j.ShardSet,
		Timeout: durationOr(j.Timeout, DefaultJobTimeout).String(), Retries: j.Retries,
		Overlap: cmp.Or(j.Overlap, jobs.OverlapSkip), Missed: cmp.Or(j.Missed, jobs.MissedRunOnce),
		Request: cmp.Or(j.Request.Method, http.MethodGet) + " " + j.Request.URL}
	if s, err := j.schedule(); err == nil {
		st.Schedule = s.String()
	}
	if st.ShardSet != "" {
		st.Election = ""
	}
	st.Leads = p.Status(ctx)
	return st
}

// runJobNow runs the named job now on this instance, under the lead ?shard names (a job on
// a shard set needs it), and answers 202 with the run; 409 when this instance does not lead
// there (naming who does) or a run is under way.
func runJobNow(w http.ResponseWriter, r *http.Request, name string) error {
	runners := runningJobs()[name]
	if len(runners) == 0 {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no job %q is configured on this instance", name)}
	}
	p := runners[0]
	shard := -1
	if v := r.URL.Query().Get("shard"); v != "" || p.config.Load().ShardSet != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n >= len(p.elections) || p.config.Load().ShardSet == "" {
			return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("shard: %q: job %s %s", v, name, shardHint(p))}
		}
		shard = n
	}
	run, err := p.RunNow(shard)
	if err != nil {
		e := p.elections[max(shard, 0)]
		t := e.Term()
		leader := "no instance leads it now"
		if t.LeaderKnown() {
			leader = t.Leader.ID + " leads it"
		}
		if errors.Is(err, jobs.ErrNotLeading) {
			return caddy.APIError{HTTPStatus: http.StatusConflict, Err: fmt.Errorf("job %s runs on the leader of %s; %s: run it there", name, e.Name(), leader)}
		}
		return caddy.APIError{HTTPStatus: http.StatusConflict, Err: fmt.Errorf("job %s under %s: %v", name, e.Name(), err)}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusAccepted)
	return json.NewEncoder(w).Encode(run)
}

// shardHint says which shard numbers the job takes.
func shardHint(p *pooledRunner) string {
	if set := p.config.Load().ShardSet; set != "" {
		return fmt.Sprintf("runs on every shard of set %s: give ?shard=<n>, n from 0 to %d", set, len(p.elections)-1)
	}
	return "runs on an election, not a shard set: leave shard out"
}
