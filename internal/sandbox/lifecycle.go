package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/metric"
	"github.com/space-sandbox/space/internal/store"
)

const (
	// lifecycleBatch bounds the due sandboxes one query of a round reads.
	lifecycleBatch = 500
	// lifecycleParallel is how many actions a round takes at once when
	// LifecycleOptions.Parallel is zero: a pause waits on the substrate's snapshot.
	lifecycleParallel = 8
	// pauseRetry is the least a failed idle pause is put off before it is tried
	// again (the interval, when longer): a substrate that cannot snapshot is not asked
	// again every round.
	pauseRetry = time.Minute
	// catchUpEvery is how often a round also looks for live sandboxes missing a
	// deadline their owner's lifecycle sets (catchUp): a full scan of the live rows,
	// too much for every round, and nothing a minute late matters to.
	catchUpEvery = time.Minute
)

// LifecycleOptions configure a Lifecycle.
type LifecycleOptions struct {
	// Service is the flow whose sandboxes the lifecycle pauses and ends.
	Service *Service
	// Interval between rounds (required; SPACE_LIFECYCLE_INTERVAL, 5s by default): an
	// action is never more than about one interval late, the substrate's time aside.
	Interval time.Duration
	// Resolve returns a sandbox owner's Caller, whose lifecycle and caps apply to its
	// sandboxes (the API's resolver); required.
	Resolve func(ctx context.Context, owner space.ClientID) space.Caller
	// Parallel is how many actions run at once (default 8).
	Parallel   int
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// Lifecycle takes the actions of docs/lifecycle.md when they are due: a running
// sandbox past its max lifetime is terminated, one idle past its idle timeout paused
// (terminated when its idle action says so, or when its client is at its cap of
// paused sandboxes), and a paused one past its max lifetime or its retention deleted
// with its snapshot.
//
// Each round runs on one replica at a time, under a Postgres advisory lock, and reads
// the due sandboxes with one indexed query, earliest first, in batches. Each action is
// one guarded write that takes it only while the sandbox is still in the state it was
// read in and its deadline still due by the database's clock (a keepalive, a restore
// or a delete that came meanwhile wins), so no action is taken twice. A pause and a
// termination are the owner's own (Service.pause, Service.terminate): a replica that
// dies in the middle leaves a pausing sandbox for the reconciler to settle, and an
// ended one's resources for its sweep, as after any crash.
type Lifecycle struct {
	opts     LifecycleOptions
	svc      *Service
	logger   *slog.Logger
	actions  *prometheus.CounterVec
	failures *prometheus.CounterVec
	caughtUp prometheus.Counter
	// lastCatchUp is when this replica's rounds last ran catchUp (Unix nanoseconds; 0:
	// never).
	lastCatchUp atomic.Int64
}

// LifecycleResult says what one round did.
type LifecycleResult struct {
	// Leader is false when another replica holds the lock and this round did nothing.
	Leader bool
	// Taken counts the actions taken, by action ("pause", "terminate") and reason.
	Taken map[[2]string]int
	// Failed counts the actions that failed; Skipped those the sandbox moved on from
	// (a keepalive, a restore, a delete) before they were taken.
	Failed, Skipped int
	// Queries is how many queries for due sandboxes the round ran.
	Queries int
	// CaughtUp is how many sandboxes the round gave a deadline they lacked (catchUp).
	CaughtUp int
}

// NewLifecycle returns a Lifecycle, or an error naming the option that is missing.
func NewLifecycle(opts LifecycleOptions) (*Lifecycle, error) {
	switch {
	case opts.Service == nil:
		return nil, errors.New("lifecycle: Service is required")
	case opts.Interval <= 0:
		return nil, fmt.Errorf("lifecycle: Interval must be positive, got %s", opts.Interval)
	case opts.Resolve == nil:
		return nil, errors.New("lifecycle: Resolve is required")
	}
	if opts.Parallel <= 0 {
		opts.Parallel = lifecycleParallel
	}
	l := &Lifecycle{opts: opts, svc: opts.Service, logger: opts.Logger}
	if l.logger == nil {
		l.logger = slog.New(slog.DiscardHandler)
	}
	l.actions = metric.Register(opts.Registerer, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "space_sandbox_lifecycle_actions_total",
		Help: "Lifecycle actions taken, by action (pause, terminate), reason (idle, max_lifetime, retention, paused_sandbox_cap) and the owner's tier.",
	}, []string{"action", "reason", "tier"}))
	l.failures = metric.Register(opts.Registerer, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "space_sandbox_lifecycle_failures_total",
		Help: "Lifecycle actions that failed (the substrate could not snapshot, Postgres refused the write), by action: a failed pause is tried again after a backoff.",
	}, []string{"action"}))
	for _, a := range []string{"pause", "terminate"} {
		l.failures.WithLabelValues(a)
	}
	l.caughtUp = metric.Register(opts.Registerer, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "space_sandbox_lifecycle_deadlines_caught_up_total",
		Help: "Live sandboxes given a lifecycle deadline they lacked (made before the lifecycle, by an older release, or before their owner's limit was set), counted from the moment it was noticed.",
	}))
	return l, nil
}

