package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/store"
)

const operationColumns = `id::text, kind, client, sandbox_id::text, state, attempts, snoozes,
	coalesce(last_bucket, ''), coalesce(last_error, ''), coalesce(error_code, ''),
	coalesce(idempotency_key, ''), request_hash, request, admission_deadline, created_at, updated_at`

// row is an operation as stored: the domain type plus what only the dispatcher reads.
type row struct {
	space.Operation
	IdempotencyKey string
	RequestHash    string
	Request        []byte
	// Parked is true while the operation waits outside its owner's lanes (see lanes).
	Parked bool
	// BudgetKey and Tier are what the operation was accepted under, for the queue's
	// series.
	BudgetKey space.ClientKey
	Tier      string
}

func scanOperation(r pgx.Row, extra ...any) (*row, error) {
	var op row
	dest := []any{&op.ID, &op.Kind, &op.Client, &op.SandboxID, &op.State, &op.Attempts, &op.Snoozes,
		&op.Bucket, &op.LastError, &op.ErrorCode, &op.IdempotencyKey, &op.RequestHash, &op.Request,
		&op.AdmissionDeadline, &op.CreatedAt, &op.UpdatedAt}
	if err := r.Scan(append(dest, extra...)...); err != nil {
		return nil, err
	}
	return &op, nil
}

// insertOperation inserts op. The admission deadline is counted from the database's
// clock, like every other time the deadline is compared with.
func insertOperation(ctx context.Context, q store.Querier, op *row, deadline time.Duration) error {
	var key *string
	if op.IdempotencyKey != "" {
		key = &op.IdempotencyKey
	}
	err := q.QueryRow(ctx, `INSERT INTO operations (id, kind, client, sandbox_id, idempotency_key, request_hash, request, admission_deadline,
			parked, budget_key, tier)
		VALUES ($1, $2, $3, $4, $5, $6, $7, now() + make_interval(secs => $8), $9, $10, $11)
		RETURNING admission_deadline, created_at, updated_at`,
		op.ID, string(op.Kind), string(op.Client), op.SandboxID, key, op.RequestHash, op.Request, deadline.Seconds(),
		op.Parked, string(op.BudgetKey), op.Tier,
	).Scan(&op.AdmissionDeadline, &op.CreatedAt, &op.UpdatedAt)
	if err != nil {
		return fmt.Errorf("insert operation: %w", err)
	}
	return nil
}

func setJobID(ctx context.Context, q store.Querier, id string, jobID int64) error {
	if _, err := q.Exec(ctx, "UPDATE operations SET job_id = $2 WHERE id = $1", id, jobID); err != nil {
		return fmt.Errorf("record job of operation %s: %w", id, err)
	}
	return nil
}

// getOperation reads one operation of client; an empty client reads anyone's (the
// internal listener and the worker). ENOTFOUND when there is none, or it is another
// client's.
func getOperation(ctx context.Context, q store.Querier, id string, client space.ClientID) (*row, error) {
	op, err := scanOperation(q.QueryRow(ctx, "SELECT "+operationColumns+" FROM operations WHERE id = $1 AND ($2 = '' OR client = $2)",
		id, string(client)))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, space.Errorf(space.ENOTFOUND, "no operation %s", id)
	}
	if err != nil {
		return nil, fmt.Errorf("get operation: %w", err)
	}
	return op, nil
}

// startOperation marks a queued (or, after a crash, still running) operation running
// and returns it, with the time it waited in the queue when this is its first run
// (0 otherwise). A final operation is returned unchanged, with done true.
func startOperation(ctx context.Context, q store.Querier, id string) (op *row, waited time.Duration, done bool, err error) {
	var first bool
	var waitedSecs float64
	op, err = scanOperation(q.QueryRow(ctx, `UPDATE operations SET state = 'running',
			started_at = coalesce(started_at, now()), updated_at = now()
		WHERE id = $1 AND state IN ('queued', 'running')
		RETURNING `+operationColumns+`, started_at = now(), extract(epoch FROM now() - created_at)::float8`, id),
		&first, &waitedSecs)
	if errors.Is(err, pgx.ErrNoRows) {
		op, err = getOperation(ctx, q, id, "")
		return op, 0, err == nil, err
	}
	if err != nil {
		return nil, 0, false, fmt.Errorf("start operation %s: %w", id, err)
	}
	if first {
		waited = seconds(waitedSecs)
	}
	return op, waited, false, nil
}

