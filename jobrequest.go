package caddyleader

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddyleader/caddy-leader/jobs"
)

// Placeholder names of a job's request (see Job), beside the term's (placeholders.go).
const (
	phJobName     = "http.leader.job.name"
	phJobSlot     = "http.leader.job.slot"
	phJobSlotUnix = "http.leader.job.slot_unix"
	phJobAttempt  = "http.leader.job.attempt"
	phJobMissed   = "http.leader.job.missed"
	phJobRerun    = "http.leader.job.rerun"
	phJobManual   = "http.leader.job.manual"
)

// Headers every job request carries, so that a service can fence and record each run
// without configuring anything.
const (
	headerJob      = "Leader-Job"
	headerJobSlot  = "Leader-Job-Slot"
	headerToken    = "Leader-Token"
	headerInstance = "Leader-Instance"
)

// maxFailureBody is how much of a failed answer's body the run's error quotes.
const maxFailureBody = 512

// jobClient sends the jobs' requests. Like the failsafe's, it ignores proxy settings from
// the environment (a job talks to its service directly) and follows no redirect. Each
// attempt's context bounds it, so it has no timeout of its own.
var jobClient = directClient()

// check names the first wrong field of the request; placeholders in url are checked when
// a run expands them.
func (r *JobRequest) check() error {
	if r.URL == "" {
		return fmt.Errorf("url: required")
	}
	if !strings.HasPrefix(r.URL, "{") {
		u, err := url.Parse(r.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("url: %q is not an http:// or https:// URL with a host", r.URL)
		}
	}
	if r.Method != "" && strings.ContainsAny(r.Method, " \t\r\n") {
		return fmt.Errorf("method: %q is not an HTTP method", r.Method)
	}
	return nil
}

// action is the runner's action for the request: one request per attempt.
func (r *JobRequest) action() jobs.Action {
	method := r.Method
	if method == "" {
		method = http.MethodGet
	}
	return func(ctx context.Context, run jobs.Run) error {
		return r.send(ctx, method, run)
	}
}

func (r *JobRequest) send(ctx context.Context, method string, run jobs.Run) error {
	repl := caddy.NewReplacer()
	repl.Map(runPlaceholders(run))
	var body io.Reader
	if r.Body != "" {
		body = strings.NewReader(repl.ReplaceAll(r.Body, ""))
	}
	target := repl.ReplaceAll(r.URL, "")
	req, err := http.NewRequestWithContext(ctx, method, target, body)
	if err != nil {
		return fmt.Errorf("request: %v", err)
	}
	for name, values := range r.Headers {
		for _, v := range values {
			req.Header.Add(name, repl.ReplaceAll(v, ""))
		}
	}
	req.Header.Set(headerJob, run.Job)
	req.Header.Set(headerJobSlot, run.Slot.UTC().Format(time.RFC3339Nano))
	req.Header.Set(headerToken, strconv.FormatInt(run.Token, 10))
	req.Header.Set(headerInstance, run.Instance)
	resp, err := jobClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		// Read to the end (within reason) so the connection can be used again.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return nil
	}
	start, _ := io.ReadAll(io.LimitReader(resp.Body, maxFailureBody))
	return fmt.Errorf("%s %s: HTTP %d: %s", method, target, resp.StatusCode, strings.TrimSpace(string(start)))
}

// runPlaceholders answers the placeholders of a job's request for one attempt of run.
func runPlaceholders(run jobs.Run) caddy.ReplacerFunc {
	shard := ""
	if run.Shard >= 0 {
		shard = strconv.Itoa(run.Shard)
	}
	return func(key string) (any, bool) {
		switch key {
		case phToken:
			return run.Token, true
		case phElection:
			return run.Election, true
		case phShard:
			return shard, true
		case phSelf:
			return run.Instance, true
		case phJobName:
			return run.Job, true
		case phJobSlot:
			return run.Slot.UTC().Format(time.RFC3339Nano), true
		case phJobSlotUnix:
			return run.Slot.Unix(), true
		case phJobAttempt:
			return run.Attempt, true
		case phJobMissed:
			return run.Missed, true
		case phJobRerun:
			return run.Rerun, true
		case phJobManual:
			return run.Manual, true
		}
		return nil, false
	}
}
