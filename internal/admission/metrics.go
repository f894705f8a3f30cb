package admission

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/metric"
)

// Decision label values of space_sandbox_admission_rate_decisions_total.
const (
	decisionAdmitted       = "admitted"
	decisionRejected       = "rejected"
	decisionError          = "error"
	decisionShadowRejected = "shadow_rejected"
)

// admissionMetrics are the admission series (docs/operations.md).
//
// space_sandbox_admission_rate_decisions_total{decision, bucket, tier} counts each
// charge (never a peek, never a disabled Admitter) as follows, tier being the charge's
// tier ("" without tiers, bounded by the tier table):
//
//   - admitted: once for bucket="cluster_activation" and, when the client had a rate,
//     once more for bucket="client_activation": one count per token taken, so the
//     cluster_activation series is the number of activations charged.
//   - rejected: once, for the bucket that rejected (client_activation when both were
//     empty), whether Redis refused or the refusal cache did. Nothing was taken.
//   - shadow_rejected: as rejected, for a decision shadow mode then admitted.
//   - error: as admitted (cluster, plus client when the client had a rate), for a
//     call that failed or timed out, in either failure mode.
//
// Client keys are never labels of it.
//
// space_sandbox_admission_script_seconds is the time of each charge's script call as
// the replica saw it (round trip included, failures and timeouts too).
type admissionMetrics struct {
	decisions *prometheus.CounterVec
	script    prometheus.Histogram
	local     *prometheus.CounterVec
	// soft counts soft breaches by budget key and tier; sources where reserved-tier
	// admissions took their cluster token. keys bounds the budget keys soft labels.
	soft, sources *prometheus.CounterVec
	keys          *metric.Keys
	// bound are the decisions' series not bound below (a tiered charge's, a shadow
	// decision's), bound at their first use: a tiered client flooding over its rate is
	// counted once a refusal. Bounded, as the series are, by the tiers ever loaded;
	// neither is ever deleted.
	bound *metric.Bound[seriesKey, prometheus.Counter]

	// The series of an untiered charge, bound once: the hot path of most fleets, and
	// for the refusals, of a client flooding over its rate.
	admittedCluster, admittedClient prometheus.Counter
	errorCluster, errorClient       prometheus.Counter
	rejectedCluster, rejectedClient prometheus.Counter
	localCluster, localClient       prometheus.Counter
}

func newAdmissionMetrics(reg prometheus.Registerer) (*admissionMetrics, error) {
	decisions := metric.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "space_sandbox_admission_rate_decisions_total",
		Help: "Activation admission decisions, by decision, bucket and tier (see internal/admission).",
	}, []string{"decision", "bucket", "tier"}))
	script := metric.Register(reg, prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "space_sandbox_admission_script_seconds",
		Help:    "Time of the admission script call, round trip included.",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2, 12), // 100µs to about 200ms
	}))
	local := metric.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "space_sandbox_admission_local_refusals_total",
		Help: "Rejections answered by the replica from what it last learnt of the bucket, without asking Redis (also counted in space_sandbox_admission_rate_decisions_total), by bucket.",
	}, []string{"bucket"}))
	soft := metric.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "space_sandbox_soft_breaches_total",
		Help: "Activations admitted while their client was over its soft limit, signalled to the substrate (in shadow mode counted, not signalled), by budget key (the first SPACE_METRICS_BUDGET_KEYS keys; the rest summed as _other) and tier.",
	}, []string{"budget_key", "tier"}))
	sources := metric.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "space_sandbox_admission_cluster_tokens_total",
		Help: "Cluster tokens taken while tiers reserve shares of the cluster bucket, by tier and where they came from: reserve (the tier's own), shared (the remainder), borrowed (another tier's idle reserve).",
	}, []string{"tier", "source"}))
	m := &admissionMetrics{decisions: decisions, script: script, local: local, soft: soft, sources: sources,
		bound: metric.NewBound(func(k seriesKey) prometheus.Counter {
			return decisions.WithLabelValues(k.decision, string(k.bucket), k.tier)
		})}
	m.admittedCluster = decisions.WithLabelValues(decisionAdmitted, string(space.BucketClusterActivation), "")
	m.admittedClient = decisions.WithLabelValues(decisionAdmitted, string(space.BucketClientActivation), "")
	m.errorCluster = decisions.WithLabelValues(decisionError, string(space.BucketClusterActivation), "")
	m.errorClient = decisions.WithLabelValues(decisionError, string(space.BucketClientActivation), "")
	m.rejectedCluster = decisions.WithLabelValues(decisionRejected, string(space.BucketClusterActivation), "")
	m.rejectedClient = decisions.WithLabelValues(decisionRejected, string(space.BucketClientActivation), "")
	m.localCluster = local.WithLabelValues(string(space.BucketClusterActivation))
	m.localClient = local.WithLabelValues(string(space.BucketClientActivation))
	// The rejections too, so that every untiered series exists (at 0) from the start;
	// a tier's series appear with its first decision.
	for _, b := range []space.Bucket{space.BucketClusterActivation, space.BucketClientActivation} {
		for _, d := range []string{decisionRejected, decisionShadowRejected} {
			decisions.WithLabelValues(d, string(b), "")
		}
		local.WithLabelValues(string(b))
	}
	return m, nil
}

