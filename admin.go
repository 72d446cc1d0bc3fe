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

	"github.com/caddyleader/caddy-leader/elector"
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
//	GET  /leader/<election>/history          the election's ended terms (the latest 100), oldest
//	                                         first, as the store keeps them for every instance
//	POST /leader/<election>/resign           the leader hands over and stays out of the election
//	                                         for ?hold_off=<duration> (default: one ttl)
//	POST /leader/<election>/transfer?to=<id> planned switchover to a named candidate; the others
//	                                         stand aside until it leads or ?timeout=<duration>
//	                                         (default: two ttls) passes
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

// ElectionStatus is one election as GET /leader/ reports it.
type ElectionStatus struct {
	// Election is the election's name.
	Election string `json:"election"`
	// Self is this instance's instance_id.
	Self string `json:"self"`
	// Role is leader, handing_over, follower, or candidate (no leader known).
	Role string `json:"role"`
	// LeaderID is the current leader's instance_id; empty while none is known.
	LeaderID string `json:"leader_id,omitempty"`
	// LeaderURL is the current leader's advertise URL; empty while none is known.
	LeaderURL string `json:"leader_url,omitempty"`
	// Token is the fencing token of the current term; 0 while no leader is known.
	Token int64 `json:"token,omitempty"`
	// TermStart is when the current term began.
	TermStart time.Time `json:"term_start,omitzero"`
	// LeaseRemaining is how long this instance's lease deadline is ahead, in seconds.
	LeaseRemaining float64 `json:"lease_remaining_seconds"`
	// LastContact is when etcd last confirmed this instance's lease.
	LastContact time.Time `json:"last_etcd_contact,omitzero"`
	// InFlight counts the gated requests this instance admitted that are still running.
	InFlight int64 `json:"in_flight"`
	// Healthy is what the leader_health handler and the leader_candidate matcher test: this
	// instance takes part and its lease is live. A held-off instance is healthy.
	Healthy bool `json:"healthy"`
	// Priority is this instance's priority option; 0 never leads.
	Priority int `json:"priority"`
	// Preempt is this instance's preempt option.
	Preempt bool `json:"preempt,omitempty"`
	// HoldOff is how long this instance still stays out of the election after a resign or
	// a step-down, in seconds; 0 when it is free to campaign.
	HoldOff float64 `json:"hold_off_seconds"`
	// Leaving is set while this instance leaves the election (a graceful stop).
	Leaving bool `json:"leaving,omitempty"`
	// Reason says why the last change of this election's state happened.
	Reason string `json:"reason"`
	// Changed is when that change happened.
	Changed time.Time `json:"changed_at"`
	// Candidates are the election's live candidates, this instance included, as the
	// store's registry lists them: the whole fleet, seen from any instance.
	Candidates []CandidateStatus `json:"candidates"`
	// CandidatesError says why the registry could not be read; Candidates is then empty.
	CandidatesError string `json:"candidates_error,omitempty"`
	// Failsafe is the election's failsafe state; absent when failsafe is off.
	Failsafe *elector.FailsafeStatus `json:"failsafe,omitempty"`
}

// CandidateStatus is one live candidate of an election as GET /leader/ reports it.
type CandidateStatus struct {
	// ID is the candidate's instance_id.
	ID string `json:"id"`
	// URL is the candidate's advertise URL.
	URL string `json:"url,omitempty"`
	// Healthy means what it means for this instance (see ElectionStatus.Healthy): the
	// candidate takes part (its registry entry lives with its lease) and is not leaving. A
	// held-off candidate is healthy.
	Healthy bool `json:"healthy"`
	// Priority is the candidate's priority option; 0 never campaigns.
	Priority int `json:"priority"`
	// Preempt is the candidate's preempt option.
	Preempt bool `json:"preempt,omitempty"`
	// HoldOffUntil is when the candidate's hold-off ends, while it is held off.
	HoldOffUntil time.Time `json:"hold_off_until,omitzero"`
	// Leaving is set while the candidate leaves the election (a graceful stop).
	Leaving bool `json:"leaving,omitempty"`
}

// withCandidates adds the election's live candidates to s, reading the store's registry.
func withCandidates(ctx context.Context, s ElectionStatus, e *elector.Election) ElectionStatus {
	list, err := e.Candidates(ctx)
	s.Candidates = []CandidateStatus{}
	if err != nil {
		s.CandidatesError = err.Error()
		return s
	}
	for _, c := range list {
		s.Candidates = append(s.Candidates, CandidateStatus{ID: c.ID, URL: c.URL, Healthy: !c.Leaving, Priority: c.Priority,
			Preempt: c.Preempt, HoldOffUntil: c.HoldOffUntil, Leaving: c.Leaving})
	}
	return s
}

func statusOf(e *elector.Election, now time.Time) ElectionStatus {
	t := e.Term()
	role := "candidate"
	switch {
	case t.Leading(now):
		role = "leader"
	case t.Holds():
		role = "handing_over"
	case t.LeaderKnown():
		role = "follower"
	}
	var fs *elector.FailsafeStatus
	if st := e.Failsafe(); st.Enabled {
		fs = &st
	}
	holdOff, leaving := e.HoldOff()
	return ElectionStatus{
		Failsafe:       fs,
		Election:       t.Election,
		Self:           t.Self,
		Role:           role,
		LeaderID:       t.Leader.ID,
		LeaderURL:      t.Leader.URL,
		Token:          t.Token,
		TermStart:      t.Leader.Since,
		LeaseRemaining: e.Candidate().LeaseRemaining().Seconds(),
		LastContact:    e.Candidate().LastContact(),
		InFlight:       e.InFlight(),
		Healthy:        e.Healthy(),
		Priority:       e.Candidate().Priority(),
		Preempt:        e.Candidate().Preempts(),
		HoldOff:        holdOff.Seconds(),
		Leaving:        leaving,
		Reason:         t.Reason,
		Changed:        t.At,
	}
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
	switch {
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
	for _, e := range runningElections() {
		list = append(list, withCandidates(r.Context(), statusOf(e, now), e))
	}
	sort.Slice(list, func(i, j int) bool { return list[i].Election < list[j].Election })
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(map[string]any{"elections": list})
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
			return refusal(fmt.Errorf("asking the leader of election %q to resign: %w", name, err))
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

// refusal turns the error of a resign or transfer into the admin API's answer: a request
// that cannot be honoured is a 4xx that says why, a transfer that ran out of time a 504,
// and a store that failed a 502.
func refusal(err error) error {
	status := http.StatusBadGateway
	switch {
	case errors.Is(err, elector.ErrNotCandidate):
		status = http.StatusBadRequest
	case errors.Is(err, elector.ErrNeverLeads), errors.Is(err, elector.ErrNoLeader):
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
