package caddyleader

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddyleader/caddy-leader/electionstatus"
	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/jobs"
	"github.com/caddyleader/caddy-leader/shards"
)

func init() {
	caddy.RegisterModule(AdminAPI{})
}

// AdminAPI is the `admin.api.leader` module: it adds the leader election's endpoints to
// Caddy's admin API.
//
//	GET  /leader/                            every election this instance takes part in, with
//	                                         every live candidate of each (the store's registry),
//	                                         as JSON
//	GET  /leader/shards/<set>                every shard of a shard set: its owner, token and
//	                                         preferred owner, and each candidate's share
//	POST /leader/shards/<set>/resign         this instance hands over every shard of the set it
//	                                         owns, and stays out for ?hold_off (default: one ttl)
//	GET  /leader/<election>/history          the election's ended terms (the latest 100), oldest
//	                                         first, as the store keeps them for every instance
//	POST /leader/<election>/resign           the leader hands over and stays out of the election
//	                                         for ?hold_off=<duration> (default: one ttl)
//	POST /leader/<election>/transfer?to=<id> planned switchover to a named candidate; the others
//	                                         stand aside until it leads or ?timeout=<duration>
//	                                         (default: two ttls) passes
//	GET  /leader/jobs                        every scheduled job: its config in short, and per
//	                                         election or shard its record, as the store keeps it
//	POST /leader/jobs/<job>/run[?shard=<n>]  runs the job now on this instance, if it leads the
//	                                         job's election (or shard n of its set); else 409
//	                                         naming the leader
//
// Both POSTs work on any instance: a follower passes the request on through etcd, where the
// leader (or, for a transfer, every candidate) picks it up.
//
// Caddy loads admin API modules on its own; there is nothing to configure.
type AdminAPI struct{}

// CaddyModule returns the Caddy module information.
func (AdminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.leader",
		New: func() caddy.Module { return new(AdminAPI) },
	}
}

// Routes implements caddy.AdminRouter.
func (AdminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: "/leader/", Handler: caddy.AdminHandlerFunc(serveAdmin)}}
}

// ElectionStatus is one election as GET /leader/ reports it (see electionstatus.Election).
type ElectionStatus = electionstatus.Election

// CandidateStatus is one live candidate of an election as GET /leader/ reports it (see
// electionstatus.Candidate).
type CandidateStatus = electionstatus.Candidate

// RunningElections returns the elections that the candidacies of this process take part in,
// by name: every election of every loaded config, whichever app asks, but the shards of
// shard sets, which RunningShardSets sums up. It reads in-process state only; the status page
// (statuspage) finds the app with AppIfConfigured and lists them.
func (*App) RunningElections() map[string]*elector.Election {
	all := runningElections()
	for name := range all {
		if _, _, shard := shardOf(name); shard {
			delete(all, name)
		}
	}
	return all
}

// RunningShardSets summarises the shard sets this process takes part in (see ShardSetStatus).
func (*App) RunningShardSets(ctx context.Context) []ShardSetStatus {
	return listShardSets(ctx, time.Now())
}

// RunningJobs lists the scheduled jobs this process runs, as GET /leader/jobs does; fresh
// reads each job's record from the store, or else gives it as this instance last knew it
// (no store request: the status page looks many times a second for a change).
func (*App) RunningJobs(ctx context.Context, fresh bool) []jobs.Listing {
	return listJobs(ctx, fresh)
}

// storeTrouble says, when this instance has not heard from its store for a while, which store
// that is: "no leader is known" is then what this instance cannot know, not what the store
// says. It is empty while the store answers.
func storeTrouble(e *elector.Election) string {
	c := e.Candidate()
	last := c.LastContact()
	if e.Healthy() && time.Since(last) < c.TTL()/2 {
		return ""
	}
	store := "the store"
	candidates.Range(func(_, v any) bool {
		if p := v.(pooledCandidate); p.Candidate == c {
			store = p.store
		}
		return true
	})
	since := "it has never answered"
	if !last.IsZero() {
		since = "its last answer came " + time.Since(last).Round(100*time.Millisecond).String() + " ago"
	}
	return fmt.Sprintf(" because this instance cannot reach its store, %s: %s. A resign goes through the store: check that it runs and answers", store, since)
}

