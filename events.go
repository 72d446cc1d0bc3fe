package caddyleader

import (
	"context"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"go.uber.org/zap"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/internal/termconn"
	"github.com/caddyleader/caddy-leader/jobs"
)

// Events the leader app emits through Caddy's events app. The election events carry the
// data election, self, leader, previous_leader, token and reason.
const (
	// EventElected: this instance became the leader of an election.
	EventElected = "leader_elected"
	// EventLost: this instance stopped leading an election.
	EventLost = "leader_lost"
	// EventChanged: the known leader of an election changed (on every instance).
	EventChanged = "leader_changed"

	// EventStoreUnreachable: a request that keeps this instance's lease (grant or renewal)
	// failed after the store last confirmed it, as keepalived's FAULT notify. Once per
	// outage, not per failed request. Data: self, op, error.
	EventStoreUnreachable = "leader_store_unreachable"
	// EventStoreReachable: the store confirmed the lease again after
	// EventStoreUnreachable. Data: self, failed_requests, unreachable_seconds.
	EventStoreReachable = "leader_store_reachable"

	// EventShardOwned: this instance came to own a shard of a shard set (it leads the
	// shard's election). EventShardLost: it stopped owning one. Data: set, shard,
	// election, self, leader, previous_leader, token, reason. A shard's changes of
	// leader seen from elsewhere are not events: a set has too many shards.
	EventShardOwned = "leader_shard_owned"
	EventShardLost  = "leader_shard_lost"

	// EventConnectionsCut: connections admitted under a term of this instance (layer-4
	// connections, HTTP upgrades) were cut because the term stopped admitting. One event
	// per batch cut at once. Data: election, self, token, kind (layer4, http), reason
	// (handover, released, deadline, ended), count.
	EventConnectionsCut = "leader_connections_cut"

	// EventJobStarted: this instance began a run of a scheduled job. Data: job, election,
	// shard (-1 for a job on an election), slot, token, self, missed, rerun, manual,
	// lateness_seconds.
	EventJobStarted = "leader_job_started"
	// EventJobFinished: a run of a job on this instance ended. Data: those of
	// EventJobStarted (without lateness_seconds), and result (ok, failed, timeout,
	// cancelled), attempts, duration_seconds and error (empty on success).
	EventJobFinished = "leader_job_finished"
	// EventJobMissed: slots of a job passed without a run while this instance led (or
	// came to lead after them). Data: job, election, self, slots, reason (no leader,
	// overlap).
	EventJobMissed = "leader_job_missed"
)

// candidateObserver turns what the elector reports into metrics and Caddy events. One is
// made per config load, with that config's events app; events go out in order from one
// goroutine, so that a slow event handler (a command run on promotion, say) never holds up
// the election.
type candidateObserver struct {
	events *caddyevents.App
	ctx    caddy.Context
	self   string // this instance's instance_id
	queue  chan pendingEvent
	// started is closed when Caddy has started every app of the config: the events app
	// subscribes its handlers in its Start, and an Emit before then would race with that.
	started chan struct{}

	// outage is the store outage in progress (nil while the store answers): the first
	// failed lease request opens it, the next confirmed one closes it.
	outageMu sync.Mutex
	outage   *storeOutage
}

type storeOutage struct {
	since    time.Time
	failures int
}

type pendingEvent struct {
	name string
	data map[string]any
}

// eventQueueSize bounds the events waiting for slow handlers; past it, events are dropped
// (and logged) rather than blocking the election.
const eventQueueSize = 256

// shards is how many shards the config's shard sets have in all: the queue has room for an
// event of each, as a shutdown moves every shard an instance owns at once.
func newCandidateObserver(ctx caddy.Context, self string, shards int) (*candidateObserver, error) {
	events, err := ctx.App("events")
	if err != nil {
		return nil, err
	}
	o := &candidateObserver{events: events.(*caddyevents.App), ctx: ctx, self: self,
		queue: make(chan pendingEvent, eventQueueSize+shards), started: make(chan struct{})}
	// Caddy emits "started" once every app of the config, the events app included, has
	// started; subscribing here, while the config is still being provisioned, is allowed.
	if err := o.events.On("started", configStarted{o.started}); err != nil {
		return nil, err
	}
	go o.emitLoop()
	return o, nil
}

// configStarted closes its channel when the config has started.
type configStarted struct{ started chan struct{} }

// Handle implements caddyevents.Handler.
func (h configStarted) Handle(context.Context, caddy.Event) error {
	select {
	case <-h.started:
	default:
		close(h.started)
	}
	return nil
}

// emitLoop sends events, from the moment the config has started until it is unloaded.
func (o *candidateObserver) emitLoop() {
	select {
	case <-o.ctx.Done():
		return
	case <-o.started:
	}
	for {
		select {
		case <-o.ctx.Done():
			return
		case ev := <-o.queue:
			o.events.Emit(o.ctx, ev.name, ev.data)
		}
	}
}

