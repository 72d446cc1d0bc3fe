package termconn

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are process-wide, registered with each config's registry (see Collectors).
var metrics = struct {
	open *prometheus.GaugeVec
	cut  *prometheus.CounterVec
}{
	open: prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "caddy", Subsystem: "leader", Name: "connections_open",
		Help: "Connections admitted under a term of this instance (by fencing token) that are still open, by kind (layer4, http).",
	}, []string{"election", "kind", "token"}),
	cut: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "leader", Name: "connections_cut_total",
		Help: "Connections closed because the term that admitted them stopped admitting, by kind and reason (handover, released, deadline, ended, shut down).",
	}, []string{"election", "kind", "reason"}),
}

// Collectors are the package's metrics, which the leader app registers with each config's
// registry.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{metrics.open, metrics.cut}
}

func termLabel(token int64) string { return strconv.FormatInt(token, 10) }
