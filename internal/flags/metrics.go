package flags

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/space-sandbox/space/internal/metric"
)

// resolverMetrics count the requests that did not get what the flag says, because the
// flag (or one of its entries) could not be used.
type resolverMetrics struct {
	evalError, malformed prometheus.Counter
	rateFallback         *prometheus.CounterVec
}

func newResolverMetrics(reg prometheus.Registerer) resolverMetrics {
	fallbacks := metric.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "space_flags_quota_fallbacks_total",
		Help: "Quota flag evaluations answered from the last good value, by reason (evaluation_error: the provider failed; malformed: the provider's value is not a valid quota flag).",
	}, []string{"reason"}))
	return resolverMetrics{
		evalError: fallbacks.WithLabelValues("evaluation_error"),
		malformed: fallbacks.WithLabelValues("malformed"),
		rateFallback: metric.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "space_flags_rate_entry_fallbacks_total",
			Help: "Requests whose client key stayed on the env client rate because its entry in the quota flag's rate object is malformed. The client label is a bounded key (allowlisted or unknown).",
		}, []string{"client"})),
	}
}