// TermChanged implements elector.Observer.
func (o *candidateObserver) TermChanged(e *elector.Election, prev, next *elector.Term) {
	countTransition(e, prev, next)
	data := func() map[string]any {
		return map[string]any{
			"election": next.Election, "self": next.Self, "leader": next.Leader.ID,
			"previous_leader": prev.Leader.ID, "token": next.Token, "reason": next.Reason,
		}
	}
	if set, shard, ok := shardOf(e.Name()); ok {
		shardData := func() map[string]any {
			d := data()
			d["set"], d["shard"] = set, shard
			return d
		}
		switch {
		case !prev.Holds() && next.Holds():
			o.enqueue(EventShardOwned, shardData())
		case prev.Holds() && !next.Holds():
			o.enqueue(EventShardLost, shardData())
		}
		return
	}
	switch {
	case !prev.Holds() && next.Holds():
		o.enqueue(EventElected, data())
	case prev.Holds() && !next.Holds():
		o.enqueue(EventLost, data())
	}
	if prev.Leader.ID != next.Leader.ID || prev.Token != next.Token {
		o.enqueue(EventChanged, data())
	}
}

func (o *candidateObserver) enqueue(name string, data map[string]any) {
	select {
	case o.queue <- pendingEvent{name, data}:
	default:
		o.ctx.Logger().Error("event queue full; dropping event", zap.String("event", name))
	}
}

// StoreFailed implements elector.Observer. Only the lease's requests (grant, renew) count
// towards an outage: they are what "contact with the store" means here (as in
// caddy_leader_last_store_contact_timestamp_seconds), and a campaign refused while renewals
// go through must not make the events flap.
func (o *candidateObserver) StoreFailed(op string, err error) {
	metrics.storeErrors.WithLabelValues(op).Inc()
	if op != "grant" && op != "renew" {
		return
	}
	o.outageMu.Lock()
	defer o.outageMu.Unlock()
	if o.outage != nil {
		o.outage.failures++
		return
	}
	o.outage = &storeOutage{since: time.Now(), failures: 1}
	o.enqueue(EventStoreUnreachable, map[string]any{"self": o.self, "op": op, "error": err.Error()})
}

// StoreContacted implements elector.ContactObserver.
func (o *candidateObserver) StoreContacted() {
	o.outageMu.Lock()
	defer o.outageMu.Unlock()
	if o.outage == nil {
		return
	}
	out := o.outage
	o.outage = nil
	o.enqueue(EventStoreReachable, map[string]any{
		"self": o.self, "failed_requests": out.failures,
		"unreachable_seconds": time.Since(out.since).Seconds(),
	})
}

// events are the runner's hooks: metrics, and the job's Caddy events through the newest
// config's events app.
func (p *pooledRunner) events() jobs.Events {
	enqueue := func(name string, data map[string]any) {
		if o := p.observer.Load(); o != nil {
			data["self"] = o.self
			o.enqueue(name, data)
		}
	}
	runData := func(r jobs.Run) map[string]any {
		return map[string]any{
			"job": r.Job, "election": r.Election, "shard": r.Shard, "slot": r.Slot.UTC().Format(time.RFC3339),
			"token": r.Token, "missed": r.Missed, "rerun": r.Rerun, "manual": r.Manual,
		}
	}
	return jobs.Events{
		Started: func(r jobs.Run, lateness time.Duration) {
			if !r.Manual {
				metrics.jobLateness.WithLabelValues(r.Job).Observe(max(lateness, 0).Seconds())
			}
			data := runData(r)
			data["lateness_seconds"] = lateness.Seconds()
			enqueue(EventJobStarted, data)
		},
		Finished: func(r jobs.Run, result string, took time.Duration, err error) {
			metrics.jobRuns.WithLabelValues(r.Job, result).Inc()
			metrics.jobDuration.WithLabelValues(r.Job).Observe(took.Seconds())
			data := runData(r)
			data["result"], data["attempts"], data["duration_seconds"], data["error"] = result, r.Attempt, took.Seconds(), ""
			if err != nil {
				data["error"] = err.Error()
			}
			enqueue(EventJobFinished, data)
		},
		Missed: func(job, election string, slots int, why string) {
			metrics.jobMissed.WithLabelValues(job, why).Add(float64(slots))
			enqueue(EventJobMissed, map[string]any{"job": job, "election": election, "slots": slots, "reason": why})
		},
	}
}

var (
	_ elector.ContactObserver = (*candidateObserver)(nil)
	_ caddyevents.Handler     = configStarted{}
)

// connectionsCut reports a batch of connections cut by a term's guard (see termconn).
func (o *candidateObserver) connectionsCut(c termconn.Cut) {
	o.enqueue(EventConnectionsCut, map[string]any{
		"election": c.Election,
		"self":     o.self,
		"token":    c.Token,
		"kind":     c.Kind,
		"reason":   c.Reason,
		"count":    c.Count,
	})
}
