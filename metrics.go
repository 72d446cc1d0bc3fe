package caddyleader

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/caddyleader/caddy-leader/elector"
)

// Request outcomes counted by caddy_leader_requests_total.
const (
	outcomeServed     = "served"
	outcomeRejected   = "rejected"
	outcomeRedirected = "redirected"
	outcomeForwarded  = "forwarded"
	outcomeHeld       = "held"
)

// metrics are process-wide. Every config load brings a new Prometheus registry, so the
// collectors are made once and registered with each new registry: counters go on counting
// across reloads, and a registry never sees one collector twice.
var metrics = struct {
	transitions *prometheus.CounterVec
	requests    *prometheus.CounterVec
	etcdErrors  *prometheus.CounterVec
	state       stateCollector
}{
	transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "leader", Name: "transitions_total",
		Help: "Changes of this instance's role in an election, by the role it changed to (leader, follower).",
	}, []string{"election", "to"}),
	requests: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "leader", Name: "requests_total",
		Help: "Gated requests by outcome: served, rejected, redirected, forwarded; held counts those that waited for a leader.",
	}, []string{"election", "outcome"}),
	etcdErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "leader", Name: "etcd_errors_total",
		Help: "Failed etcd requests by operation (grant, renew, campaign, release).",
	}, []string{"op"}),
}

// registerMetrics adds the collectors to a config's registry.
func registerMetrics(reg *prometheus.Registry) error {
	if reg == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{metrics.transitions, metrics.requests, metrics.etcdErrors, metrics.state} {
		if err := reg.Register(c); err != nil && !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
			return err
		}
	}
	return nil
}

// gateCounters are one gate's request counters, resolved once so that a request pays for
// an atomic add, not a label lookup.
type gateCounters struct {
	served, rejected, redirected, forwarded, held prometheus.Counter
}

func newGateCounters(election string) gateCounters {
	c := func(outcome string) prometheus.Counter { return metrics.requests.WithLabelValues(election, outcome) }
	return gateCounters{
		served: c(outcomeServed), rejected: c(outcomeRejected), redirected: c(outcomeRedirected),
		forwarded: c(outcomeForwarded), held: c(outcomeHeld),
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
		"Fencing token (etcd create revision) of the current term as this instance knows it; 0 when no leader is known.", []string{"election"}, nil)
	lastContactDesc = prometheus.NewDesc("caddy_leader_last_etcd_contact_seconds",
		"Seconds since etcd last confirmed this instance's lease.", nil, nil)
)

// Describe implements prometheus.Collector.
func (stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- isLeaderDesc
	ch <- leaseRemainingDesc
	ch <- termTokenDesc
	ch <- lastContactDesc
}

// Collect implements prometheus.Collector.
func (stateCollector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	var lastContact time.Time
	for name, e := range runningElections() {
		t := e.Term()
		leading := 0.0
		if t.Leading(now) {
			leading = 1
		}
		ch <- prometheus.MustNewConstMetric(isLeaderDesc, prometheus.GaugeValue, leading, name)
		ch <- prometheus.MustNewConstMetric(leaseRemainingDesc, prometheus.GaugeValue, e.Candidate().LeaseRemaining().Seconds(), name)
		ch <- prometheus.MustNewConstMetric(termTokenDesc, prometheus.GaugeValue, float64(t.Token), name)
		if c := e.Candidate().LastContact(); c.After(lastContact) {
			lastContact = c
		}
	}
	if !lastContact.IsZero() {
		ch <- prometheus.MustNewConstMetric(lastContactDesc, prometheus.GaugeValue, now.Sub(lastContact).Seconds())
	}
}

// countTransition counts a change of this instance's role between two terms.
func countTransition(e *elector.Election, prev, next *elector.Term) {
	switch {
	case !prev.Holds() && next.Holds():
		metrics.transitions.WithLabelValues(e.Name(), "leader").Inc()
	case prev.Holds() && !next.Holds():
		metrics.transitions.WithLabelValues(e.Name(), "follower").Inc()
	}
}

var _ prometheus.Collector = stateCollector{}
