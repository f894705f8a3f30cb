package dispatcher

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/metric"
)

var (
	depthDesc = prometheus.NewDesc("space_dispatcher_queue_depth",
		"Operations not yet final, by kind, state (queued: waiting for a worker, parked behind their owner's lanes, snoozed by a limit or backing off after a failed attempt; running), "+
			"and the budget key (the SPACE_METRICS_BUDGET_KEYS largest backlogs; the rest summed as _other) and tier they were accepted under; read from Postgres at scrape time (the same on every replica: aggregate with max).",
		[]string{"kind", "state", "budget_key", "tier"}, nil)
	oldestDesc = prometheus.NewDesc("space_dispatcher_oldest_queued_seconds",
		"Age of the oldest queued operation since it was accepted, by kind, budget key and tier; 0 when none is queued. Read at scrape time (aggregate with max).",
		[]string{"kind", "budget_key", "tier"}, nil)
)

// backlog reads the queue's depth and its oldest waiting operation at scrape time, so
// that every replica reports the queue as it is in Postgres (the queue is shared: a
// replica's own view would be only its share of the work). Every kind and state is
// reported, at 0 when there is none, so an alert over them never reads nothing.
type backlog struct {
	db *pgxpool.Pool
	// keys is how many budget keys keep labels of their own: those with the largest
	// backlogs now; the rest are summed under metric.OtherKeys.
	keys int
}

func (b *backlog) Describe(ch chan<- *prometheus.Desc) {
	ch <- depthDesc
	ch <- oldestDesc
}

func (b *backlog) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	read, err := b.read(ctx)
	if err != nil {
		// The rest of /metrics is still served (the handler continues on error) and
		// the failure is counted in promhttp_metric_handler_errors_total.
		ch <- prometheus.NewInvalidMetric(depthDesc, err)
		return
	}
	groups := b.bounded(read)
	// Every kind and state of the untiered unknown key is reported, at 0 when there is
	// none, so that an alert over them never reads nothing; the others as they occur.
	for _, k := range space.OperationKinds {
		g := group{string(k), string(space.Unknown), ""}
		if _, ok := groups[g]; !ok {
			groups[g] = &counts{}
		}
	}
	for g, c := range groups {
		ch <- prometheus.MustNewConstMetric(depthDesc, prometheus.GaugeValue, c.queued, g.kind, string(space.OperationQueued), g.key, g.tier)
		ch <- prometheus.MustNewConstMetric(depthDesc, prometheus.GaugeValue, c.running, g.kind, string(space.OperationRunning), g.key, g.tier)
		ch <- prometheus.MustNewConstMetric(oldestDesc, prometheus.GaugeValue, c.oldest, g.kind, g.key, g.tier)
	}
}

// bounded folds the groups of every budget key past the b.keys largest backlogs into
// metric.OtherKeys, per kind and tier: the series do not grow with tenants.
func (b *backlog) bounded(groups map[group]*counts) map[group]*counts {
	size := map[string]float64{}
	for g, c := range groups {
		size[g.key] += c.queued + c.running
	}
	if len(size) <= b.keys {
		return groups
	}
	label := metric.Top(size, b.keys)
	out := make(map[group]*counts, len(groups))
	for g, c := range groups {
		g.key = label[g.key]
		into, ok := out[g]
		if !ok {
			into = &counts{}
			out[g] = into
		}
		into.queued += c.queued
		into.running += c.running
		into.oldest = max(into.oldest, c.oldest)
	}
	return out
}

// group is one set of labels of the queue's series.
type group struct{ kind, key, tier string }

type counts struct{ queued, running, oldest float64 }

func (b *backlog) read(ctx context.Context) (map[group]*counts, error) {
	rows, err := b.db.Query(ctx, `SELECT kind, state, budget_key, tier, count(*)::float8,
			coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8
		FROM operations WHERE state IN ('queued', 'running') GROUP BY kind, state, budget_key, tier`)
	if err != nil {
		return nil, fmt.Errorf("read the queue: %w", err)
	}
	defer rows.Close()
	out := map[group]*counts{}
	for rows.Next() {
		var g group
		var state string
		var n, age float64
		if err := rows.Scan(&g.kind, &state, &g.key, &g.tier, &n, &age); err != nil {
			return nil, fmt.Errorf("read the queue: %w", err)
		}
		c, ok := out[g]
		if !ok {
			c = &counts{}
			out[g] = c
		}
		if state == string(space.OperationQueued) {
			c.queued, c.oldest = n, age
		} else {
			c.running = n
		}
	}
	return out, rows.Err()
}
