package dispatcher

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/store"
)

// Lanes make the one River queue fair between owners (client ids, not budget keys:
// every caller off the allowlist shares the bucket of "unknown" but has lanes of its
// own). An owner has as many lanes as its weight (Caller.QueueWeight: 1, or its tier's
// queue_weight). An operation accepted while its owner has a free lane gets a job River
// may run at once; any other waits parked, its job scheduled far ahead, until one of
// the owner's operations ends and the oldest parked one moves into the lane (River's
// JobRetryTx, in the transaction that records the end).
//
// So the queue holds at most an owner's lanes of runnable operations whatever its
// backlog, and River, which runs available jobs oldest first, serves the owners in
// turn, each in proportion to its weight: one owner with a thousand queued creates and
// another with one are each one turn away. A lane whose operation a bucket turned away
// snoozes until the bucket refills, and the owner's parked operations wait without a
// fetch, a run or a job update of their own.
//
// River alone does not give this. Its order is priority, then scheduled time, then
// id, per queue: priorities are four and global, queues are configured per process,
// and unique jobs bound duplicates, not an owner's share. A job may change only its
// own schedule (a snooze), so what must be decided across one owner's jobs (which of
// them may run) is decided here, on the operations table under the owner's lock, and
// River still fetches, runs, times out, retries and rescues every job.

// parkedFor is how far ahead a parked operation's job is scheduled: for ever, as far as
// River is concerned, until a lane frees up and moves it in.
const parkedFor = 100 * 365 * 24 * time.Hour

// lanes is how many of owner's operations may be runnable at once: its queue weight
// times Options.OwnerLanes.
func (d *Dispatcher) lanes(owner space.Caller) int {
	return max(owner.QueueWeight, 1) * d.opts.OwnerLanes
}

// lockOwner takes the advisory lock of owner's lanes for the rest of tx, so that the
// count of its operations in a lane and the move of one into a lane are atomic across
// replicas.
func lockOwner(ctx context.Context, tx pgx.Tx, owner space.ClientID) error {
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtextextended('space:lanes:' || $1, 0))", string(owner)); err != nil {
		return fmt.Errorf("lock the lanes of %s: %w", owner, err)
	}
	return nil
}

// inLane counts owner's operations in a lane: queued or running, not parked.
func inLane(ctx context.Context, q store.Querier, owner space.ClientID) (int, error) {
	var n int
	if err := q.QueryRow(ctx, "SELECT count(*) FROM operations WHERE client = $1 AND NOT parked AND state IN ('queued', 'running')",
		string(owner)).Scan(&n); err != nil {
		return 0, fmt.Errorf("count the operations in the lanes of %s: %w", owner, err)
	}
	return n, nil
}

// unpark moves owner's oldest parked operations into its free lanes, lanes in all,
// within tx, under the owner's lock, and makes their jobs available. It returns how
// many it moved.
func (d *Dispatcher) unpark(ctx context.Context, tx pgx.Tx, owner space.ClientID, lanes int) (int, error) {
	if err := lockOwner(ctx, tx, owner); err != nil {
		return 0, err
	}
	busy, err := inLane(ctx, tx, owner)
	if err != nil || busy >= lanes {
		return 0, err
	}
	rows, err := tx.Query(ctx, `UPDATE operations SET parked = false, updated_at = now()
		WHERE id IN (SELECT id FROM operations WHERE client = $1 AND parked AND state = 'queued'
			ORDER BY created_at, id LIMIT $2)
		RETURNING job_id`, string(owner), lanes-busy)
	if err != nil {
		return 0, fmt.Errorf("move operations of %s into a lane: %w", owner, err)
	}
	jobs, err := pgx.CollectRows(rows, pgx.RowTo[*int64])
	if err != nil {
		return 0, fmt.Errorf("move operations of %s into a lane: %w", owner, err)
	}
	for _, id := range jobs {
		if id == nil {
			continue // no job (cannot happen: one transaction inserts both); the reconciler fails it
		}
		if _, err := d.client.JobRetryTx(ctx, tx, *id); err != nil {
			return 0, fmt.Errorf("make job %d of %s available: %w", *id, owner, err)
		}
	}
	d.metrics.unparked.Add(float64(len(jobs)))
	return len(jobs), nil
}

// freeLane is unpark in a transaction of its own, after an operation of owner ended
// outside one. A failure is the reconciler's to repair (fillLanes); it is logged.
func (d *Dispatcher) freeLane(ctx context.Context, owner space.ClientID) {
	lanes := d.lanes(d.opts.Callers.Resolve(ctx, owner))
	err := d.db.Tx(ctx, func(tx pgx.Tx) error {
		_, err := d.unpark(ctx, tx, owner, lanes)
		return err
	})
	if err != nil {
		d.logger.WarnContext(ctx, "move an operation into its owner's free lane; the reconciler will", "client", string(owner), "err", err)
	}
}

// fillLanes moves parked operations into the free lanes of every owner that has both:
// what an end recorded without a move (a failed write, an operation failed by the
// reconciler) leaves behind. The reconciler runs it each round, so a parked operation
// never waits on a lane that nothing will free.
func (d *Dispatcher) fillLanes(ctx context.Context) (int, error) {
	rows, err := d.db.Query(ctx, `SELECT DISTINCT client FROM operations WHERE parked AND state = 'queued'`)
	if err != nil {
		return 0, fmt.Errorf("find owners of parked operations: %w", err)
	}
	owners, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, fmt.Errorf("find owners of parked operations: %w", err)
	}
	moved := 0
	for _, owner := range owners {
		lanes := d.lanes(d.opts.Callers.Resolve(ctx, space.ClientID(owner)))
		err := d.db.Tx(ctx, func(tx pgx.Tx) error {
			n, err := d.unpark(ctx, tx, space.ClientID(owner), lanes)
			moved += n
			return err
		})
		if err != nil {
			return moved, err
		}
	}
	return moved, nil
}

// Tidy settles what the lanes leave to the reconciler, each round: a parked operation
// whose admission deadline has passed fails as admission_timeout at once (it was never
// admitted, and waiting for a lane would only make it fail later), and every owner's
// free lanes are filled. It returns how many operations it failed or moved.
func (d *Dispatcher) Tidy(ctx context.Context) (int, error) {
	expired := 0
	err := d.db.Tx(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `UPDATE operations SET state = 'failed', error_code = $1, finished_at = now(), updated_at = now(),
				last_error = 'not admitted within the admission deadline: it waited behind its owner''s own queued operations until ' ||
					to_char(admission_deadline AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
			WHERE parked AND state = 'queued' AND admission_deadline <= now()
			RETURNING kind, job_id`, space.CodeAdmissionTimeout)
		if err != nil {
			return fmt.Errorf("expire parked operations: %w", err)
		}
		type ended struct {
			kind string
			job  *int64
		}
		list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ended, error) {
			var e ended
			return e, r.Scan(&e.kind, &e.job)
		})
		if err != nil {
			return fmt.Errorf("expire parked operations: %w", err)
		}
		for _, e := range list {
			if e.job != nil {
				if _, err := d.client.JobCancelTx(ctx, tx, *e.job); err != nil {
					return fmt.Errorf("cancel the job of an expired operation: %w", err)
				}
			}
			d.metrics.finished.WithLabelValues(e.kind, string(space.OperationFailed)).Inc()
		}
		expired = len(list)
		return nil
	})
	if err != nil {
		return 0, err
	}
	moved, err := d.fillLanes(ctx)
	return expired + moved, err
}
