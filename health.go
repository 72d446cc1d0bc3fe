package caddyleader

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddyleader/caddy-leader/elector"
)

func init() {
	caddy.RegisterModule(HealthHandler{})
}

// Default status codes of HealthHandler, as Vault's /sys/health answers.
const (
	DefaultHealthLeaderStatus    = http.StatusOK
	DefaultHealthStandbyStatus   = http.StatusTooManyRequests
	DefaultHealthUnhealthyStatus = http.StatusServiceUnavailable
)

// Health roles, as the body of HealthHandler names them.
const (
	HealthRoleLeader    = "leader"
	HealthRoleStandby   = "standby"
	HealthRoleSettling  = RoleSettling
	HealthRoleUnhealthy = "unhealthy"
)

// HealthHandler is the `leader_health` HTTP handler: a health check for load balancers and
// probes, as Vault's /sys/health is. It answers every request itself, with a status that
// says what this instance is in the election:
//
//	200  leader: it leads, by the same per-request test as `leader_gate`
//	429  healthy standby: it takes part and its lease is live, but it does not lead (a
//	     follower, an instance handing over, one held off after a resign, or any instance
//	     while no one leads); the role is "settling" for an instance that has just taken
//	     the key and waits, up to one ttl, for the previous term to be proven over
//	503  unhealthy: its lease is not live (the store is out of reach, it has not joined
//	     yet) or it is leaving the election; or no instance leads and, as far as the
//	     store's registry shows, none can (every candidate has priority 0)
//
// and a small JSON body (none for HEAD):
//
//	{"election":"default","role":"standby","self":"node-b","leader":"node-a","token":42,
//	 "detail":"a healthy standby; node-a leads"}
//
// leader is null and token 0 while no instance leads; detail then says so. A load balancer
// that sends traffic to the leader only checks for 200; one that spreads it over every
// healthy instance (followers forward) treats 200 and 429 as up, or sets standby_ok.
//
// With ShardSet it answers for the shard of the request's key instead (`GET
// /health/owner?room=42`): 200 on the instance that owns that shard and admits its
// requests, by the same test as a `leader_gate` of the set, 429 on every other healthy
// instance, and the body names the shard and its election (`rooms.<n>`), so that a load
// balancer can health-check "who owns room 42".
type HealthHandler struct {
	// Election is the name of the election. Default: `default` (none with ShardSet).
	Election string `json:"election,omitempty"`

	// ShardSet names a shard set of the leader app (see ShardSet): the handler then
	// answers for the shard of the request's key, with LeaderStatus on the instance that
	// owns that shard and admits its requests, and as for an election elsewhere. It needs
	// ShardKey, and excludes Election and StandbyOK (with StandbyOK every healthy
	// instance would answer alike, whatever the key). Default: none.
	ShardSet string `json:"shard_set,omitempty"`

	// ShardKey is the request's key in ShardSet, with placeholders, as leader_gate's
	// shard_key: a query value (`{http.request.uri.query.room}`), a path segment
	// (`{http.request.uri.path.2}`), a header, or any text built from them. A request
	// without the key is answered for the shard of the empty key, as the gate admits it
	// there. Default: none.
	ShardKey string `json:"shard_key,omitempty"`

	// LeaderStatus is the status the leader answers with (Vault's activecode). Default: 200.
	LeaderStatus int `json:"leader_status,omitempty"`
	// StandbyStatus is the status a healthy standby answers with (Vault's standbycode).
	// Default: 429.
	StandbyStatus int `json:"standby_status,omitempty"`
	// StandbyOK makes a healthy standby answer with LeaderStatus instead of StandbyStatus
	// (Vault's standbyok), for a load balancer that knows only "up" and "down" and should
	// send traffic to every healthy instance. Default: false.
	StandbyOK bool `json:"standby_ok,omitempty"`
	// UnhealthyStatus is the status an instance answers with while it is not a healthy
	// candidate. Default: 503.
	UnhealthyStatus int `json:"unhealthy_status,omitempty"`

	election *elector.Election   // without a shard set
	shards   []*elector.Election // with a shard set: its elections, in shard order
	key      shardKey
}

// CaddyModule returns the Caddy module information.
func (HealthHandler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.leader_health",
		New: func() caddy.Module { return new(HealthHandler) },
	}
}

// Provision implements caddy.Provisioner.
func (h *HealthHandler) Provision(ctx caddy.Context) error {
	if h.ShardSet != "" || h.ShardKey != "" {
		if err := h.provisionShards(ctx); err != nil {
			return err
		}
	} else {
		_, e, err := joinElection(ctx, "leader_health", &h.Election)
		if err != nil {
			return err
		}
		h.election = e
	}
	if h.LeaderStatus == 0 {
		h.LeaderStatus = DefaultHealthLeaderStatus
	}
	if h.StandbyStatus == 0 {
		h.StandbyStatus = DefaultHealthStandbyStatus
	}
	if h.UnhealthyStatus == 0 {
		h.UnhealthyStatus = DefaultHealthUnhealthyStatus
	}
	return nil
}

