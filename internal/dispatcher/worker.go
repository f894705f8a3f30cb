package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/sandbox"
)

// The jobs carry only their operation's id: the operations row holds the request,
// so that what a client sees and what a worker runs are one record.
type (
	createArgs struct {
		OperationID string `json:"operation_id"`
	}
	restoreArgs struct {
		OperationID string `json:"operation_id"`
	}
	wakeArgs struct {
		OperationID string `json:"operation_id"`
	}
)

func (createArgs) Kind() string  { return "space.create" }
func (restoreArgs) Kind() string { return "space.restore" }
func (wakeArgs) Kind() string    { return "space.wake" }

func (a createArgs) operationID() string  { return a.OperationID }
func (a restoreArgs) operationID() string { return a.OperationID }
func (a wakeArgs) operationID() string    { return a.OperationID }

type jobArgs interface {
	river.JobArgs
	operationID() string
}

func argsFor(kind space.OperationKind, id string) river.JobArgs {
	switch kind {
	case space.OperationRestore:
		return restoreArgs{OperationID: id}
	case space.OperationWake:
		return wakeArgs{OperationID: id}
	}
	return createArgs{OperationID: id}
}

// worker runs one kind of operation; the three kinds share Dispatcher.work.
type worker[T jobArgs] struct {
	river.WorkerDefaults[T]
	d *Dispatcher
}

func (w *worker[T]) Work(ctx context.Context, job *river.Job[T]) error {
	return w.d.work(ctx, job.JobRow, job.Args.operationID(), func(ctx context.Context, tx pgx.Tx) error {
		_, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job)
		return err
	})
}

// recordTimeout bounds the writes that record a run's outcome. They run on a context
// detached from the job's, so that an outcome reached during shutdown is still written.
const recordTimeout = 10 * time.Second

// work runs one attempt of operation id and turns its outcome into what River should
// do next. complete marks the job completed inside the transaction that records the
// success, so the two cannot disagree.
//
// Attempt accounting: River adds one to a job's attempt when it fetches it and, for a
// snooze, sets it back (riverdriver.JobSetStateSnoozed with attempt-1), so job.Attempt
// is the number of real attempts including this one. The row's attempts is set to it
// after a real attempt and left alone after a snooze; the row's snoozes counts
// admission snoozes only.
func (d *Dispatcher) work(ctx context.Context, job *rivertype.JobRow, id string, complete func(context.Context, pgx.Tx) error) error {
	op, waited, done, err := startOperation(ctx, d.db, id)
	switch {
	case space.ErrorCode(err) == space.ENOTFOUND:
		// A job without its row cannot happen (one transaction inserts both); if it
		// does, retrying will not make the row appear.
		return river.JobCancel(fmt.Errorf("operation %s: %w", id, err))
	case err != nil:
		return err
	case done:
		// Finished by an earlier run whose job update was lost (a crash between the
		// two): nothing left to do.
		return nil
	}
	if waited > 0 {
		d.metrics.queue.WithLabelValues(string(op.Kind)).Observe(waited.Seconds())
	}

	caller := d.opts.Callers.Resolve(ctx, op.Client)
	runErr := d.run(space.NewContext(ctx, caller), op, caller)

	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancel()
	kind := string(op.Kind)
	attempts := job.Attempt
	var le *space.LimitError
	switch {
	case runErr == nil:
		// The end frees the operation's lane: the owner's next parked operation moves
		// in, in the same transaction.
		err := d.db.Tx(rctx, func(tx pgx.Tx) error {
			if err := finishOperation(rctx, tx, op.ID, outcome{State: space.OperationSucceeded, Attempts: &attempts}); err != nil {
				return err
			}
			if _, err := d.unpark(rctx, tx, op.Client, d.lanes(caller)); err != nil {
				return err
			}
			return complete(rctx, tx)
		})
		if err != nil {
			return fmt.Errorf("record success of operation %s: %w", op.ID, err)
		}
		d.metrics.finished.WithLabelValues(kind, string(space.OperationSucceeded)).Inc()
		return nil

	case errors.As(runErr, &le):
		return d.snooze(rctx, op, le, caller)

	case errors.Is(runErr, sandbox.ErrSettling):
		// An earlier attempt's sandbox is still starting: its replica died mid cold
		// start and the job was rescued. The reconciler settles the sandbox (running:
		// the next run returns it; failed: the next run retries into it) within its
		// bound; wait for that, spending no attempt.
		if err := finishOperation(rctx, d.db, op.ID, outcome{State: space.OperationQueued, LastError: space.ErrorMessage(runErr)}); err != nil {
			return err
		}
		d.metrics.settles.WithLabelValues(kind).Inc()
		return river.JobSnooze(d.opts.SettleWait)

	case errors.Is(ctx.Err(), context.Canceled) && errors.Is(runErr, context.Canceled):
		// Cut short by a hard stop before anything was reserved: back to the queue for
		// the next worker, no attempt spent (River's documented use of a zero snooze).
		// A run over JobTimeout (DeadlineExceeded) is a real attempt: it must not loop.
		if err := finishOperation(rctx, d.db, op.ID, outcome{State: space.OperationQueued, LastError: op.LastError}); err != nil {
			d.logger.ErrorContext(rctx, "requeue interrupted operation", "operation", op.ID, "err", err)
		}
		return river.JobSnooze(0)
	}

	code := space.ErrorCode(runErr)
	msg := space.ErrorMessage(runErr)
	d.metrics.retries.WithLabelValues(kind, code).Inc()
	d.logger.WarnContext(rctx, "operation attempt failed", "operation", op.ID, "kind", kind,
		"client", string(op.Client), "attempt", job.Attempt, "max_attempts", job.MaxAttempts, "code", code, "err", runErr)
	final := permanent(code) || job.Attempt >= job.MaxAttempts
	o := outcome{State: space.OperationQueued, Attempts: &attempts, LastError: msg}
	if final {
		o.State, o.ErrorCode = space.OperationFailed, code
	}
	if err := finishOperation(rctx, d.db, op.ID, o); err != nil {
		return errors.Join(runErr, err)
	}
	if !final {
		return runErr // River retries after its backoff
	}
	d.metrics.finished.WithLabelValues(kind, string(space.OperationFailed)).Inc()
	d.freeLane(rctx, op.Client)
	if permanent(code) {
		return river.JobCancel(runErr) // retrying cannot help
	}
	return runErr // the last attempt: River discards the job
}

