// Package dispatcher runs queued operations (create, restore, wake) on River
// (docs/dispatcher.md). An operation is a row of the operations table inserted in the same transaction
// as its River job, so that an accepted operation is never lost and is run for one
// request only. A worker runs the same flow as the synchronous API (internal/sandbox)
// under the operation's own client key and that key's limits at run time.
//
// A limit turning an operation away (an empty activation bucket, a full live-sandbox
// cap) is backpressure, not failure: the job is snoozed until the bucket refills, longer
// each time, spending no retry attempt, until the operation's admission deadline.
// Snoozing returns the worker slot at once, and every client is charged on its own
// bucket, so one client flooding the queue never holds up another client's work.
package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/idempotency"
	"github.com/space-sandbox/space/internal/sandbox"
	"github.com/space-sandbox/space/internal/store"
)

// Tuning that is not an operator setting.
const (
	// settleWait is how long a run that found its sandbox still settling (an earlier
	// attempt died with its replica) waits before looking again: about one round of
	// the reconciler.
	settleWait = 10 * time.Second
	// fetchPoll is how often an idle worker pool asks for available jobs: how late,
	// at most, a snoozed operation runs after its bucket refilled.
	fetchPoll = 200 * time.Millisecond
)

// Queue is the River queue of every operation. One queue is enough: the owners' lanes
// (lanes.go) keep it fair between owners, and a worker turned away by a bucket snoozes
// the job and takes the next one at once, so the queue never waits on any one
// client's bucket.
const Queue = "space_operations"

// Callers resolves the client an operation runs as into its budget key and limits,
// when the operation runs, so that a flag change applies to queued work too.
// *flags.Resolver is one.
type Callers interface {
	Resolve(ctx context.Context, id space.ClientID) space.Caller
}

// Options configure a Dispatcher. DB, Sandboxes and Callers are required, and so are
// the settings an operator sets (SPACE_DISPATCHER_*, SPACE_IDEMPOTENCY_KEY_TTL): their
// defaults live in internal/config.
type Options struct {
	DB        *pgxpool.Pool
	Sandboxes *sandbox.Service
	Callers   Callers
	// Workers is how many operations this process runs at once
	// (SPACE_DISPATCHER_WORKERS). 0 makes an insert-only dispatcher: it accepts
	// operations and others run them.
	Workers int
	// AdmissionDeadline is how long after acceptance an operation may still be turned
	// away by a limit before it fails as admission_timeout (required;
	// SPACE_DISPATCHER_ADMISSION_DEADLINE, 10m by default).
	AdmissionDeadline time.Duration
	// MaxSnooze caps one snooze (required; SPACE_DISPATCHER_MAX_SNOOZE, 1m by default).
	MaxSnooze time.Duration
	// OwnerLanes is how many of one owner's operations may be runnable at once per unit
	// of its queue weight (required; SPACE_DISPATCHER_OWNER_LANES, 4 by default): see
	// lanes.go.
	OwnerLanes int
	// MaxAttempts is how many real attempts an operation gets before it fails
	// (required; SPACE_DISPATCHER_MAX_ATTEMPTS, 5 by default). With River's backoff
	// (attempt^4 seconds) five attempts span about six minutes. Snoozes are not
	// attempts.
	MaxAttempts int
	// Backoff is the wait after failed attempt n (1 for the first) before the next;
	// nil is River's default policy (n^4 seconds, jittered by 10%).
	Backoff func(attempt int) time.Duration
	// JobTimeout bounds one run (required). space-api sets it to
	// SPACE_DISPATCHER_JOB_TIMEOUT, or to the substrate's timeout plus a margin for the
	// writes around it: above anything the flow itself would still finish, so River
	// never cuts a run short.
	JobTimeout time.Duration
	// RescueAfter is how long a run may stay running before River's rescuer takes it
	// as abandoned by a dead replica and runs it again (default JobTimeout + 1m; River's
	// own default is an hour). Above JobTimeout, so a live replica's run is never
	// rescued from under it. The rescuer looks every 30 seconds.
	RescueAfter time.Duration
	// SettleWait is how long a run that found its sandbox still settling waits before
	// trying again (default 10s); such waits spend no attempt.
	SettleWait time.Duration
	// IdempotencyTTL is how long an Idempotency-Key names the request it came with
	// (required; SPACE_IDEMPOTENCY_KEY_TTL, 24h by default).
	IdempotencyTTL time.Duration
	// Rand returns a float in [0, 1) for snooze jitter (default math/rand/v2.Float64).
	Rand       func() float64
	Registerer prometheus.Registerer
	// BudgetKeys is how many budget keys label the queue's series of their own, the
	// largest backlogs; the rest are summed under budget_key="_other"
	// (SPACE_METRICS_BUDGET_KEYS). 0 names none.
	BudgetKeys int
	Logger     *slog.Logger
	// River, when set, adjusts River's configuration before the client is made: tests
	// shorten fetch intervals with it.
	River func(*river.Config)
}

