package termconn

import (
	"errors"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are process-wide, registered with each config's registry (see Register).
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

// Register adds the collectors to a config's registry; a registry that has them already is fine.
func Register(reg *prometheus.Registry) error {
	if reg == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{metrics.open, metrics.cut} {
		if err := reg.Register(c); err != nil && !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
			return err
		}
	}
	return nil
}

func termLabel(token int64) string { return strconv.FormatInt(token, 10) }