// run is one attempt of the operation's flow, as the synchronous API would run it.
func (d *Dispatcher) run(ctx context.Context, op *row, caller space.Caller) error {
	svc := d.opts.Sandboxes
	var err error
	switch op.Kind {
	case space.OperationCreate:
		req, derr := sandbox.DecodeCreate(op.Request)
		if derr != nil {
			return space.Errorf(space.EINVALID, "operation %s holds an unreadable request: %v", op.ID, derr)
		}
		req.ID = op.SandboxID
		req.Answered = true // its 202 named the sandbox
		_, err = svc.CreateQueued(ctx, caller, req)
	case space.OperationRestore:
		_, err = svc.Restore(ctx, caller, op.SandboxID)
	case space.OperationWake:
		_, err = svc.Wake(ctx, caller, op.SandboxID)
	default:
		err = space.Errorf(space.EINVALID, "operation %s has an unknown kind %q", op.ID, op.Kind)
	}
	return err
}

// snooze puts an operation turned away by a limit back in the queue until the bucket
// has refilled (see snoozeDelay), or fails it as admission_timeout once its admission
// deadline has passed. The last snooze before the deadline is shortened to end at it,
// so that the operation has one last try then. A snoozed operation keeps its lane: the
// owner's other operations wait parked, costing nothing, until it runs again.
func (d *Dispatcher) snooze(ctx context.Context, op *row, le *space.LimitError, caller space.Caller) error {
	kind := string(op.Kind)
	timeoutMsg := fmt.Sprintf("not admitted within the admission deadline of %s (%s): %s",
		d.opts.AdmissionDeadline, op.AdmissionDeadline.UTC().Format(time.RFC3339), le.Message())
	timedOut, remaining, err := snoozeOperation(ctx, d.db, op.ID, le.Bucket, le.Message(), timeoutMsg)
	if err != nil {
		return err
	}
	if timedOut {
		d.metrics.finished.WithLabelValues(kind, string(space.OperationFailed)).Inc()
		d.logger.InfoContext(ctx, "operation not admitted before its deadline", "operation", op.ID, "kind", kind,
			"client", string(op.Client), "bucket", string(le.Bucket), "snoozes", op.Snoozes)
		d.freeLane(ctx, op.Client)
		return river.JobCancel(&space.Error{Code: space.ELIMITED, Message: timeoutMsg, Err: le})
	}
	// The owner's lanes that wait take turns: the owner as a whole asks the bucket
	// about once per refill, however many of its lanes wait (a count that fails is
	// taken as this lane alone).
	waiting := 1
	if err := d.db.QueryRow(ctx, "SELECT count(*) FROM operations WHERE client = $1 AND NOT parked AND state = 'queued'",
		string(op.Client)).Scan(&waiting); err != nil || waiting < 1 {
		waiting = 1
	}
	delay := snoozeDelay(le.RetryAfter, waiting, d.opts.MaxSnooze, d.opts.Rand)
	// Wake just past the deadline, by the database's clock that decides it.
	if atDeadline := remaining + deadlineSlack; atDeadline < delay {
		delay = atDeadline
	}
	d.metrics.snoozes.WithLabelValues(kind, string(le.Bucket)).Inc()
	return river.JobSnooze(delay)
}

// deadlineSlack is added to the last snooze before an admission deadline so that the
// final try lands after the deadline, not a hair before it.
const deadlineSlack = 50 * time.Millisecond

// permanent reports whether an error with this code will come back on a retry: the
// request or the sandbox's state is wrong, not a dependency. Such a failure ends the
// operation at once instead of spending its remaining attempts.
func permanent(code string) bool {
	switch code {
	case space.EINVALID, space.EUNAUTHORIZED, space.ENOTFOUND, space.ECONFLICT, space.EUNPROCESSABLE:
		return true
	}
	return false
}
