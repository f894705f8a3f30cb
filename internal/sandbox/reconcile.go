package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/metric"
	"github.com/space-sandbox/space/internal/store"
	"github.com/space-sandbox/space/internal/substrate"
)

const (
	// sweepEvery is how many rounds pass between two sweeps of the substrate's
	// resources when ReconcilerOptions.SweepEvery is zero (a list of every resource is
	// costlier than a query for stale rows).
	sweepEvery = 6
	// settleBatch bounds the sandboxes settled in one round.
	settleBatch = 200
)

// ReconcilerOptions configure a Reconciler.
type ReconcilerOptions struct {
	// Service is the flow whose sandboxes, pool and substrate are reconciled.
	Service *Service
	// Grace, added to the substrate's Timeout, is how long a sandbox may stay
	// starting, restoring or pausing before it is settled, and the age under which a
	// resource is never taken for an orphan (its row may not be visible yet) (required;
	// SPACE_RECONCILE_GRACE, 30s by default). No live replica keeps a sandbox
	// transitional longer than the substrate's timeout: its calls fail on their own by
	// then.
	Grace time.Duration
	// Interval between rounds (required; SPACE_RECONCILE_INTERVAL, 10s by default).
	Interval time.Duration
	// SweepEvery is how many rounds pass between two sweeps (default 6); the first
	// round sweeps.
	SweepEvery int
	// Also runs at the end of each round, under the same lock: the dispatcher's
	// SettleLost, and the purge of expired idempotency keys.
	Also       []func(ctx context.Context) (int, error)
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// Reconciler settles what crashes, outages and cut drains leave behind, so that no
// operator ever has to:
//
//   - a sandbox starting, restoring or pausing for longer than its operation could take
//     is settled from what the substrate holds for it (found by its id): running,
//     paused or failed with a reason, and what was half made is stopped;
//   - a create no client was answered for and none can claim (no live
//     Idempotency-Key names it) is failed and what runs for it stopped, whether its
//     replica died mid-create or its key expired after it was settled running;
//   - a pool slot row stuck warming or claimed is forgotten;
//   - a resource on the substrate that no row accounts for (a slot whose row is gone,
//     a sandbox that is terminated, failed or paused, a second resource of one sandbox)
//     is stopped;
//   - whatever Also settles or tidies (operations whose job ended without an
//     outcome, expired idempotency keys).
//
// A sandbox is settled by its guarded write first, and what ran for it is stopped
// after, in the same round: the write decides (a replica that finished meanwhile wins
// and keeps what it started), so its end can be read while the stops are under way,
// and a stop that fails is left to the sweep.
//
// It runs on one replica at a time: a round runs under a Postgres advisory lock, and a
// replica that cannot take it skips its round, as the replenisher does.
//
// The bound: a sandbox left transitional by a crash is settled at most Bound() after
// it was last changed, plus one Interval.
type Reconciler struct {
	opts   ReconcilerOptions
	svc    *Service
	logger *slog.Logger
	rounds int
	// suspects are the resources the last sweep found no row for, with what it found
	// of them: one is stopped only when the next sweep finds it so again, unchanged. A
	// list and the queries after it are not one snapshot: a slot adopted between the
	// two reads as an orphan once, never twice.
	suspects map[string]substrate.Resource
	settled  *prometheus.CounterVec
	orphans  *prometheus.CounterVec
}

// ReconcileResult says what one round did.
type ReconcileResult struct {
	// Leader is false when another replica holds the lock and this round did nothing.
	Leader bool
	// Settled counts the sandboxes settled, by the state they were settled in.
	Settled map[space.SandboxState]int
	// SlotsReaped counts the slot rows forgotten; Orphans the resources stopped.
	SlotsReaped int64
	Orphans     int
	// Swept is true when the round listed the substrate's resources.
	Swept bool
	// Also counts what the Also functions settled or tidied.
	Also int
}

// NewReconciler returns a Reconciler, or an error naming the option that is missing.
func NewReconciler(opts ReconcilerOptions) (*Reconciler, error) {
	switch {
	case opts.Grace <= 0:
		return nil, fmt.Errorf("reconciler: Grace must be positive, got %s", opts.Grace)
	case opts.Interval <= 0:
		return nil, fmt.Errorf("reconciler: Interval must be positive, got %s", opts.Interval)
	}
	if opts.SweepEvery <= 0 {
		opts.SweepEvery = sweepEvery
	}
	r := &Reconciler{opts: opts, svc: opts.Service, logger: opts.Logger}
	if r.logger == nil {
		r.logger = slog.New(slog.DiscardHandler)
	}
	r.settled = metric.Register(opts.Registerer, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "space_reconciler_settled_total",
		Help: "Sandboxes left starting, restoring or pausing past the bound (or running, never answered, with their Idempotency-Key expired) and settled by the reconciler, by the state they were in and the one they were settled in.",
	}, []string{"from", "to"}))
	r.orphans = metric.Register(opts.Registerer, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "space_reconciler_orphans_stopped_total",
		Help: "Substrate resources no row accounted for, stopped by the reconciler, by kind (sandbox, slot).",
	}, []string{"kind"}))
	for _, k := range []string{"sandbox", "slot"} {
		r.orphans.WithLabelValues(k)
	}
	// Every settlement verdict can reach (see verdict), at 0 from the start.
	for from, tos := range map[space.SandboxState][]space.SandboxState{
		space.StateRunning:   {space.StateFailed},
		space.StateStarting:  {space.StateRunning, space.StateFailed},
		space.StateRestoring: {space.StateRunning, space.StatePaused},
		space.StatePausing:   {space.StateRunning, space.StatePaused, space.StateFailed},
	} {
		for _, to := range tos {
			r.settled.WithLabelValues(string(from), string(to))
		}
	}
	return r, nil
}

