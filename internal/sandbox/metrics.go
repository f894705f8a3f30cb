package sandbox

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/metric"
)

// Activation kinds and outcomes, the labels of the activation series. Every pair is
// exported from the start at zero, so that a rate() or an alert over a pair that has
// not happened yet reads 0 rather than nothing.
var (
	activationKinds    = []string{"create", "restore"}
	activationOutcomes = []string{"warm", "cold", "failed", "rejected", "unprocessable"}
)

// activationBuckets span what an activation takes: a refusal from memory or a warm hit
// (a millisecond or less) to a cold start on a busy cluster (minutes, bounded by the
// substrate's timeout).
var activationBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}

// coldStartBuckets span a substrate's cold start: an image cached on the node
// (sub-second) to a large image pulled onto a new node (minutes).
var coldStartBuckets = []float64{.05, .1, .25, .5, 1, 2, 5, 10, 20, 30, 60, 120, 300}

// Activation steps (space_sandbox_activation_step_seconds), the waits of an
// activation on other processes in the order it takes them: its concurrency place
// (Redis; creates only, a restore's is taken before the service is called), its
// booking (Postgres, with the live-cap count when one is made), its charge (Redis),
// its start (the substrate: an adoption or a cold start) and its finish (Postgres).
// Each step is observed once it ends, whatever its outcome, in the activations that
// reach it. They say where an activation's time went when space_sandbox_activation_seconds
// rises: a slow Postgres shows in book and finish, a busy Redis in place and charge.
const (
	stepPlace  = "place"
	stepBook   = "book"
	stepCharge = "charge"
	stepStart  = "start"
	stepFinish = "finish"
)

var activationSteps = []string{stepPlace, stepBook, stepCharge, stepStart, stepFinish}

// stepBuckets span a step: a round trip to Redis or Postgres on a quiet network (a
// tenth of a millisecond) to a cold start on a busy cluster (minutes). Finer than
// activationBuckets below a millisecond, where the round trips are.
var stepBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .1, .5, 2.5, 10, 60, 300}

// Why an unanswered create was ended (space_sandbox_unanswered_total): its caller
// went away before the sandbox was ready, it was never answered and has no key to be
// retried under (settled by the reconciler), or its key expired unclaimed.
const (
	unansweredCallerGone = "caller_gone"
	unansweredNoKey      = "not_answered"
	unansweredKeyExpired = "key_expired"
)

type metrics struct {
	activations *prometheus.CounterVec
	latency     *prometheus.HistogramVec
	coldStart   *prometheus.HistogramVec
	unanswered  *prometheus.CounterVec
	stepVec     *prometheus.HistogramVec
	// steps holds the step series of every kind, looked up once.
	steps map[[2]string]prometheus.Observer
	// bound holds the series of every kind and outcome, looked up once: a refusal from
	// memory is counted tens of thousands of times a second under a flood.
	bound map[[2]string]activationSeries
}

type activationSeries struct {
	count   prometheus.Counter
	latency prometheus.Observer
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		activations: metric.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "space_sandbox_activations_total",
			Help: "Sandbox activations by kind (create, restore) and outcome (warm, cold, failed, rejected, unprocessable).",
		}, []string{"kind", "outcome"})),
		latency: metric.Register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "space_sandbox_activation_seconds",
			Help: "How long an activation took in space-api, by kind and outcome (as space_sandbox_activations_total): " +
				"from the refusal or the booking to the sandbox running, or refused, or failed.",
			Buckets: activationBuckets,
		}, []string{"kind", "outcome"})),
		coldStart: metric.Register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "space_sandbox_cold_start_seconds",
			Help:    "How long the substrate took to start (create) or restore (restore) a sandbox without a warm slot, for the starts that succeeded.",
			Buckets: coldStartBuckets,
		}, []string{"kind"})),
		unanswered: metric.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "space_sandbox_unanswered_total",
			Help: "Synchronous creates no client was ever answered for, ended failed with what ran for them stopped, by reason " +
				"(caller_gone: the caller left before the sandbox was ready; not_answered: settled by the reconciler, no key; key_expired: its Idempotency-Key expired unclaimed).",
		}, []string{"reason"})),
		stepVec: metric.Register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "space_sandbox_activation_step_seconds",
			Help: "How long each step of an activation waited, by kind (create, restore) and step: place (the concurrency place, creates only), " +
				"book (the booking in Postgres), charge (the activation buckets in Redis), start (the substrate), finish (the running state in Postgres).",
			Buckets: stepBuckets,
		}, []string{"kind", "step"})),
	}
	m.steps = map[[2]string]prometheus.Observer{}
	for _, k := range activationKinds {
		for _, st := range activationSteps {
			if st == stepPlace && k != "create" {
				continue // a restore's place is not the service's to take
			}
			m.steps[[2]string{k, st}] = m.stepVec.WithLabelValues(k, st)
		}
	}
	for _, r := range []string{unansweredCallerGone, unansweredNoKey, unansweredKeyExpired} {
		m.unanswered.WithLabelValues(r)
	}
	m.bound = map[[2]string]activationSeries{}
	for _, k := range activationKinds {
		for _, o := range activationOutcomes {
			m.bound[[2]string{k, o}] = activationSeries{count: m.activations.WithLabelValues(k, o), latency: m.latency.WithLabelValues(k, o)}
		}
		m.coldStart.WithLabelValues(k)
	}
	return m
}

// activation records one activation of kind that ended with outcome after took.
func (m *metrics) activation(kind, outcome string, took time.Duration) {
	s, ok := m.bound[[2]string{kind, outcome}]
	if !ok {
		s = activationSeries{count: m.activations.WithLabelValues(kind, outcome), latency: m.latency.WithLabelValues(kind, outcome)}
	}
	s.count.Inc()
	s.latency.Observe(took.Seconds())
}

// step records one step of an activation of kind that took took.
func (m *metrics) step(kind, step string, took time.Duration) {
	o, ok := m.steps[[2]string{kind, step}]
	if !ok {
		o = m.stepVec.WithLabelValues(kind, step)
	}
	o.Observe(took.Seconds())
}

// refused records an activation that err refused, if err is a refusal (a limit, or a
// shape no cold start serves); other errors are not activations.
func (m *metrics) refused(kind string, err error, took time.Duration) {
	switch space.ErrorCode(err) {
	case space.ELIMITED:
		m.activation(kind, "rejected", took)
	case space.EUNPROCESSABLE:
		m.activation(kind, "unprocessable", took)
	}
}