// admitted counts an admitted charge: one count per bucket charged, the soft breach,
// and where a reserved-tier charge's cluster tokens came from.
func (m *admissionMetrics) admitted(c space.Charge, d Decision) {
	if c.Tier == "" {
		m.admittedCluster.Inc()
		if c.Rate != nil {
			m.admittedClient.Inc()
		}
	} else {
		m.series(decisionAdmitted, space.BucketClusterActivation, c.Tier).Inc()
		if c.Rate != nil {
			m.series(decisionAdmitted, space.BucketClientActivation, c.Tier).Inc()
		}
	}
	if d.SoftBreach {
		m.soft.WithLabelValues(m.keys.Label(string(c.Key)), c.Tier).Inc()
	}
	for _, from := range [...]struct {
		source string
		tokens float64
	}{{"reserve", d.Drawn.Own}, {"shared", d.Drawn.Shared}, {"borrowed", d.Drawn.Borrowed}} {
		if from.tokens > 0 {
			m.sources.WithLabelValues(c.Tier, from.source).Add(from.tokens)
		}
	}
}

func (m *admissionMetrics) errored(c space.Charge) {
	if c.Tier == "" {
		m.errorCluster.Inc()
		if c.Rate != nil {
			m.errorClient.Inc()
		}
		return
	}
	m.series(decisionError, space.BucketClusterActivation, c.Tier).Inc()
	if c.Rate != nil {
		m.series(decisionError, space.BucketClientActivation, c.Tier).Inc()
	}
}

func (m *admissionMetrics) count(decision string, bucket space.Bucket, tier string) {
	if decision == decisionRejected && tier == "" {
		switch bucket {
		case space.BucketClusterActivation:
			m.rejectedCluster.Inc()
			return
		case space.BucketClientActivation:
			m.rejectedClient.Inc()
			return
		}
	}
	m.series(decision, bucket, tier).Inc()
}

// seriesKey names one series of the decisions.
type seriesKey struct {
	decision string
	bucket   space.Bucket
	tier     string
}

// series is the decisions' series of decision, bucket and tier, bound once (bound).
func (m *admissionMetrics) series(decision string, bucket space.Bucket, tier string) prometheus.Counter {
	return m.bound.Of(seriesKey{decision, bucket, tier})
}

// refusedLocally counts a refusal answered from memory (CachedRefusal), besides its
// decision.
func (m *admissionMetrics) refusedLocally(bucket space.Bucket) {
	switch bucket {
	case space.BucketClusterActivation:
		m.localCluster.Inc()
	case space.BucketClientActivation:
		m.localClient.Inc()
	default:
		m.local.WithLabelValues(string(bucket)).Inc()
	}
}
