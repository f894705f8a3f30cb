package dispatcher

import (
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/space-sandbox/space"
)

// metrics are the dispatcher's series. None has a client label: per-client detail is
// on the operations themselves.
type metrics struct {
	enqueued *prometheus.CounterVec   // {kind}
	finished *prometheus.CounterVec   // {kind, state}
	snoozes  *prometheus.CounterVec   // {kind, bucket}
	settles  *prometheus.CounterVec   // {kind}
	lost     *prometheus.CounterVec   // {kind}
	retries  *prometheus.CounterVec   // {kind, code}
	queue    *prometheus.HistogramVec // {kind}
	unparked prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, db *pgxpool.Pool, budgetKeys int) (*metrics, error) {
	m := &metrics{
		enqueued: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "space_dispatcher_enqueued_total",
			Help: "Operations accepted into the queue, by kind (a repeated Idempotency-Key is not counted again).",
		}, []string{"kind"}),
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "space_dispatcher_operations_total",
			Help: "Operations that reached a final state, by kind and state (succeeded, failed).",
		}, []string{"kind", "state"}),
		snoozes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "space_dispatcher_snoozes_total",
			Help: "Operations turned away by a limit and put back in the queue without spending an attempt, by kind and the bucket that turned them away.",
		}, []string{"kind", "bucket"}),
		settles: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "space_dispatcher_settle_waits_total",
			Help: "Runs that found their sandbox still starting from an attempt that died with its replica and waited for the reconciler, spending no attempt, by kind.",
		}, []string{"kind"}),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "space_dispatcher_lost_operations_total",
			Help: "Operations failed by the reconciler because their job ended without recording an outcome (rescued from dead replicas until out of attempts), by kind.",
		}, []string{"kind"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "space_dispatcher_attempt_errors_total",
			Help: "Attempts that failed and spent a retry (or ended the operation), by kind and error code.",
		}, []string{"kind", "code"}),
		unparked: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "space_dispatcher_unparked_total",
			Help: "Operations moved from waiting parked into one of their owner's lanes of the queue, where they may run.",
		}),
		queue: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "space_dispatcher_queue_seconds",
			Help:    "Time from an operation's acceptance to the start of its first run, by kind.",
			Buckets: prometheus.ExponentialBuckets(0.01, 3, 12), // 10ms to about 30m
		}, []string{"kind"}),
	}
	// Pre-create the series a dashboard or an alert reads, so that a rate over them
	// exists from the start rather than from the first event.
	for _, k := range space.OperationKinds {
		m.enqueued.WithLabelValues(string(k))
		m.settles.WithLabelValues(string(k))
		m.lost.WithLabelValues(string(k))
		m.queue.WithLabelValues(string(k))
		// The codes that spend an attempt and are retried; the permanent ones end the
		// operation at once and are counted when they happen.
		for _, code := range []string{space.EUNAVAILABLE, space.EINTERNAL} {
			m.retries.WithLabelValues(string(k), code)
		}
		for _, s := range []space.OperationState{space.OperationSucceeded, space.OperationFailed} {
			m.finished.WithLabelValues(string(k), string(s))
		}
		for _, b := range []space.Bucket{space.BucketClientActivation, space.BucketClusterActivation, space.BucketLiveSandboxCap} {
			m.snoozes.WithLabelValues(string(k), string(b))
		}
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.enqueued, m.finished, m.snoozes, m.settles, m.lost, m.retries, m.queue, m.unparked, &backlog{db: db, keys: budgetKeys}} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register dispatcher metrics (one Dispatcher per registry): %w", err)
		}
	}
	return m, nil
}