// Run takes the due actions every Interval until ctx ends. onRound, when not nil, is
// told each round's result: tests wait on it instead of sleeping.
func (l *Lifecycle) Run(ctx context.Context, onRound func(LifecycleResult, error)) {
	everyRound(ctx, l.opts.Interval, l.Round, onRound, l.logger, "lifecycle round failed")
}

// everyRound runs round at once and then every interval until ctx ends, logging a
// failure as what (unless ctx ended it) and telling onRound, when not nil, each
// result: the loop of the reconciler and the lifecycle.
func everyRound[R any](ctx context.Context, interval time.Duration, round func(context.Context) (R, error), onRound func(R, error), logger *slog.Logger, what string) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		res, err := round(ctx)
		if err != nil && ctx.Err() == nil {
			logger.WarnContext(ctx, what, "err", err)
		}
		if onRound != nil {
			onRound(res, err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// dueSandbox is what a round reads of a sandbox whose next action is due.
type dueSandbox struct {
	id, owner        string
	state            space.SandboxState
	expires, retired bool // its max lifetime, its retention has come
	idle             bool // its idle action has come
	action           space.IdleAction
}

// dueSQL reads the due sandboxes, earliest first, through sandboxes_lifecycle_due
// (migrations/00014): the CASE is that index's expression.
const dueSQL = `SELECT id::text, client, state,
		coalesce(expires_at <= now(), false), coalesce(idle_at <= now(), false), coalesce(retain_until <= now(), false),
		coalesce(idle_action, '')
	FROM sandboxes
	WHERE state IN ('running', 'paused')
		AND (CASE WHEN state = 'running' THEN least(expires_at, idle_at) ELSE least(expires_at, retain_until) END) <= now()
	ORDER BY (CASE WHEN state = 'running' THEN least(expires_at, idle_at) ELSE least(expires_at, retain_until) END)
	LIMIT $1`

// DueQuery is the query a round reads its due sandboxes with and its arguments (one
// batch's bound), exactly as Round runs it: what measures the round from outside (the
// bench's EXPLAIN of it at scale) explains this very SQL, not a copy that could drift.
func DueQuery() (sql string, args []any) { return dueSQL, []any{lifecycleBatch} }

// Round takes every action due now, if this replica can take the lock: batch after
// batch until one comes back short of a full batch, so that however many came due
// since the last round, none waits for the next.
func (l *Lifecycle) Round(ctx context.Context) (LifecycleResult, error) {
	res := LifecycleResult{Taken: map[[2]string]int{}}
	var mu sync.Mutex
	leader, err := store.WhileLocked(ctx, l.svc.db.Pool(), store.LifecycleLockID, func(ctx context.Context) error {
		if now, last := l.svc.opts.Now(), l.lastCatchUp.Load(); last == 0 || now.Sub(time.Unix(0, last)) >= catchUpEvery {
			n, err := l.catchUp(ctx)
			if err != nil {
				return err
			}
			l.lastCatchUp.Store(now.UnixNano())
			res.CaughtUp = n
		}
		for {
			due, err := l.due(ctx)
			res.Queries++
			if err != nil {
				return err
			}
			// Counts, not a copy of res: a copy would share res.Taken, the map this batch
			// counts into, and see no action taken.
			takenBefore, skippedBefore := taken(res), res.Skipped
			sem := make(chan struct{}, l.opts.Parallel)
			var wg sync.WaitGroup
			for _, d := range due {
				sem <- struct{}{}
				wg.Go(func() {
					defer func() { <-sem }()
					action, reason, err := l.take(ctx, d)
					mu.Lock()
					defer mu.Unlock()
					switch {
					case errors.Is(err, errMovedOn):
						res.Skipped++
					case err != nil:
						res.Failed++
					case action != "":
						res.Taken[[2]string{action, reason}]++
					}
				})
			}
			wg.Wait()
			// A full batch is read again, unless none of it was taken or moved on: a
			// batch that only failed would be read back as it is.
			progress := res.Skipped > skippedBefore || taken(res) > takenBefore
			if len(due) < lifecycleBatch || !progress || ctx.Err() != nil {
				return ctx.Err()
			}
		}
	})
	res.Leader = leader
	if err != nil {
		return res, fmt.Errorf("lifecycle: %w", err)
	}
	return res, nil
}

// taken is how many actions res counts as taken.
func taken(res LifecycleResult) int {
	n := 0
	for _, v := range res.Taken {
		n += v
	}
	return n
}

func (l *Lifecycle) due(ctx context.Context) ([]dueSandbox, error) {
	sql, args := DueQuery()
	rows, err := l.svc.db.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("find due sandboxes: %w", err)
	}
	defer rows.Close()
	var out []dueSandbox
	for rows.Next() {
		var d dueSandbox
		var action string
		if err := rows.Scan(&d.id, &d.owner, &d.state, &d.expires, &d.idle, &d.retired, &action); err != nil {
			return nil, fmt.Errorf("find due sandboxes: %w", err)
		}
		d.action = space.IdleAction(action)
		out = append(out, d)
	}
	return out, rows.Err()
}

// errMovedOn is take's answer for a sandbox that left the state or the deadline it was
// read with before its action was taken.
var errMovedOn = errors.New("the sandbox moved on")

// take takes sandbox d's due action and returns which it took and why.
func (l *Lifecycle) take(ctx context.Context, d dueSandbox) (action, reason string, err error) {
	owner := l.opts.Resolve(ctx, space.ClientID(d.owner))
	switch {
	case d.expires:
		return l.terminate(ctx, owner, d, space.ReasonMaxLifetime, dueExpires)
	case d.state == space.StatePaused && d.retired:
		return l.terminate(ctx, owner, d, space.ReasonRetention, dueRetain)
	case d.state == space.StateRunning && d.idle && d.action == space.IdleTerminate:
		return l.terminate(ctx, owner, d, space.ReasonIdle, dueIdle)
	case d.state == space.StateRunning && d.idle:
		_, err := l.svc.pause(ctx, owner, d.id, space.ReasonIdle, dueIdle)
		var le *space.LimitError
		switch {
		case errors.As(err, &le) && le.Bucket == space.BucketPausedSandboxCap:
			// Its client holds all the paused sandboxes it may: the idle sandbox is
			// ended rather than kept running at its cost.
			return l.terminate(ctx, owner, d, space.ReasonPausedSandboxCap, dueIdle)
		case space.ErrorCode(err) == space.ECONFLICT:
			return "", "", errMovedOn
		case space.ErrorCode(err) == space.EUNPROCESSABLE:
			// The substrate can never snapshot it (no volume to keep): a pause can never
			// happen, and an idle sandbox is ended rather than left running for ever.
			l.logger.WarnContext(ctx, "an idle sandbox cannot be paused on this substrate; it is terminated instead", "sandbox", d.id, "err", err)
			return l.terminate(ctx, owner, d, space.ReasonIdle, dueIdle)
		case err != nil:
			l.failures.WithLabelValues("pause").Inc()
			retry := max(pauseRetry, l.opts.Interval)
			l.logger.WarnContext(ctx, "an idle pause failed; it is tried again later", "sandbox", d.id, "retry_in", retry, "err", err)
			l.putOff(ctx, d.id, retry)
			return "", "", err
		}
		l.actions.WithLabelValues("pause", space.ReasonIdle, owner.Tier).Inc()
		return "pause", space.ReasonIdle, nil
	}
	return "", "", nil
}

// terminate ends d for reason, guarded on due, and counts it.
func (l *Lifecycle) terminate(ctx context.Context, owner space.Caller, d dueSandbox, reason string, due dueGuard) (string, string, error) {
	_, err := l.svc.terminate(ctx, space.ClientID(d.owner), d.id, reason, due, d.state)
	switch {
	case space.ErrorCode(err) == space.ECONFLICT || space.ErrorCode(err) == space.ENOTFOUND:
		return "", "", errMovedOn
	case err != nil:
		l.failures.WithLabelValues("terminate").Inc()
		l.logger.WarnContext(ctx, "a lifecycle termination failed; the next round tries again", "sandbox", d.id, "reason", reason, "err", err)
		return "", "", err
	}
	l.actions.WithLabelValues("terminate", reason, owner.Tier).Inc()
	return "terminate", reason, nil
}

// putOff moves the idle deadline of a running sandbox whose idle pause failed by
// retry, so that the next rounds take the other due actions first.
func (l *Lifecycle) putOff(ctx context.Context, id string, retry time.Duration) {
	if _, err := l.svc.db.Exec(ctx, `UPDATE sandboxes SET idle_at = now() + make_interval(secs => $2)
		WHERE id = $1 AND state = 'running' AND idle_at <= now()`, id, retry.Seconds()); err != nil {
		l.logger.WarnContext(ctx, "put off a failed idle pause", "sandbox", id, "err", err)
	}
}

// catchUp gives every live sandbox the deadlines its owner's lifecycle sets and it
// lacks: a sandbox made before the lifecycle existed, or by an older release during a
// rolling upgrade, or before its owner's tier had the limit. Each such deadline counts
// from now, not from the sandbox's creation or last activity: a limit added to a
// fleet ends nothing at once, it gives every sandbox a full lifetime, idle timeout or
// retention from the moment it is noticed (docs/lifecycle.md). A deadline already set
// is never moved. It returns how many sandboxes it changed.
func (l *Lifecycle) catchUp(ctx context.Context) (int, error) {
	rows, err := l.svc.db.Query(ctx, `SELECT DISTINCT client FROM sandboxes
		WHERE (state = 'running' AND (expires_at IS NULL OR idle_at IS NULL))
			OR (state = 'paused' AND (expires_at IS NULL OR retain_until IS NULL))`)
	if err != nil {
		return 0, fmt.Errorf("find sandboxes without deadlines: %w", err)
	}
	var owners []string
	for rows.Next() {
		var o string
		if err := rows.Scan(&o); err != nil {
			rows.Close()
			return 0, fmt.Errorf("find sandboxes without deadlines: %w", err)
		}
		owners = append(owners, o)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("find sandboxes without deadlines: %w", err)
	}
	total := 0
	for _, o := range owners {
		lc := l.opts.Resolve(ctx, space.ClientID(o)).Lifecycle
		if lc.MaxLifetime <= 0 && lc.IdleTimeout <= 0 && lc.PausedRetention <= 0 {
			continue // nothing to set: the sandboxes of an owner without limits live on
		}
		tag, err := l.svc.db.Exec(ctx, `UPDATE sandboxes SET
				expires_at = CASE WHEN expires_at IS NULL AND $2::float8 > 0 THEN now() + make_interval(secs => $2) ELSE expires_at END,
				idle_action = CASE WHEN state = 'running' AND idle_at IS NULL AND $3::float8 > 0 THEN nullif($4::text, '') ELSE idle_action END,
				idle_at = CASE WHEN state = 'running' AND idle_at IS NULL AND $3::float8 > 0 THEN now() + make_interval(secs => $3) ELSE idle_at END,
				retain_until = CASE WHEN state = 'paused' AND retain_until IS NULL AND $5::float8 > 0 THEN now() + make_interval(secs => $5) ELSE retain_until END,
				updated_at = now()
			WHERE client = $1 AND (
				(expires_at IS NULL AND $2::float8 > 0 AND state IN ('running', 'paused'))
				OR (state = 'running' AND idle_at IS NULL AND $3::float8 > 0)
				OR (state = 'paused' AND retain_until IS NULL AND $5::float8 > 0))`,
			o, lc.MaxLifetime.Seconds(), lc.IdleTimeout.Seconds(), string(idleAction(lc)), lc.PausedRetention.Seconds())
		if err != nil {
			return total, fmt.Errorf("set the deadlines of %s's sandboxes: %w", o, err)
		}
		total += int(tag.RowsAffected())
	}
	if total > 0 {
		l.caughtUp.Add(float64(total))
		l.logger.InfoContext(ctx, "gave live sandboxes the lifecycle deadlines they lacked, counted from now", "sandboxes", total, "owners", len(owners))
	}
	return total, nil
}
