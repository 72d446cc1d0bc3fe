package caddyleader

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/internal/termconn"
)

// Request outcomes counted by caddy_leader_requests_total.
const (
	outcomeServed     = "served"
	outcomeRejected   = "rejected"
	outcomeRedirected = "redirected"
	outcomeForwarded  = "forwarded"
)

// metrics are process-wide. Every config load brings a new Prometheus registry, so the
// collectors are made once and registered with each new registry: counters go on counting
// across reloads, and a registry never sees one collector twice.
var metrics = struct {
	transitions  *prometheus.CounterVec
	requests     *prometheus.CounterVec
	holdDuration *prometheus.HistogramVec
	storeErrors  *prometheus.CounterVec
	shardMoves   *prometheus.CounterVec
	jobRuns      *prometheus.CounterVec
	jobDuration  *prometheus.HistogramVec
	jobLateness  *prometheus.HistogramVec
	jobMissed    *prometheus.CounterVec
	state        stateCollector
}{
	transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "leader", Name: "transitions_total",
		Help: "Changes of this instance's role in an election, by the role it changed to (leader, follower).",
	}, []string{"election", "to"}),
	requests: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "leader", Name: "requests_total",
		Help: "Gated requests by outcome (served, rejected, redirected, forwarded); each request is counted once, by how it ended.",
	}, []string{"election", "outcome"}),
	// A held request ends as one of the outcomes above, so holding is measured apart from
	// them: the histogram's count is the number of held requests, its sum the time they waited.
	holdDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "caddy", Subsystem: "leader", Name: "hold_duration_seconds",
		Help:    "How long gated requests were held waiting for a leader, whatever their outcome.",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	}, []string{"election"}),
	storeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "leader", Name: "store_errors_total",
		Help: "Failed requests to the election store by operation (grant, renew, campaign, release).",
	}, []string{"op"}),
	// A shard's election changes hands far more often than a plain one, and a set may have
	// thousands: its moves are counted per set, never per shard.
	shardMoves: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "leader", Name: "shard_moves_total",
		Help: "Shards of a set that this instance came to own (direction in) or stopped owning (direction out).",
	}, []string{"set", "direction"}),
	// A job's runs are counted per job, never per slot or shard: a job on a shard set of
	// thousands runs under thousands of terms. The label is job_name, not job: Prometheus
	// gives every scraped series its target's job label, and would rename ours exported_job.
	jobRuns: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "leader", Name: "job_runs_total",
		Help: "Runs of a job by this instance, by result (ok, failed, timeout, cancelled).",
	}, []string{"job_name", "result"}),
	jobDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "caddy", Subsystem: "leader", Name: "job_run_duration_seconds",
		Help:    "How long the runs of a job took, from their first attempt to their end, retries included.",
		Buckets: []float64{.01, .05, .1, .5, 1, 5, 10, 30, 60, 300, 900},
	}, []string{"job_name"}),
	jobLateness: prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "caddy", Subsystem: "leader", Name: "job_lateness_seconds",
		Help:    "How long after its slot a run of a job began.",
		Buckets: []float64{.001, .01, .05, .1, .5, 1, 5, 10, 60, 300},
	}, []string{"job_name"}),
	jobMissed: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "leader", Name: "job_missed_slots_total",
		Help: "Slots of a job that passed without a run, by reason (no leader, overlap).",
	}, []string{"job_name", "reason"}),
}

// metricCollectors are every collector the plugin exports.
func metricCollectors() []prometheus.Collector {
	return append([]prometheus.Collector{metrics.transitions, metrics.requests, metrics.holdDuration, metrics.storeErrors, metrics.shardMoves, metrics.state,
		metrics.jobRuns, metrics.jobDuration, metrics.jobLateness, metrics.jobMissed,
		failsafeRounds, failsafeCollector{}}, termconn.Collectors()...)
}

// registerMetrics adds the collectors to a config's registry.
func registerMetrics(reg *prometheus.Registry) error {
	if reg == nil {
		return nil
	}
	for _, c := range metricCollectors() {
		if err := reg.Register(c); err != nil && !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
			return err
		}
	}
	return nil
}

// gateCounters are one gate's request counters, resolved once so that a request pays for
// an atomic add, not a label lookup.
type gateCounters struct {
	served, rejected, redirected, forwarded prometheus.Counter
	held                                    prometheus.Observer
}

func newGateCounters(election string) gateCounters {
	c := func(outcome string) prometheus.Counter { return metrics.requests.WithLabelValues(election, outcome) }
	return gateCounters{
		served: c(outcomeServed), rejected: c(outcomeRejected), redirected: c(outcomeRedirected),
		forwarded: c(outcomeForwarded), held: metrics.holdDuration.WithLabelValues(election),
	}
}

// stateCollector reports the state of every election of this process when scraped, so the
// gauges are never stale and need no updating on the request path.
type stateCollector struct{}

