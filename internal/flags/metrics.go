package flags

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/space-sandbox/space/internal/metric"
)

// providerMetrics are the file provider's series. An operator alerts on
// space_flags_last_reload_successful == 0: the flags in service are not the file's.
type providerMetrics struct {
	success, failure prometheus.Counter
	lastOK           prometheus.Gauge
	lastOKTime       prometheus.Gauge
}

func newProviderMetrics(reg prometheus.Registerer) providerMetrics {
	reloads := metric.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "space_flags_reloads_total",
		Help: "Reloads of the flags file after a change, by result (success, error). On error the last good flags stay in service.",
	}, []string{"result"}))
	return providerMetrics{
		success: reloads.WithLabelValues("success"),
		failure: reloads.WithLabelValues("error"),
		lastOK: metric.Register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "space_flags_last_reload_successful",
			Help: "1 when the last load of the flags file succeeded, 0 when the flags in service are an older good file.",
		})),
		lastOKTime: metric.Register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "space_flags_last_reload_success_timestamp_seconds",
			Help: "When the flags file was last loaded successfully (Unix seconds).",
		})),
	}
}

// loaded records the initial load, which is not a reload.
func (m providerMetrics) loaded(now time.Time) {
	m.lastOK.Set(1)
	m.lastOKTime.Set(float64(now.UnixNano()) / 1e9)
}

func (m providerMetrics) reloaded(ok bool, now time.Time) {
	if !ok {
		m.failure.Inc()
		m.lastOK.Set(0)
		return
	}
	m.success.Inc()
	m.loaded(now)
}

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
