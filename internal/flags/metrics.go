package flags

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/metric"
)

// resolverMetrics count the requests that did not get what the flag says, because the
// flag (or one of its entries) could not be used.
type resolverMetrics struct {
	evalError, malformed prometheus.Counter
	rateFallback         *prometheus.CounterVec
	tierFallback         *prometheus.CounterVec
}

func newResolverMetrics(reg prometheus.Registerer) resolverMetrics {
	fallbacks := metric.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "space_flags_quota_fallbacks_total",
		Help: "Quota flag evaluations answered from the last good value, by reason (evaluation_error: the provider failed; malformed: the provider's value is not a valid quota flag).",
	}, []string{"reason"}))
	tiers := metric.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "space_tier_fallback_total",
		Help: "Resolutions that put a client on the floor tier (SPACE_FALLBACK_TIER) because its tier could not be resolved, by reason: unknown_tier (a name the tier table lacks), evaluation_error, provider_not_ready.",
	}, []string{"reason"}))
	for _, reason := range []string{space.FallbackUnknownTier, space.FallbackEvaluationError, space.FallbackProviderNotReady} {
		tiers.WithLabelValues(reason)
	}
	return resolverMetrics{
		tierFallback: tiers,
		evalError:    fallbacks.WithLabelValues("evaluation_error"),
		malformed:    fallbacks.WithLabelValues("malformed"),
		rateFallback: metric.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "space_flags_rate_entry_fallbacks_total",
			Help: "Requests whose client key stayed on the env client rate because its entry in the quota flag's rate object is malformed. The client label is a bounded key (allowlisted or unknown).",
		}, []string{"client"})),
	}
}