// provisionShards sets up a handler that answers for the shard of each request's key.
func (h *HealthHandler) provisionShards(ctx caddy.Context) error {
	if h.ShardSet != "" && h.StandbyOK {
		return fmt.Errorf("leader_health: %v", errStandbyOKWithShard)
	}
	_, set, key, err := joinShardSet(ctx, "leader_health", h.Election, h.ShardSet, h.ShardKey)
	if err != nil {
		return err
	}
	h.shards, h.key = set.elections, key
	return nil
}

// errStandbyOKWithShard: a keyed check with standby_ok would answer alike on every healthy
// instance, whatever the key.
var errStandbyOKWithShard = errors.New("standby_ok: a check by shard answers who owns the key's shard; with standby_ok every healthy instance would answer alike (leader_health without shard is that check)")

// Validate implements caddy.Validator.
func (h *HealthHandler) Validate() error {
	for _, s := range []struct {
		name string
		code int
	}{{"leader_status", h.LeaderStatus}, {"standby_status", h.StandbyStatus}, {"unhealthy_status", h.UnhealthyStatus}} {
		if err := checkHealthStatus(s.code); err != nil {
			return fmt.Errorf("leader_health: %s: %v", s.name, err)
		}
	}
	return nil
}

// checkHealthStatus accepts the codes a health check can answer with: any from 200 to 599.
func checkHealthStatus(code int) error {
	if code < 200 || code > 599 {
		return fmt.Errorf("%d is not an HTTP status from 200 to 599", code)
	}
	return nil
}

// HealthReport is the body HealthHandler answers with.
type HealthReport struct {
	// Election is the election's name: `<set>.<n>` for a shard.
	Election string `json:"election"`
	// Shard is the number of the request's shard, with a shard set; absent otherwise.
	Shard *int `json:"shard,omitempty"`
	// Role is leader, settling, standby or unhealthy.
	Role string `json:"role"`
	// Self is this instance's instance_id.
	Self string `json:"self"`
	// Leader is the current leader's instance_id; null while no instance leads.
	Leader *string `json:"leader"`
	// Token is the fencing token of the current term; 0 while no instance leads.
	Token int64 `json:"token"`
	// Detail says the same in a sentence.
	Detail string `json:"detail"`
}

// electionOf is the election that request r asks about, and its shard number (-1 without
// a shard set).
func (h *HealthHandler) electionOf(r *http.Request) (*elector.Election, int) {
	if h.shards == nil {
		return h.election, -1
	}
	s := h.key.requestShard(r, len(h.shards))
	return h.shards[s], s
}

// report says what this instance is in election e now, and the status it answers with.
func (h *HealthHandler) report(e *elector.Election) (HealthReport, int) {
	t, leading := e.Check()
	r := HealthReport{Election: t.Election, Self: t.Self, Token: t.Token}
	if t.LeaderKnown() {
		id := t.Leader.ID
		r.Leader = &id
	}
	switch {
	case leading:
		r.Role, r.Detail = HealthRoleLeader, "this instance leads"
		return r, h.LeaderStatus
	case !t.LeaderKnown() && e.NobodyCanLead():
		// Not a standby: there is nothing to stand by for, and a load balancer that kept
		// sending traffic here would never see it served.
		r.Role = HealthRoleUnhealthy
		r.Detail = "no instance leads election " + t.Election + ", and none can: every candidate has priority 0"
		return r, h.UnhealthyStatus
	case e.Healthy():
		status := h.StandbyStatus
		if h.StandbyOK {
			status = h.LeaderStatus
		}
		if settling(t) {
			r.Role, r.Detail = HealthRoleSettling, "this instance holds the key and waits, up to one ttl, for the previous term to be proven over before it admits"
			return r, status
		}
		r.Role = HealthRoleStandby
		r.Detail = "a healthy standby; " + whoLeads(t)
		return r, status
	default:
		r.Role = HealthRoleUnhealthy
		r.Detail = "not a healthy candidate: its lease is not live or it is leaving; " + whoLeads(t)
		return r, h.UnhealthyStatus
	}
}

// whoLeads names the leader of t, or says that no instance leads.
func whoLeads(t *elector.Term) string {
	switch {
	case !t.LeaderKnown():
		return "no instance leads election " + t.Election
	case t.Leader.HandingOver:
		return t.Leader.ID + " leads and is handing over"
	default:
		return t.Leader.ID + " leads"
	}
}

// ServeHTTP implements caddyhttp.MiddlewareHandler. It answers every request and never
// calls next.
func (h *HealthHandler) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	e, shard := h.electionOf(r)
	rep, status := h.report(e)
	if shard >= 0 {
		rep.Shard = &shard
	}
	hdr := w.Header()
	hdr.Set("Content-Type", "application/json")
	// A cached answer would outlive the role it reports.
	hdr.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	// HEAD, and the statuses that may not carry a body, get the status alone.
	if r.Method == http.MethodHead || status == http.StatusNoContent || status == http.StatusNotModified {
		return nil
	}
	return json.NewEncoder(w).Encode(rep)
}

// Interface guards
var (
	_ caddy.Provisioner           = (*HealthHandler)(nil)
	_ caddy.Validator             = (*HealthHandler)(nil)
	_ caddyhttp.MiddlewareHandler = (*HealthHandler)(nil)
)
