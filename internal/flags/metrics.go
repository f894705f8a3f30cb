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

// reservedDesc is the reserved rate of each tier of the table in force, so that an
// alert can compare what a tier was served with what it was promised.
var reservedDesc = prometheus.NewDesc("space_tier_reserved_rps",
	"The reserved share of the cluster activation rate of each tier that has one, in the tier table in force (the same on every replica with the same flags).",
	[]string{"tier"}, nil)

// reservedCollector reads the reserves of the tier table in force at scrape time.
type reservedCollector struct{ r *Resolver }

func (c reservedCollector) Describe(ch chan<- *prometheus.Desc) { ch <- reservedDesc }

func (c reservedCollector) Collect(ch chan<- prometheus.Metric) {
	res := c.r.Reservations()
	if res == nil {
		return
	}
	for _, t := range res.Reserves {
		ch <- prometheus.MustNewConstMetric(reservedDesc, prometheus.GaugeValue, t.Rate.RefillRPS, t.Tier)
	}
}
