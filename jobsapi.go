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
	"go.uber.org/zap"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/jobs"
)

// JobStatus is one scheduled job as GET /leader/jobs reports it.
type JobStatus = jobs.Listing

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
		return json.NewEncoder(w).Encode(jobsAnswer{Jobs: listJobs(r.Context(), true)})
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

// listJobs lists this process's jobs, by name and election; fresh reads each lead's record
// from the store (see jobs.Runner.Status), or else gives it as this instance last knew it.
func listJobs(ctx context.Context, fresh bool) []JobStatus {
	list := []JobStatus{}
	for _, runners := range runningJobs() {
		for _, p := range runners {
			list = append(list, p.status(ctx, fresh))
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

// status is the job as GET /leader/jobs reports it (see listJobs).
func (p *pooledRunner) status(ctx context.Context, fresh bool) JobStatus {
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
	if fresh {
		st.Leads = p.Status(ctx)
	} else {
		st.Leads = p.Local()
	}
	return st
}

// jobRunAnswer is POST /leader/jobs/<job>/run's answer: the run this instance started,
// or, on an instance that does not lead there, the leader it asked to run it.
type jobRunAnswer struct {
	// Run is the run started here.
	Run *jobs.Run `json:"run,omitempty"`
	// Asked is the instance (the leader of Election's term Token) asked to run it.
	Asked    string `json:"asked,omitempty"`
	Election string `json:"election,omitempty"`
	Token    int64  `json:"token,omitempty"`
}

// jobErrand is what an instance asks the leader to do for POST /leader/jobs/<job>/run: run
// the job now under the election the errand reaches (a shard's, for a job on a set).
type jobErrand struct {
	Job string `json:"job"`
}

// runJobNow runs the named job now under the lead ?shard names (a job on a shard set needs
// it) and answers 202: on this instance if it leads there, else on the leader, asked
// through the store (see elector's errands). 409 when no instance leads there, when a run
// is under way here, or while another request to the leader is pending.
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
	answer := jobRunAnswer{}
	run, err := p.RunNow(shard)
	if err == nil {
		answer.Run = &run
	} else {
		e := p.elections[max(shard, 0)]
		t := e.Term()
		switch {
		case !errors.Is(err, jobs.ErrNotLeading):
			return caddy.APIError{HTTPStatus: http.StatusConflict, Err: fmt.Errorf("job %s under %s: %v", name, e.Name(), err)}
		case !t.LeaderKnown() || t.Holds():
			// This instance holds the key but cannot run yet (its term settles, drains, or
			// has not read the job's record), or nobody leads.
			return caddy.APIError{HTTPStatus: http.StatusConflict, Err: fmt.Errorf("job %s runs on the leader of %s, and no instance leads it now: try again", name, e.Name())}
		}
		errand, _ := json.Marshal(jobErrand{Job: name}) // a string always marshals
		if err := e.AskLeader(r.Context(), errand); err != nil {
			return caddy.APIError{HTTPStatus: http.StatusConflict, Err: fmt.Errorf("job %s: asking %s, the leader of %s: %v", name, t.Leader.ID, e.Name(), err)}
		}
		answer.Asked, answer.Election, answer.Token = t.Leader.ID, e.Name(), t.Token
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusAccepted)
	return json.NewEncoder(w).Encode(answer)
}

// doJobErrand runs, on the leader of e, the job another instance asked it to run now.
func doJobErrand(e *elector.Election, from string, errand []byte) {
	log := caddy.Log().Named("leader.jobs")
	var ask jobErrand
	if err := json.Unmarshal(errand, &ask); err != nil || ask.Job == "" {
		return // an errand of another kind
	}
	for _, p := range runningJobs()[ask.Job] {
		for i, pe := range p.elections {
			if pe != e {
				continue
			}
			shard := -1
			if p.config.Load().ShardSet != "" {
				shard = i
			}
			if _, err := p.RunNow(shard); err != nil {
				log.Warn("cannot run the job another instance asked for", zap.String("job", ask.Job),
					zap.String("election", e.Name()), zap.String("requested_by", from), zap.Error(err))
				return
			}
			log.Info("running the job another instance asked for", zap.String("job", ask.Job),
				zap.String("election", e.Name()), zap.String("requested_by", from))
			return
		}
	}
	log.Warn("asked to run a job this instance does not run under that election", zap.String("job", ask.Job),
		zap.String("election", e.Name()), zap.String("requested_by", from))
}

// shardHint says which shard numbers the job takes.
func shardHint(p *pooledRunner) string {
	if set := p.config.Load().ShardSet; set != "" {
		return fmt.Sprintf("runs on every shard of set %s: give ?shard=<n>, n from 0 to %d", set, len(p.elections)-1)
	}
	return "runs on an election, not a shard set: leave shard out"
}