var (
	isLeaderDesc = prometheus.NewDesc("caddy_leader_is_leader",
		"1 while this instance leads the election (holds the key and its lease deadline is ahead), else 0.", []string{"election"}, nil)
	leaseRemainingDesc = prometheus.NewDesc("caddy_leader_lease_remaining_seconds",
		"How long this instance's lease deadline is still ahead.", []string{"election"}, nil)
	termTokenDesc = prometheus.NewDesc("caddy_leader_term_token",
		"Fencing token of the current term as this instance knows it; 0 when no leader is known.", []string{"election"}, nil)
	termStartDesc = prometheus.NewDesc("caddy_leader_term_start_timestamp_seconds",
		"When the current term began (Unix seconds, by its holder's clock); 0 when no leader is known.", []string{"election"}, nil)
	inFlightDesc = prometheus.NewDesc("caddy_leader_requests_in_flight",
		"Gated requests admitted by this instance that have not finished yet.", []string{"election"}, nil)
	// A timestamp rather than an age, and exported from the start (0 = never), so that an
	// alert on "no contact since start" needs no absent() and survives scrapes of a stuck process.
	shardsDesc = prometheus.NewDesc("caddy_leader_shards",
		"Shards in the set.", []string{"set"}, nil)
	shardsOwnedDesc = prometheus.NewDesc("caddy_leader_shards_owned",
		"Shards of the set this instance owns (leads) now.", []string{"set"}, nil)
	shardsMovingDesc = prometheus.NewDesc("caddy_leader_shards_moving",
		"Shards of the set this instance holds but does not admit for: handing over, or waiting for the previous owner to stop.", []string{"set"}, nil)
	lastContactDesc = prometheus.NewDesc("caddy_leader_last_store_contact_timestamp_seconds",
		"When the store last confirmed this instance's lease (Unix seconds); 0 if it never has.", nil, nil)
)

// Describe implements prometheus.Collector.
func (stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- isLeaderDesc
	ch <- leaseRemainingDesc
	ch <- termTokenDesc
	ch <- termStartDesc
	ch <- inFlightDesc
	ch <- shardsDesc
	ch <- shardsOwnedDesc
	ch <- shardsMovingDesc
	ch <- lastContactDesc
}

// Collect implements prometheus.Collector.
func (stateCollector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	var lastContact time.Time
	sets := make(map[string]*shardSetState)
	for name, e := range runningElections() {
		t := e.Term()
		if set, _, ok := shardOf(name); ok {
			st := sets[set]
			if st == nil {
				st = new(shardSetState)
				sets[set] = st
			}
			st.add(e, t, now)
			continue
		}
		leading := 0.0
		if t.Leading(now) {
			leading = 1
		}
		ch <- prometheus.MustNewConstMetric(isLeaderDesc, prometheus.GaugeValue, leading, name)
		ch <- prometheus.MustNewConstMetric(leaseRemainingDesc, prometheus.GaugeValue, e.Candidate().LeaseRemaining().Seconds(), name)
		ch <- prometheus.MustNewConstMetric(termTokenDesc, prometheus.GaugeValue, float64(t.Token), name)
		ch <- prometheus.MustNewConstMetric(termStartDesc, prometheus.GaugeValue, unixSeconds(t.Leader.Since), name)
		ch <- prometheus.MustNewConstMetric(inFlightDesc, prometheus.GaugeValue, float64(e.InFlight()), name)
		if c := e.Candidate().LastContact(); c.After(lastContact) {
			lastContact = c
		}
	}
	for set, st := range sets {
		ch <- prometheus.MustNewConstMetric(shardsDesc, prometheus.GaugeValue, float64(st.shards), set)
		ch <- prometheus.MustNewConstMetric(shardsOwnedDesc, prometheus.GaugeValue, float64(st.owned), set)
		ch <- prometheus.MustNewConstMetric(shardsMovingDesc, prometheus.GaugeValue, float64(st.moving), set)
		ch <- prometheus.MustNewConstMetric(inFlightDesc, prometheus.GaugeValue, float64(st.inFlight), set)
		if c := st.lastContact; c.After(lastContact) {
			lastContact = c
		}
	}
	ch <- prometheus.MustNewConstMetric(lastContactDesc, prometheus.GaugeValue, unixSeconds(lastContact))
}

// shardSetState sums the state of one shard set's elections in this process.
type shardSetState struct {
	shards, owned, moving int
	inFlight              int64
	lastContact           time.Time
}

func (st *shardSetState) add(e *elector.Election, t *elector.Term, now time.Time) {
	st.shards++
	switch {
	case t.Leading(now):
		st.owned++
	case t.Holds():
		st.moving++
	}
	st.inFlight += e.InFlight()
	if c := e.Candidate().LastContact(); c.After(st.lastContact) {
		st.lastContact = c
	}
}

// unixSeconds is t as Unix seconds, and 0 for the zero time ("never").
func unixSeconds(t time.Time) float64 {
	if t.IsZero() {
		return 0
	}
	return float64(t.UnixNano()) / 1e9
}

// countTransition counts a change of this instance's role between two terms.
func countTransition(e *elector.Election, prev, next *elector.Term) {
	if set, _, ok := shardOf(e.Name()); ok {
		switch {
		case !prev.Holds() && next.Holds():
			metrics.shardMoves.WithLabelValues(set, "in").Inc()
		case prev.Holds() && !next.Holds():
			metrics.shardMoves.WithLabelValues(set, "out").Inc()
		}
		return
	}
	switch {
	case !prev.Holds() && next.Holds():
		metrics.transitions.WithLabelValues(e.Name(), "leader").Inc()
	case prev.Holds() && !next.Holds():
		metrics.transitions.WithLabelValues(e.Name(), "follower").Inc()
	}
}

var _ prometheus.Collector = stateCollector{}
