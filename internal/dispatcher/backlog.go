package dispatcher

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/space-sandbox/space"
)

var (
	depthDesc = prometheus.NewDesc("space_dispatcher_queue_depth",
		"Operations not yet final, by kind and state (queued: waiting for a worker, snoozed by a limit or backing off after a failed attempt; running), "+
			"read from Postgres at scrape time (the same on every replica: aggregate with max).",
		[]string{"kind", "state"}, nil)
	oldestDesc = prometheus.NewDesc("space_dispatcher_oldest_queued_seconds",
		"Age of the oldest queued operation since it was accepted, by kind; 0 when none is queued. Read at scrape time (aggregate with max).",
		[]string{"kind"}, nil)
)

// backlog reads the queue's depth and its oldest waiting operation at scrape time, so
// that every replica reports the queue as it is in Postgres (the queue is shared: a
// replica's own view would be only its share of the work). Every kind and state is
// reported, at 0 when there is none, so an alert over them never reads nothing.
type backlog struct {
	db *pgxpool.Pool
}

func (b *backlog) Describe(ch chan<- *prometheus.Desc) {
	ch <- depthDesc
	ch <- oldestDesc
}

func (b *backlog) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	depth, oldest, err := b.read(ctx)
	if err != nil {
		// The rest of /metrics is still served (the handler continues on error) and
		// the failure is counted in promhttp_metric_handler_errors_total.
		ch <- prometheus.NewInvalidMetric(depthDesc, err)
		return
	}
	for _, k := range space.OperationKinds {
		for _, s := range []space.OperationState{space.OperationQueued, space.OperationRunning} {
			ch <- prometheus.MustNewConstMetric(depthDesc, prometheus.GaugeValue, depth[string(k)+"/"+string(s)], string(k), string(s))
		}
		ch <- prometheus.MustNewConstMetric(oldestDesc, prometheus.GaugeValue, oldest[string(k)], string(k))
	}
}

func (b *backlog) read(ctx context.Context) (depth, oldest map[string]float64, err error) {
	rows, err := b.db.Query(ctx, `SELECT kind, state, count(*)::float8,
			coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8
		FROM operations WHERE state IN ('queued', 'running') GROUP BY kind, state`)
	if err != nil {
		return nil, nil, fmt.Errorf("read the queue: %w", err)
	}
	defer rows.Close()
	depth, oldest = map[string]float64{}, map[string]float64{}
	for rows.Next() {
		var kind, state string
		var n, age float64
		if err := rows.Scan(&kind, &state, &n, &age); err != nil {
			return nil, nil, fmt.Errorf("read the queue: %w", err)
		}
		depth[kind+"/"+state] = n
		if state == string(space.OperationQueued) {
			oldest[kind] = age
		}
	}
	return depth, oldest, rows.Err()
}