// runningElections are the elections of every candidacy of this process, by name.
func runningElections() map[string]*elector.Election {
	found := make(map[string]*elector.Election)
	candidates.Range(func(_, v any) bool {
		for _, e := range v.(pooledCandidate).Elections() {
			found[e.Name()] = e
		}
		return true
	})
	return found
}

func serveAdmin(w http.ResponseWriter, r *http.Request) error {
	rest := strings.Trim(strings.TrimPrefix(r.URL.Path, "/leader/"), "/")
	running := runningElections()
	_, electionNamedShards := running["shards"]
	_, electionNamedJobs := running["jobs"]
	switch {
	case strings.HasPrefix(rest, "shards/") && !electionNamedShards:
		return serveShards(w, r, strings.TrimPrefix(rest, "shards/"))
	case (rest == "jobs" || strings.HasPrefix(rest, "jobs/")) && !electionNamedJobs:
		return serveJobs(w, r, strings.TrimPrefix(strings.TrimPrefix(rest, "jobs"), "/"))
	case rest == "":
		if r.Method != http.MethodGet {
			return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: errors.New("use GET")}
		}
		return listElections(w, r)
	case strings.HasSuffix(rest, "/history"):
		if r.Method != http.MethodGet {
			return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: errors.New("use GET")}
		}
		return history(w, r, strings.TrimSuffix(rest, "/history"))
	case strings.HasSuffix(rest, "/resign"):
		if r.Method != http.MethodPost {
			return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: errors.New("use POST")}
		}
		return resign(w, r, strings.TrimSuffix(rest, "/resign"))
	case strings.HasSuffix(rest, "/transfer"):
		if r.Method != http.MethodPost {
			return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: errors.New("use POST")}
		}
		return transfer(w, r, strings.TrimSuffix(rest, "/transfer"))
	default:
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no such leader endpoint: %s", r.URL.Path)}
	}
}

func listElections(w http.ResponseWriter, r *http.Request) error {
	now := time.Now()
	list := []ElectionStatus{}
	for name, e := range runningElections() {
		if _, _, shard := shardOf(name); !shard {
			list = append(list, electionstatus.Of(r.Context(), e, now))
		}
	}
	sort.Slice(list, func(i, j int) bool { return list[i].Election < list[j].Election })
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(map[string]any{"elections": list, "shard_sets": listShardSets(r.Context(), now)})
}

func electionNamed(name string) (*elector.Election, error) {
	e, ok := runningElections()[name]
	if !ok {
		return nil, caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("this instance takes no part in election %q", name)}
	}
	return e, nil
}

// durationParam reads a non-negative duration from the query, or def when it is absent.
func durationParam(r *http.Request, name string, def time.Duration) (time.Duration, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return def, nil
	}
	d, err := caddy.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("%s: %q is not a non-negative duration", name, v)}
	}
	return d, nil
}

// HistoryStatus is an election's history as GET /leader/<election>/history reports it.
type HistoryStatus struct {
	// Election is the election's name.
	Election string `json:"election"`
	// Terms are its ended terms, oldest first.
	Terms []elector.PastTerm `json:"terms"`
}

func history(w http.ResponseWriter, r *http.Request, name string) error {
	e, err := electionNamed(name)
	if err != nil {
		return err
	}
	terms, err := e.History(r.Context())
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusBadGateway, Err: fmt.Errorf("reading the history of election %q: %v", name, err)}
	}
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(HistoryStatus{Election: name, Terms: terms})
}

func resign(w http.ResponseWriter, r *http.Request, name string) error {
	e, err := electionNamed(name)
	if err != nil {
		return err
	}
	holdOff, err := durationParam(r, "hold_off", e.Candidate().TTL())
	if err != nil {
		return err
	}
	t := e.Term()
	ctx, cancel := context.WithTimeout(r.Context(), e.Candidate().HandoverTimeout())
	defer cancel()
	result := map[string]any{"election": name, "token": t.Token, "hold_off": holdOff.String()}
	if t.Holds() {
		if err := e.Resign(ctx, holdOff); err != nil {
			return refusal(fmt.Errorf("resigning election %q: %w", name, err))
		}
		result["resigned"] = t.Self
	} else {
		if err := e.RequestResign(ctx, holdOff); err != nil {
			return refusal(fmt.Errorf("asking the leader of election %q to resign: %w%s", name, err, storeTrouble(e)))
		}
		result["asked"] = t.Leader.ID
		w.WriteHeader(http.StatusAccepted)
	}
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(result)
}