// Dispatcher accepts operations and, with Workers > 0, runs them.
type Dispatcher struct {
	opts    Options
	db      *store.DB
	client  *river.Client[pgx.Tx]
	metrics *metrics
	logger  *slog.Logger
	started bool
}

// River is the River client the dispatcher queues and runs operations with, for River
// UI to read the queue through (SPACE_RIVER_UI). It is not for queueing: Enqueue
// keeps each operation's row and job together.
func (d *Dispatcher) River() *river.Client[pgx.Tx] { return d.client }

// New returns a Dispatcher; Start runs its workers.
func New(opts Options) (*Dispatcher, error) {
	switch {
	case opts.DB == nil:
		return nil, errors.New("dispatcher: DB is required")
	case opts.Sandboxes == nil:
		return nil, errors.New("dispatcher: Sandboxes is required")
	case opts.Callers == nil:
		return nil, errors.New("dispatcher: Callers is required")
	case opts.Workers < 0:
		return nil, fmt.Errorf("dispatcher: Workers must be >= 0, got %d", opts.Workers)
	case opts.AdmissionDeadline <= 0:
		return nil, fmt.Errorf("dispatcher: AdmissionDeadline must be positive, got %s", opts.AdmissionDeadline)
	case opts.MaxSnooze <= 0:
		return nil, fmt.Errorf("dispatcher: MaxSnooze must be positive, got %s", opts.MaxSnooze)
	case opts.MaxAttempts <= 0:
		return nil, fmt.Errorf("dispatcher: MaxAttempts must be >= 1, got %d", opts.MaxAttempts)
	case opts.JobTimeout <= 0:
		return nil, fmt.Errorf("dispatcher: JobTimeout must be positive, got %s", opts.JobTimeout)
	case opts.IdempotencyTTL <= 0:
		return nil, fmt.Errorf("dispatcher: IdempotencyTTL must be positive, got %s", opts.IdempotencyTTL)
	case opts.OwnerLanes < 1:
		return nil, fmt.Errorf("dispatcher: OwnerLanes must be >= 1, got %d", opts.OwnerLanes)
	}
	if opts.RescueAfter <= opts.JobTimeout {
		opts.RescueAfter = opts.JobTimeout + time.Minute
	}
	if opts.SettleWait <= 0 {
		opts.SettleWait = settleWait
	}
	if opts.Rand == nil {
		opts.Rand = rand.Float64
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(opts.Registerer, opts.DB, opts.BudgetKeys)
	if err != nil {
		return nil, err
	}
	d := &Dispatcher{opts: opts, db: store.Wrap(opts.DB), metrics: m, logger: opts.Logger}

	workers := river.NewWorkers()
	for _, err := range []error{
		river.AddWorkerSafely(workers, &worker[createArgs]{d: d}),
		river.AddWorkerSafely(workers, &worker[restoreArgs]{d: d}),
		river.AddWorkerSafely(workers, &worker[wakeArgs]{d: d}),
	} {
		if err != nil {
			return nil, fmt.Errorf("dispatcher: %w", err)
		}
	}
	cfg := &river.Config{
		Logger:               opts.Logger,
		MaxAttempts:          opts.MaxAttempts,
		JobTimeout:           opts.JobTimeout,
		RescueStuckJobsAfter: opts.RescueAfter,
		Workers:              workers,
		// A snoozed lane wakes when its bucket refills: the fetch that runs it comes
		// within fetchPoll after (River's default polls every second).
		FetchPollInterval: fetchPoll,
	}
	if opts.Backoff != nil {
		cfg.RetryPolicy = backoffPolicy(opts.Backoff)
	}
	if opts.Workers > 0 {
		cfg.Queues = map[string]river.QueueConfig{Queue: {MaxWorkers: opts.Workers}}
	}
	if opts.River != nil {
		opts.River(cfg)
	}
	d.client, err = river.NewClient(riverpgxv5.New(opts.DB), cfg)
	if err != nil {
		return nil, fmt.Errorf("dispatcher: river client: %w", err)
	}
	return d, nil
}

// backoffPolicy adapts Options.Backoff to River.
type backoffPolicy func(attempt int) time.Duration

func (f backoffPolicy) NextRetry(job *rivertype.JobRow) time.Time {
	return time.Now().Add(f(job.Attempt))
}

// Start runs the workers until Stop; an insert-only Dispatcher (Workers 0) has none and
// Start does nothing. ctx gives values only: cancelling it does not stop the workers
// (a SIGTERM must let running operations finish; that is Stop's job).
func (d *Dispatcher) Start(ctx context.Context) error {
	if d.opts.Workers == 0 {
		return nil
	}
	if err := d.client.Start(context.WithoutCancel(ctx)); err != nil {
		return fmt.Errorf("dispatcher: start workers: %w", err)
	}
	d.started = true
	return nil
}

// hardStopTimeout bounds the wait for cancelled runs once a graceful stop ran out of
// time.
const hardStopTimeout = 5 * time.Second

// Stop stops fetching operations and waits, until ctx is done, for running ones to
// finish. If ctx ends first, running operations are cancelled: an operation cut short
// before its sandbox was reserved goes back to the queue without spending an attempt;
// one past that point finishes its cold start anyway (the flow detaches from the
// caller's context), bounded by a short grace.
func (d *Dispatcher) Stop(ctx context.Context) error {
	if !d.started {
		return nil
	}
	err := d.client.Stop(ctx)
	if err == nil {
		return nil
	}
	hardCtx, cancel := context.WithTimeout(context.Background(), hardStopTimeout)
	defer cancel()
	return errors.Join(fmt.Errorf("dispatcher: graceful stop: %w", err), d.client.StopAndCancel(hardCtx))
}

// Request is an operation to accept.
type Request struct {
	Kind space.OperationKind
	// Client is the authenticated caller, who owns the operation. A wake ignores it: it
	// runs as the sandbox's owner, whoever asks.
	Client space.ClientID
	// SandboxID is the sandbox a restore or a wake acts on. A create's sandbox id is
	// fixed by the dispatcher and shown on the operation.
	SandboxID string
	// Create is a create's plan (sandbox.Service.Plan with Async set): validated, and
	// its shape resolved for Client, so that a create no cold start could serve is
	// refused when it is queued rather than when it runs.
	Create *sandbox.Plan
	// IdempotencyKey, when set, makes a repeat of the same request by the same client
	// return the operation of the first (see Enqueue).
	IdempotencyKey string
}

// Enqueue accepts an operation and returns it, queued, with created true; or, for a
// request whose client already sent it under its IdempotencyKey, the operation of
// that first request (in whatever state it now is) with created false.
//
// The request is checked as the synchronous path would check it, before anything is
// queued: a create by its plan; a restore or a wake of a sandbox that is not there
// (or, for a restore, not the client's) is ENOTFOUND, and a restore of a sandbox that
// is not paused ECONFLICT. Keys are per client and name their request for
// Options.IdempotencyTTL; the key is claimed in the transaction that queues the
// operation, the one path every operation is inserted through (idempotency.Run).
func (d *Dispatcher) Enqueue(ctx context.Context, req Request) (*space.Operation, bool, error) {
	op := &row{IdempotencyKey: req.IdempotencyKey}
	op.ID = uuid.NewString()
	op.Kind = req.Kind
	op.Client = req.Client
	if op.Client == "" && req.Kind != space.OperationWake {
		return nil, false, errors.New("enqueue: an operation needs the client it is for")
	}
	var err error
	var owner space.Caller
	target := ""
	switch req.Kind {
	case space.OperationCreate:
		if req.Create == nil {
			return nil, false, errors.New("enqueue: a create needs its plan")
		}
		owner = req.Create.Caller
		op.SandboxID = uuid.NewString()
		if op.Request, err = req.Create.Request.Encode(); err != nil {
			return nil, false, err
		}
	case space.OperationRestore, space.OperationWake:
		if err := sandbox.CheckID(req.SandboxID); err != nil {
			return nil, false, err
		}
		op.SandboxID = strings.ToLower(req.SandboxID)
		target = op.SandboxID
		op.Request = []byte("{}")
		if req.Kind == space.OperationWake {
			if op.Client, err = d.opts.Sandboxes.Owner(ctx, op.SandboxID); err != nil {
				return nil, false, err
			}
		}
		owner = d.opts.Callers.Resolve(ctx, op.Client)
	default:
		return nil, false, space.FieldError(space.EINVALID, "kind", "must be create, restore or wake, got %q", req.Kind)
	}
	op.RequestHash = idempotency.Hash(string(op.Kind), target, op.Request)
	op.BudgetKey, op.Tier = owner.Key, owner.Tier
	lanes := d.lanes(owner)

	rec := &idempotency.Record{Client: op.Client, Key: op.IdempotencyKey,
		RequestHash: op.RequestHash, OperationID: op.ID, SandboxID: op.SandboxID}
	first, err := idempotency.Run(ctx, d.db, rec, d.opts.IdempotencyTTL, func() error { return d.precheck(ctx, op) },
		func(ctx context.Context, tx pgx.Tx) error {
			if err := lockOwner(ctx, tx, op.Client); err != nil {
				return err
			}
			busy, err := inLane(ctx, tx, op.Client)
			if err != nil {
				return err
			}
			op.Parked = busy >= lanes
			if err := insertOperation(ctx, tx, op, d.opts.AdmissionDeadline); err != nil {
				return err
			}
			insert := &river.InsertOpts{Queue: Queue}
			if op.Parked {
				insert.ScheduledAt = time.Now().Add(parkedFor)
			}
			res, err := d.client.InsertTx(ctx, tx, argsFor(op.Kind, op.ID), insert)
			if err != nil {
				return fmt.Errorf("insert job of operation %s: %w", op.ID, err)
			}
			return setJobID(ctx, tx, op.ID, res.Job.ID)
		})
	switch {
	case err != nil:
		return nil, false, err
	case first != nil:
		// A repeat: the operation the first request made, as it is now.
		prev, err := getOperation(ctx, d.db, first.OperationID, op.Client)
		if err != nil {
			return nil, false, err
		}
		out, err := d.withSandbox(ctx, prev)
		return out, false, err
	}
	d.metrics.enqueued.WithLabelValues(string(op.Kind)).Inc()
	op.State = space.OperationQueued
	return &op.Operation, true, nil
}

// precheck refuses at once a restore that could never run: the check the synchronous
// path makes before it charges anything, against the state of now. (A create was
// checked by its plan.)
func (d *Dispatcher) precheck(ctx context.Context, op *row) error {
	if op.Kind != space.OperationRestore {
		return nil
	}
	sb, err := d.opts.Sandboxes.Get(ctx, op.Client, op.SandboxID)
	if err != nil {
		return err
	}
	if sb.State != space.StatePaused {
		return space.Errorf(space.ECONFLICT, "sandbox %s is %s; a restore needs it paused", sb.ID, sb.State)
	}
	return nil
}

// Get returns client's operation id; another client's is ENOTFOUND. A succeeded
// operation carries its sandbox as it is now.
func (d *Dispatcher) Get(ctx context.Context, client space.ClientID, id string) (*space.Operation, error) {
	if client == "" {
		return nil, space.Errorf(space.ENOTFOUND, "no operation %s", id)
	}
	return d.get(ctx, client, id)
}

// GetAny returns operation id whoever's it is: for the internal listener (a wake's
// caller is not the client it runs as).
func (d *Dispatcher) GetAny(ctx context.Context, id string) (*space.Operation, error) {
	return d.get(ctx, "", id)
}

func (d *Dispatcher) get(ctx context.Context, client space.ClientID, id string) (*space.Operation, error) {
	if err := CheckOperationID(id); err != nil {
		return nil, err
	}
	op, err := getOperation(ctx, d.db, id, client)
	if err != nil {
		return nil, err
	}
	return d.withSandbox(ctx, op)
}

func (d *Dispatcher) withSandbox(ctx context.Context, op *row) (*space.Operation, error) {
	out := op.Operation
	if out.State != space.OperationSucceeded {
		return &out, nil
	}
	sb, err := d.opts.Sandboxes.Get(ctx, out.Client, out.SandboxID)
	switch {
	case err == nil:
		out.Sandbox = sb
	case space.ErrorCode(err) != space.ENOTFOUND:
		return nil, err
	}
	return &out, nil
}

// CheckOperationID returns an EINVALID error naming the id parameter when s is not an
// operation id (a UUID in its canonical form).
func CheckOperationID(s string) error {
	if len(s) != 36 {
		return space.FieldError(space.EINVALID, "id", "%s is not an operation id", quote(s))
	}
	if _, err := uuid.Parse(s); err != nil {
		return space.FieldError(space.EINVALID, "id", "%s is not an operation id", quote(s))
	}
	return nil
}

func quote(s string) string {
	if len(s) > 40 {
		s = s[:40] + "..."
	}
	return fmt.Sprintf("%q", s)
}

// SettleLost fails, with the reason, every operation whose River job ended without the
// operation reaching a final state: a job rescued from dead replicas until it ran out
// of attempts is discarded by River, and its operation would otherwise stay running for
// ever. The reconciler calls it each round, on one replica at a time. It returns how
// many it failed.
func (d *Dispatcher) SettleLost(ctx context.Context) (int, error) {
	lost, err := failLost(ctx, d.db)
	n := 0
	for kind, c := range lost {
		d.metrics.lost.WithLabelValues(string(kind)).Add(float64(c))
		d.metrics.finished.WithLabelValues(string(kind), string(space.OperationFailed)).Add(float64(c))
		n += c
	}
	if n > 0 {
		d.logger.WarnContext(ctx, "failed operations whose job ended without an outcome", "count", n)
	}
	return n, err
}

// Retained is the retention of finished operations: an operation that succeeded or
// failed is deleted age after it finished, through the operations_finished index.
// Its River job is River's to delete (a day after it completed, by default).
func Retained(age time.Duration) store.Retained {
	return store.Retained{Table: "operations", Age: age,
		Due: `SELECT ctid FROM operations WHERE state IN ('succeeded', 'failed') AND finished_at < now() - make_interval(secs => $1)
			ORDER BY finished_at LIMIT $2`}
}
