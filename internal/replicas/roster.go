// Package replicas keeps the roster of live space-api replicas in Postgres (the
// replicas table): each replica writes its row at start and at every heartbeat, and
// counts the rows seen lately. The count is how many replicas share the buckets:
// while Redis cannot decide and admission fails open, each replica spends a share of
// the cluster bucket that size (admission.Options.Replicas), so that a fleet in a
// Redis outage admits about the cluster's budget between its replicas, not once per
// replica.
//
// The roster lives in Postgres, not Redis, because it is needed exactly when Redis
// is gone: a replica that starts during a Redis outage still learns how many others
// there are.
package replicas

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/space-sandbox/space/internal/metric"
	"github.com/space-sandbox/space/internal/store"
)

// DefaultInterval is how often a replica writes its row when Options.Interval is 0.
const DefaultInterval = 5 * time.Second

// Options configure a Roster.
type Options struct {
	// DB is where the replicas table is (required): the pool, or a transaction in
	// tests.
	DB store.Querier
	// ID names this replica's row; default the host name and a random suffix, so that
	// two processes on one host, or a restarted pod, are two rows.
	ID string
	// Interval is how often the replica writes its row (DefaultInterval, 5s).
	Interval time.Duration
	// TTL is how long a row counts after it was last written: three intervals by
	// default, so that one late heartbeat does not drop a live replica from every
	// other replica's count. Rows older than it are deleted.
	TTL        time.Duration
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// Roster is this replica's row in the replicas table and its count of the live ones.
// It is safe for concurrent use.
type Roster struct {
	db       store.Querier
	id       string
	interval time.Duration
	ttl      time.Duration
	logger   *slog.Logger
	gauge    prometheus.Gauge

	count  atomic.Int64
	failed atomic.Bool // the last heartbeat failed (logged once until one succeeds)
}

// New returns the Roster of opts; nothing is written until Beat or Run.
func New(opts Options) (*Roster, error) {
	if opts.DB == nil {
		return nil, errors.New("replicas: DB is required")
	}
	if opts.Interval < 0 || opts.TTL < 0 {
		return nil, fmt.Errorf("replicas: interval %v and TTL %v must not be negative", opts.Interval, opts.TTL)
	}
	r := &Roster{db: opts.DB, id: opts.ID, interval: opts.Interval, ttl: opts.TTL, logger: opts.Logger}
	if r.id == "" {
		r.id = defaultID()
	}
	if r.interval == 0 {
		r.interval = DefaultInterval
	}
	if r.ttl == 0 {
		r.ttl = 3 * r.interval
	}
	if r.ttl < r.interval {
		return nil, fmt.Errorf("replicas: TTL %v is shorter than the interval %v: live replicas would drop out between heartbeats", r.ttl, r.interval)
	}
	if r.logger == nil {
		r.logger = slog.New(slog.DiscardHandler)
	}
	r.gauge = metric.Register(opts.Registerer, prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "space_replicas",
		Help: "Live replicas this replica counted at its last heartbeat, itself included: how many share the cluster bucket while admission fails open.",
	}))
	r.count.Store(1)
	r.gauge.Set(1)
	return r, nil
}

// defaultID is the host name (a pod's name) and 6 random hex digits.
func defaultID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "space-api"
	}
	var b [3]byte
	_, _ = rand.Read(b[:])
	return host + "-" + hex.EncodeToString(b[:])
}

// ID is this replica's row.
func (r *Roster) ID() string { return r.id }

// Count is how many replicas the last heartbeat that succeeded counted, this one
// included: 1 before any. A heartbeat that fails keeps the count it had, the best
// guess while Postgres cannot be asked.
func (r *Roster) Count() int { return int(r.count.Load()) }

// Beat writes this replica's row, deletes the rows not seen within the TTL, and
// counts the live ones (this replica and the others seen within the TTL), all in one
// statement on Postgres's clock, so that replicas whose clocks disagree still agree on
// who is live. It returns the count, which Count reports from then on.
func (r *Roster) Beat(ctx context.Context) (int, error) {
	var n int64
	// The main query reads the table as it was before the statement's own writes: it
	// counts the others seen within the TTL, and adds this one.
	err := r.db.QueryRow(ctx, `
		WITH beat AS (
			INSERT INTO replicas (id) VALUES ($1)
			ON CONFLICT (id) DO UPDATE SET seen_at = now()
		), gone AS (
			DELETE FROM replicas WHERE seen_at < now() - make_interval(secs => $2) AND id <> $1
		)
		SELECT 1 + count(*) FROM replicas WHERE id <> $1 AND seen_at >= now() - make_interval(secs => $2)`,
		r.id, r.ttl.Seconds()).Scan(&n)
	if err != nil {
		if ctx.Err() == nil && !r.failed.Swap(true) {
			r.logger.WarnContext(ctx, "replica heartbeat failed; keeping the last count", "replicas", r.Count(), "err", err)
		}
		return r.Count(), fmt.Errorf("replica heartbeat: %w", err)
	}
	if r.failed.Swap(false) {
		r.logger.InfoContext(ctx, "replica heartbeat recovered", "replicas", n)
	}
	if old := r.count.Swap(n); old != n {
		r.logger.InfoContext(ctx, "replicas counted", "replicas", n, "was", old)
	}
	r.gauge.Set(float64(n))
	return int(n), nil
}

// Leave deletes this replica's row, so that the others count one fewer at their next
// heartbeat instead of after the TTL.
func (r *Roster) Leave(ctx context.Context) error {
	if _, err := r.db.Exec(ctx, `DELETE FROM replicas WHERE id = $1`, r.id); err != nil {
		return fmt.Errorf("replica leave: %w", err)
	}
	return nil
}

// Run beats every Interval until ctx ends, then leaves (within 2s). onBeat, when not
// nil, is told each heartbeat's count and error: tests wait on it instead of sleeping.
// The caller beats once before Run, so that the count is known before the replica
// serves.
func (r *Roster) Run(ctx context.Context, onBeat func(int, error)) {
	t := time.NewTicker(r.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			leave, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			defer cancel()
			if err := r.Leave(leave); err != nil {
				r.logger.Warn("replica could not leave the roster; the others count it until its TTL", "ttl", r.ttl, "err", err)
			}
			return
		case <-t.C:
		}
		n, err := r.Beat(ctx)
		if onBeat != nil {
			onBeat(n, err)
		}
	}
}