func transfer(w http.ResponseWriter, r *http.Request, name string) error {
	e, err := electionNamed(name)
	if err != nil {
		return err
	}
	to := r.URL.Query().Get("to")
	if to == "" {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: errors.New("to: name the instance_id that should lead")}
	}
	timeout, err := durationParam(r, "timeout", 2*e.Candidate().TTL())
	if err != nil {
		return err
	}
	if r.URL.Query().Get("force") != "true" { // force: a test's storm, or a move the operator knows placement undoes
		if err := checkShardTransfer(r.Context(), e, to); err != nil {
			return err
		}
	}
	from := e.Term().Leader.ID
	if err := e.Transfer(r.Context(), to, timeout); err != nil {
		return refusal(err)
	}
	t := e.Term()
	result := map[string]any{"election": name, "from": from, "leader": t.Leader.ID, "token": t.Token}
	// From the election's view of the registry: a read here would be one more store
	// request at the moment the new leader starts.
	if list, err := e.KnownCandidates(r.Context()); err == nil {
		if warning := preemptedTransfer(list, to); warning != "" {
			result["warning"] = warning
		}
	}
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(result)
}

// checkShardTransfer refuses to transfer a shard of a set to another instance than the one
// placement prefers: placement would move it back within moments, and its clients would
// be cut off twice. It reads the election's view of the registry, as placement does.
func checkShardTransfer(ctx context.Context, e *elector.Election, to string) error {
	set, shard, ok := shardOf(e.Name())
	if !ok {
		return nil
	}
	list, err := e.KnownCandidates(ctx)
	if err != nil {
		return refusal(fmt.Errorf("reading the candidates of %s: %w", e.Name(), err))
	}
	preferred := shards.Owner(shard, electionstatus.Placed(list))
	if preferred == "" || preferred == to {
		return nil
	}
	return caddy.APIError{HTTPStatus: http.StatusConflict, Err: fmt.Errorf(
		"%s is a shard of set %s; placement prefers %s and would move it back from %s; to move shards, resign their owner (`caddy leader resign --shards %s`) or change priorities (force=true moves it all the same)",
		e.Name(), set, preferred, to, set)}
}

// refusal turns the error of a resign or transfer into the admin API's answer: a request
// that cannot be honoured is a 4xx that says why, a transfer that ran out of time a 504,
// and a store that failed a 502.
func refusal(err error) error {
	status := http.StatusBadGateway
	switch {
	case errors.Is(err, elector.ErrNotCandidate):
		status = http.StatusBadRequest
	case errors.Is(err, elector.ErrNeverLeads), errors.Is(err, elector.ErrNoLeader), errors.Is(err, elector.ErrTargetOut),
		errors.Is(err, elector.ErrTransferSuperseded):
		status = http.StatusConflict
	case errors.Is(err, elector.ErrTransferTimeout), errors.Is(err, context.DeadlineExceeded):
		status = http.StatusGatewayTimeout
	}
	return caddy.APIError{HTTPStatus: status, Err: err}
}

// preemptedTransfer says, when a healthy candidate with preempt outranks to, that it will
// take leadership back from to at once (or when its hold-off ends); else "".
func preemptedTransfer(list []elector.CandidateInfo, to string) string {
	target := -1
	for _, c := range list {
		if c.ID == to {
			target = c.Priority
		}
	}
	for _, c := range list {
		if c.ID == to || !c.Preempt || c.Leaving || c.Priority <= target {
			continue
		}
		when := "at once"
		if !c.HoldOffUntil.IsZero() {
			when = "when its hold-off ends at " + c.HoldOffUntil.UTC().Format(time.RFC3339)
		}
		return fmt.Sprintf("%s has priority %d and preempt, above %s's %d: it will take leadership back %s", c.ID, c.Priority, to, target, when)
	}
	return ""
}

// Interface guards
var (
	_ caddy.AdminRouter = AdminAPI{}
)