// outcome is how one run of an operation ended, as the row records it.
type outcome struct {
	State space.OperationState
	// Attempts is the real attempt count after this run; nil leaves it (a snooze).
	Attempts  *int
	LastError string
	ErrorCode string
}

func finishOperation(ctx context.Context, q store.Querier, id string, o outcome) error {
	_, err := q.Exec(ctx, `UPDATE operations SET state = $2, attempts = coalesce($3::integer, attempts),
			last_error = nullif($4::text, ''), error_code = nullif($5::text, ''), updated_at = now(),
			finished_at = CASE WHEN $2::text IN ('succeeded', 'failed') THEN now() END
		WHERE id = $1`, id, string(o.State), o.Attempts, o.LastError, o.ErrorCode)
	if err != nil {
		return fmt.Errorf("record operation %s %s: %w", id, o.State, err)
	}
	return nil
}

// snoozeOperation records an admission rejection: back to queued with one more snooze,
// unless the admission deadline has passed by the database's clock, in which case the
// operation fails as admission_timeout (timedOut true) and is not counted as snoozed.
// remaining is the time left before the deadline.
func snoozeOperation(ctx context.Context, q store.Querier, id string, bucket space.Bucket, snoozeMsg, timeoutMsg string) (timedOut bool, remaining time.Duration, err error) {
	var state string
	var secs float64
	err = q.QueryRow(ctx, `UPDATE operations SET
			state = CASE WHEN admission_deadline <= now() THEN 'failed' ELSE 'queued' END,
			snoozes = snoozes + CASE WHEN admission_deadline <= now() THEN 0 ELSE 1 END,
			error_code = CASE WHEN admission_deadline <= now() THEN $3::text END,
			last_error = CASE WHEN admission_deadline <= now() THEN $5::text ELSE $4::text END,
			finished_at = CASE WHEN admission_deadline <= now() THEN now() END,
			last_bucket = $2::text, updated_at = now()
		WHERE id = $1
		RETURNING state, extract(epoch FROM admission_deadline - now())::float8`,
		id, string(bucket), space.CodeAdmissionTimeout, snoozeMsg, timeoutMsg).Scan(&state, &secs)
	if err != nil {
		return false, 0, fmt.Errorf("snooze operation %s: %w", id, err)
	}
	return state == string(space.OperationFailed), seconds(secs), nil
}

// seconds converts a float of seconds from Postgres into a Duration without overflow.
func seconds(s float64) time.Duration {
	const maxSecs = float64(math.MaxInt64) / float64(time.Second)
	switch {
	case s >= maxSecs:
		return math.MaxInt64
	case s <= -maxSecs:
		return math.MinInt64
	}
	return time.Duration(s * float64(time.Second))
}

// lostAfter is how long an operation's job may have been final while the operation is
// not, before the operation is taken as lost: a run records its outcome and completes
// its job in one transaction, so any gap is a job River ended on its own (rescued from
// dead replicas until out of attempts) or one already cleaned up.
const lostAfter = time.Minute

// failLost fails every operation still queued or running whose River job is final or
// gone, with the reason, and returns them by kind.
func failLost(ctx context.Context, q store.Querier) (map[space.OperationKind]int, error) {
	rows, err := q.Query(ctx, `UPDATE operations o SET state = 'failed', error_code = $1,
			last_error = 'the operation''s job ended (' || coalesce(j.state::text, 'deleted') ||
				') without recording an outcome: the replicas running it stopped mid-run until its attempts ran out',
			finished_at = now(), updated_at = now()
		FROM operations o2 LEFT JOIN river_job j ON j.id = o2.job_id
		WHERE o.id = o2.id AND o.state IN ('queued', 'running') AND o.updated_at < now() - make_interval(secs => $2)
			AND (j.id IS NULL OR (j.state IN ('completed', 'cancelled', 'discarded') AND j.finalized_at < now() - make_interval(secs => $2)))
		RETURNING o.kind`, space.EUNAVAILABLE, lostAfter.Seconds())
	if err != nil {
		return nil, fmt.Errorf("fail lost operations: %w", err)
	}
	kinds, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("fail lost operations: %w", err)
	}
	out := map[space.OperationKind]int{}
	for _, k := range kinds {
		out[space.OperationKind(k)]++
	}
	return out, nil
}