// Bound is how long a sandbox may stay transitional before it is settled: the
// substrate's timeout plus the grace.
func (r *Reconciler) Bound() time.Duration {
	return r.svc.opts.Substrate.Timeout() + r.opts.Grace
}

// Run reconciles every Interval until ctx ends. onRound, when not nil, is told each
// round's result: tests wait on it instead of sleeping.
func (r *Reconciler) Run(ctx context.Context, onRound func(ReconcileResult, error)) {
	everyRound(ctx, r.opts.Interval, r.Round, onRound, r.logger, "reconcile round failed")
}

// Round runs one reconciling pass if this replica can take the lock. Every
// SweepEvery-th round, and the first, also sweeps the substrate for orphans.
func (r *Reconciler) Round(ctx context.Context) (ReconcileResult, error) {
	res := ReconcileResult{Settled: map[space.SandboxState]int{}}
	leader, err := store.WhileLocked(ctx, r.svc.db.Pool(), store.ReconcileLockID, func(ctx context.Context) error {
		var errs []error
		errs = append(errs, r.settle(ctx, &res))
		n, err := r.svc.opts.Pool.ReapStale(ctx, r.Bound())
		res.SlotsReaped = n
		errs = append(errs, err)
		if r.rounds%r.opts.SweepEvery == 0 {
			res.Swept = true
			errs = append(errs, r.sweep(ctx, &res))
		}
		r.rounds++
		for _, f := range r.opts.Also {
			n, err := f(ctx)
			res.Also += n
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	})
	res.Leader = leader
	if err != nil {
		return res, fmt.Errorf("reconcile: %w", err)
	}
	return res, nil
}

// claimableSQL is true for a sandbox some client can still be answered with: it was
// answered already, or a live Idempotency-Key names it, for its create's retry.
const claimableSQL = `(answered OR EXISTS (SELECT 1 FROM idempotency_keys k WHERE k.sandbox_id = sandboxes.id AND k.expires_at > now()))`

// stale is a sandbox the reconciler found to settle, and whether a client can still
// claim it (claimableSQL).
type stale struct {
	sb        *space.Sandbox
	claimable bool
}

// findStale runs query, which selects sandboxColumns then claimableSQL.
func (r *Reconciler) findStale(ctx context.Context, query string, args ...any) ([]stale, error) {
	rows, err := r.svc.db.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []stale
	for rows.Next() {
		var st stale
		if st.sb, err = scanSandbox(rows, &st.claimable); err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	return out, rows.Err()
}

// settle settles the sandboxes transitional for longer than Bound, and ends the
// unanswered ones whose key expired unclaimed.
func (r *Reconciler) settle(ctx context.Context, res *ReconcileResult) error {
	found, err := r.findStale(ctx, "SELECT "+sandboxColumns+", "+claimableSQL+` FROM sandboxes
		WHERE state IN ('starting', 'restoring', 'pausing') AND updated_at < now() - make_interval(secs => $1)
		ORDER BY updated_at LIMIT $2`, r.Bound().Seconds(), settleBatch)
	if err != nil {
		return fmt.Errorf("find transitional sandboxes: %w", err)
	}
	// A create answered by nobody and kept for its key's retry was settled running
	// with its key live; once the key has expired, no retry can claim it any more.
	expired, err := r.findStale(ctx, "SELECT "+sandboxColumns+", "+claimableSQL+` FROM sandboxes
		WHERE NOT answered AND state = 'running' AND NOT `+claimableSQL+`
		ORDER BY updated_at LIMIT $1`, settleBatch)
	if err != nil {
		return fmt.Errorf("find unanswered sandboxes: %w", err)
	}
	var errs []error
	for _, st := range append(found, expired...) {
		to, err := r.settleOne(ctx, st)
		if err != nil {
			errs = append(errs, fmt.Errorf("settle sandbox %s: %w", st.sb.ID, err))
			continue
		}
		if to != "" {
			res.Settled[to]++
		}
	}
	return errors.Join(errs...)
}

// settleOne settles one sandbox from what the substrate holds for it, and returns the
// state it settled it in ("" when the sandbox moved on meanwhile).
func (r *Reconciler) settleOne(ctx context.Context, st stale) (space.SandboxState, error) {
	sb := st.sb
	sub := r.svc.opts.Substrate
	found, err := sub.Find(ctx, sb.ID)
	if err != nil {
		return "", err
	}
	v := verdict(sb, found, st.claimable, r.Bound())
	v.change.From = []space.SandboxState{sb.State}
	v.change.Seen = sb.UpdatedAt
	if _, err := setState(ctx, r.svc.db, sb.ID, v.change); err != nil {
		var moved *movedError
		if errors.As(err, &moved) {
			return "", nil // someone else settled it first
		}
		return "", err
	}
	r.settled.WithLabelValues(string(sb.State), string(v.change.State)).Inc()
	if v.unanswered != "" {
		r.svc.metrics.unanswered.WithLabelValues(v.unanswered).Inc()
	}
	r.logger.WarnContext(ctx, "settled a sandbox left transitional", "sandbox", sb.ID, "from", sb.State,
		"to", v.change.State, "since", sb.UpdatedAt, "resources", len(found.Resources), "stopping", len(v.stop))
	for _, ref := range v.stop {
		if err := sub.Stop(ctx, ref); err != nil {
			// The sweep tries again: the sandbox is settled, so the resource is an
			// orphan now.
			r.logger.WarnContext(ctx, "stop a half-made resource", "sandbox", sb.ID, "ref", ref, "err", err)
		}
	}
	return v.change.State, nil
}

// settlement is what the reconciler does to one sandbox: the change to record and the
// resources to stop, and, for an unanswered create it ends, why (a reason of
// space_sandbox_unanswered_total).
type settlement struct {
	change     stateChange
	stop       []string
	unanswered string
}

// verdict decides a transitional sandbox's settlement from what the substrate holds
// for it:
//
//   - starting: a ready resource makes it running (warm when it is an adopted slot);
//     otherwise it failed, with the reason.
//   - restoring: a ready resource makes it running; otherwise it is paused again, its
//     snapshot intact, with the reason.
//   - pausing: a ready resource means the pause did not happen, it is running; else
//     the snapshot, when one is found, makes it paused; otherwise it failed.
//
// Every resource but the one kept is stopped: a second start of one sandbox, or one
// half made.
//
// A create that no client can claim (not claimable: never answered, and no live
// Idempotency-Key names it) is ended failed whatever runs for it, and everything is
// stopped: nobody was told of it, so nobody would ever use it or free its live place.
// It is found starting (its replica died, or Postgres failed the write that would
// have answered it) or, when its key expired unclaimed, running.
func verdict(sb *space.Sandbox, found substrate.Finding, claimable bool, bound time.Duration) settlement {
	var v settlement
	if !claimable && (sb.State == space.StateStarting || sb.State == space.StateRunning) {
		for _, res := range found.Resources {
			v.stop = append(v.stop, res.Ref)
		}
		if sb.SubstrateRef != "" && !slices.Contains(v.stop, sb.SubstrateRef) {
			v.stop = append(v.stop, sb.SubstrateRef)
		}
		v.stop = append(v.stop, storageOf(found)...)
		msg := "settled by the reconciler: the request was not answered: no client was told of this sandbox and no Idempotency-Key can claim it, so it failed and what ran for it is stopped"
		v.unanswered = unansweredNoKey
		if sb.State == space.StateRunning {
			msg = "settled by the reconciler: the request was not answered and its Idempotency-Key expired unclaimed, so it failed and what ran for it is stopped"
			v.unanswered = unansweredKeyExpired
		}
		v.change = stateChange{State: space.StateFailed, ClearRef: true, LastError: &msg}
		return v
	}
	ready, isReady := found.Ready()
	for _, res := range found.Resources {
		if !isReady || res.Ref != ready.Ref {
			v.stop = append(v.stop, res.Ref)
		}
	}
	why := func(what string) *string {
		msg := fmt.Sprintf("settled by the reconciler: the sandbox was still %s %s after it was last changed "+
			"(its replica stopped, or the substrate did not answer in time); %s", sb.State, bound.Round(time.Second), what)
		return &msg
	}
	switch {
	case isReady:
		// What runs says whether its activation was a soft breach (its Pod's label):
		// the row follows it, set or cleared, as the activation's finish would have.
		warm, breach := ready.SlotID != "", ready.SoftBreach
		v.change = stateChange{State: space.StateRunning, SubstrateRef: ready.Ref, Warm: &warm, SoftBreach: &breach}
		if sb.State == space.StatePausing {
			v.change.LastError = why("the substrate still runs it, so it is running and was not paused")
		}
	case sb.State == space.StateRestoring:
		v.change = stateChange{State: space.StatePaused, ClearRef: true,
			LastError: why("nothing ready was found for it, so it is paused again with its snapshot; restore it again")}
	case sb.State == space.StatePausing && found.Snapshot != "":
		v.change = stateChange{State: space.StatePaused, ClearRef: true, SnapshotRef: found.Snapshot,
			LastError: why("its snapshot was found, so it is paused")}
	case sb.State == space.StatePausing:
		v.change = stateChange{State: space.StateFailed, ClearRef: true,
			LastError: why("neither it nor a snapshot of it was found, so it failed")}
	default: // starting
		v.change = stateChange{State: space.StateFailed, ClearRef: true,
			LastError: why("nothing ready was found for it, so it failed; what was half made is stopped")}
	}
	if v.change.State == space.StateFailed {
		v.stop = append(v.stop, storageOf(found)...)
	}
	return v
}

// storageOf is what keeps a sandbox's state (its volume claim, its snapshots): a
// sandbox settled failed has nothing to restore, so it goes with the rest, now rather
// than at the sweep after next.
func storageOf(found substrate.Finding) []string {
	var refs []string
	for _, r := range found.Storage {
		refs = append(refs, r.Ref)
	}
	return refs
}

// sweep stops every resource of the substrate, older than the grace, that no row
// accounts for in two sweeps in a row.
func (r *Reconciler) sweep(ctx context.Context, res *ReconcileResult) error {
	sub := r.svc.opts.Substrate
	all, err := sub.List(ctx)
	if err != nil {
		return fmt.Errorf("sweep: %w", err)
	}
	cutoff := time.Now().Add(-r.opts.Grace)
	var old []substrate.Resource
	var sandboxIDs, slotIDs []string
	for _, res := range all {
		if res.Created.After(cutoff) {
			continue
		}
		old = append(old, res)
		if validID(res.SandboxID) {
			sandboxIDs = append(sandboxIDs, res.SandboxID)
		}
		if _, err := uuid.Parse(res.SlotID); err == nil {
			slotIDs = append(slotIDs, res.SlotID)
		}
	}
	if len(old) == 0 {
		r.suspects = nil
		return nil
	}
	owners, err := sandboxOwnership(ctx, r.svc.db, sandboxIDs)
	if err != nil {
		return fmt.Errorf("sweep: %w", err)
	}
	slots, err := r.svc.opts.Pool.Slots(ctx, slotIDs)
	if err != nil {
		return fmt.Errorf("sweep: %w", err)
	}
	var errs []error
	suspects := map[string]substrate.Resource{}
	for _, rs := range old {
		kind, owned := "slot", false
		switch {
		case rs.SandboxID != "" && rs.Storage:
			// A sandbox's volume or snapshot is its state, paused or not: it goes
			// only with a sandbox that ended.
			kind = "sandbox"
			row, ok := owners[rs.SandboxID]
			owned = ok && row.state != space.StateTerminated && row.state != space.StateFailed
		case rs.SandboxID != "":
			kind = "sandbox"
			row, ok := owners[rs.SandboxID]
			owned = ok && (row.state == space.StateStarting || row.state == space.StateRestoring || row.state == space.StatePausing ||
				row.state == space.StateRunning && row.ref == rs.Ref)
		case rs.SlotID != "":
			owned = slots[rs.SlotID]
		}
		if owned {
			continue
		}
		if prev, ok := r.suspects[rs.Ref]; !ok || prev != rs {
			suspects[rs.Ref] = rs // stopped next sweep if it is still an orphan then
			continue
		}
		if err := sub.Stop(ctx, rs.Ref); err != nil {
			errs = append(errs, fmt.Errorf("stop orphan %s: %w", rs.Ref, err))
			continue
		}
		res.Orphans++
		r.orphans.WithLabelValues(kind).Inc()
		r.logger.WarnContext(ctx, "stopped a resource no row accounts for", "ref", rs.Ref, "kind", kind,
			"sandbox", rs.SandboxID, "slot", rs.SlotID, "created", rs.Created)
	}
	r.suspects = suspects
	return errors.Join(errs...)
}

// Retained is the retention of ended sandboxes: a terminated or failed sandbox's row is
// deleted age after it ended (its updated_at), through the sandboxes_ended index.
// Whatever the substrate still holds for it is stopped at its end, and what a stop
// missed becomes an orphan for the sweep once the row is gone.
func Retained(age time.Duration) store.Retained {
	return store.Retained{Table: "sandboxes", Age: age,
		Due: `SELECT ctid FROM sandboxes WHERE state IN ('terminated', 'failed') AND updated_at < now() - make_interval(secs => $1)
			ORDER BY updated_at LIMIT $2`}
}
