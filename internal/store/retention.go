package store

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/space-sandbox/space/internal/metric"
)

// retentionBatch is how many rows one delete of a purge takes, and retentionBatches
// how many deletes one call runs at most: small, so that each holds its locks
// briefly, and a backlog (a year of history on a first upgrade) drains over rounds
// without any one of them taking long.
const (
	retentionBatch   = 1000
	retentionBatches = 10
)

// Retained is one table's retention: its rows past their age, as a query that selects
// their ctid oldest first ($1 the age in seconds, $2 the batch), through the partial
// index that holds them alone (migrations/00015).
type Retained struct {
	// Table names the table in space_retention_deleted_total.
	Table string
	// Age is how long a row is kept once its clock has started; 0 keeps it for ever.
	Age time.Duration
	// Due selects the ctids of the rows past Age, at most $2.
	Due string
}

// Purger deletes what retention no longer keeps, a few small batches a call (Purge).
type Purger struct {
	db      *DB
	tables  []Retained
	deleted *prometheus.CounterVec
}

// NewPurger returns a Purger of tables on db, counted on reg.
func NewPurger(db *DB, reg prometheus.Registerer, tables ...Retained) *Purger {
	p := &Purger{db: db, tables: tables}
	p.deleted = metric.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "space_retention_deleted_total",
		Help: "Rows deleted because retention keeps them no longer (SPACE_RETENTION_*), by table: ended sandboxes, finished operations.",
	}, []string{"table"}))
	for _, t := range tables {
		p.deleted.WithLabelValues(t.Table)
	}
	return p
}

// Purge deletes, table by table, the rows past their retention, up to
// retentionBatches batches each, and returns how many it deleted. It runs on one
// replica at a time (the reconciler's round).
func (p *Purger) Purge(ctx context.Context) (int, error) {
	total := 0
	for _, t := range p.tables {
		if t.Age <= 0 {
			continue
		}
		for range retentionBatches {
			tag, err := p.db.Exec(ctx, `DELETE FROM `+t.Table+` WHERE ctid = ANY (ARRAY(`+t.Due+`))`, t.Age.Seconds(), retentionBatch)
			if err != nil {
				return total, fmt.Errorf("retention of %s: %w", t.Table, err)
			}
			n := int(tag.RowsAffected())
			total += n
			p.deleted.WithLabelValues(t.Table).Add(float64(n))
			if n < retentionBatch {
				break
			}
		}
	}
	return total, nil
}
