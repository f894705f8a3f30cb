package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/pool"
	"github.com/space-sandbox/space/internal/store"
	"github.com/space-sandbox/space/internal/substrate"
)

// activation is what differs between the two kinds of activation, a create (creation,
// create.go) and a restore (restoration, below), in the steps activate runs for both.
type activation interface {
	// kind is the activation's label in metrics and messages: "create" or "restore".
	kind() string
	// transient is the state book puts the sandbox in (starting, restoring): every
	// later write is guarded on it, so that an activation that finds its sandbox moved
	// on (deleted meanwhile, or settled by the reconciler) writes nothing over it.
	transient() space.SandboxState
	// abandonable is true when only this activation's answer can ever tell a client of
	// the sandbox (an unanswered create without an idempotency key): if the caller is
	// gone by the time it is ready, it is stopped and failed rather than left running
	// at its cost, holding a live place nobody will free.
	abandonable() bool
	// book, in one transaction, checks the live cap, creates the sandbox's row or
	// moves it into its transient state, and claims a ready warm slot of exactly its
	// shape and template version, unless the substrate cannot start this kind in one
	// (a restore without substrate.WarmRestorer: a slot would only be burnt). It
	// returns the sandbox with the template it runs and the slot, nil on a miss; its
	// error aborts the activation with nothing booked.
	book(ctx context.Context, caller space.Caller) (*space.Sandbox, substrate.Template, *pool.Slot, error)
	// placed waits for the activation's concurrency place when it is being taken
	// alongside the booking (a create's, takePlace), and returns its refusal;
	// nil at once otherwise.
	placed() error
	// undo takes the booking back when the charge is refused (429, 503).
	undo(ctx context.Context, sb *space.Sandbox) error
	// start runs the sandbox on the substrate: in the adopted warm slot slotRef, or
	// cold when it is empty.
	start(ctx context.Context, spec substrate.Spec, slotRef string) (string, error)
	// failed records a substrate failure.
	failed(ctx context.Context, sb *space.Sandbox, err error) error
}

// activate runs what every activation does, in this order:
//
//   - book, in one transaction (so that a refused activation leaves no trace and a
//     crash loses nothing): the live-sandbox cap, checked under the budget key's
//     advisory lock, then the sandbox's row, then a claim of a ready warm slot of
//     exactly its shape and template version (a new create's in one round trip,
//     bookNew; the others' in bookTx); a key found at its cap within the last second
//     is counted first, without the lock, and refused with no booking while the count
//     finds it there (liveCaps);
//   - a warm hit is adopted and charges no bucket; a slot that cannot be adopted is
//     discarded and the activation goes on cold, as if the pool had missed;
//   - charge the template's cost from both activation buckets or neither: a refusal
//     (429, or 503 failing closed) takes the booking back;
//   - cold start, detached from the caller: the tokens are spent either way;
//   - finish: record the sandbox running (and answered).
func (s *Service) activate(ctx context.Context, caller space.Caller, a activation) (*space.Sandbox, error) {
	began := s.opts.Now()
	// The caller's own context tells, at the end, whether anyone is still waiting for
	// the answer; the work itself runs detached from it.
	callerCtx := ctx
	// A caller already gone books nothing. A booking once sent is read to its
	// end whether or not the caller still waits: cut short, it could commit unseen
	// and leave a starting row that nothing starts, for the reconciler to fail.
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// A key this replica just found at its live cap is counted first, and refused
	// without a booking while the count still finds it there.
	if err := s.liveCaps.refuse(ctx, caller); err != nil {
		took := s.opts.Now().Sub(began)
		s.metrics.step(a.kind(), stepBook, took)
		s.metrics.refused(a.kind(), err, took)
		return nil, err
	}
	// From the booking on, the activation runs to its end even if the caller
	// hangs up, so that no sandbox is left half made. The substrate's own timeout
	// bounds it, and the reconciler settles the sandbox after that bound should this
	// replica die.
	ctx, cancel := s.detached(ctx)
	defer cancel()
	sb, tmpl, slot, err := a.book(ctx, caller)
	booked := s.opts.Now().Sub(began)
	s.metrics.step(a.kind(), stepBook, booked)
	if err != nil {
		s.liveCaps.booked(caller, err)
		s.metrics.refused(a.kind(), err, booked)
		return nil, err
	}
	if err := a.placed(); err != nil {
		// The concurrency place taken alongside the booking was refused (or could
		// not be decided, failing closed): nothing has started, and the booking is
		// taken back. A slot claimed although the pool view knew none ready is
		// discarded, as one that failed adoption is: the replenisher replaces it.
		if slot != nil {
			s.opts.Pool.Discard(ctx, slot)
		}
		// Not counted as an activation: a create refused its place before it is
		// booked is not either.
		if uerr := a.undo(ctx, sb); uerr != nil {
			s.logger.ErrorContext(ctx, "undo activation refused its place", "sandbox", sb.ID, "err", uerr)
		}
		return nil, err
	}

	spec := substrate.Spec{SandboxID: sb.ID, Client: sb.Client, Shape: sb.Shape, Template: tmpl}

	if slot != nil {
		s.opts.OnClaim()
		startBegan := s.opts.Now()
		ref, err := startIdle(ctx, a, spec, slot.Ref)
		s.metrics.step(a.kind(), stepStart, s.opts.Now().Sub(startBegan))
		if err == nil {
			if cerr := s.opts.Pool.Consume(ctx, slot); cerr != nil {
				s.logger.WarnContext(ctx, "consume adopted slot", "slot", slot.ID, "err", cerr)
			}
			return s.finish(ctx, callerCtx, caller, a, sb, ref, true, false, began)
		}
		s.logger.WarnContext(ctx, "warm slot adoption failed; starting cold", "sandbox", sb.ID, "slot", slot.ID, "err", err)
		s.opts.Pool.Discard(ctx, slot)
	}

	chargeBegan := s.opts.Now()
	charged, err := s.opts.Charger.Charge(ctx, caller.Charge(tmpl.ActivationCost()))
	s.metrics.step(a.kind(), stepCharge, s.opts.Now().Sub(chargeBegan))
	if err != nil {
		if uerr := a.undo(ctx, sb); uerr != nil {
			s.logger.ErrorContext(ctx, "undo refused activation", "sandbox", sb.ID, "err", uerr)
		}
		s.metrics.refused(a.kind(), err, s.opts.Now().Sub(began))
		return nil, err
	}
	spec.SoftBreach = charged.SoftBreach

	coldBegan := s.opts.Now()
	ref, err := startIdle(ctx, a, spec, "")
	s.metrics.step(a.kind(), stepStart, s.opts.Now().Sub(coldBegan))
	if space.ErrorCode(err) == space.EUNPROCESSABLE {
		// The substrate refused what it was asked to run (the API server's validation
		// of a template's pod): no retry can serve it, so it is the caller's 422 and
		// the booking is taken back, as for any other 422. The substrate has
		// already removed what it made; the tokens stay spent.
		if uerr := a.undo(ctx, sb); uerr != nil {
			s.logger.ErrorContext(ctx, "undo refused activation", "sandbox", sb.ID, "err", uerr)
		}
		s.metrics.refused(a.kind(), err, s.opts.Now().Sub(began))
		return nil, err
	}
	if err != nil {
		s.metrics.activation(a.kind(), "failed", s.opts.Now().Sub(began))
		s.logger.WarnContext(ctx, "cold start failed", "kind", a.kind(), "sandbox", sb.ID, "err", err)
		ferr := a.failed(ctx, sb, err)
		var moved *movedError
		if errors.As(ferr, &moved) {
			return nil, movedOn(sb.ID, moved.cur.State, a.transient())
		}
		if ferr != nil {
			s.logger.ErrorContext(ctx, "record failed activation", "sandbox", sb.ID, "err", ferr)
		}
		return nil, &space.Error{Code: space.EUNAVAILABLE, Err: err,
			Message: fmt.Sprintf("the substrate failed to %s sandbox %s; see GET /v1/sandboxes/%s", activateVerb(a.kind()), sb.ID, sb.ID)}
	}
	s.metrics.coldStart.WithLabelValues(a.kind()).Observe(s.opts.Now().Sub(coldBegan).Seconds())
	return s.finish(ctx, callerCtx, caller, a, sb, ref, false, spec.SoftBreach, began)
}

// idleAfter is how long a start on the substrate runs before the activation counts
// as waiting (space.Idle): a start that takes longer waits on the API server and the
// kubelet, at no cost to this replica, and the request's seat of the overload gate
// goes to the next in turn meanwhile; the finish after it is one write. A start that
// returns sooner (the simulated substrate's, an adoption) keeps the seat: given back
// at once, it let one more request work beside the finish, and a quiet client's p99
// beside a 5×C flood rose a fifth (docs/benchmarks.md, "Seats as many as the pool's
// connections").
const idleAfter = 10 * time.Millisecond

// startIdle is a.start, calling space.Idle on ctx once it has run idleAfter.
func startIdle(ctx context.Context, a activation, spec substrate.Spec, slotRef string) (string, error) {
	t := time.AfterFunc(idleAfter, func() { space.Idle(ctx) })
	defer t.Stop()
	return a.start(ctx, spec, slotRef)
}

// bookTx is an activation's booking in a transaction, for one whose row must be
// read before it is moved (a restore, a retried create): the live cap, then move (the
// row's own step, which returns the sandbox and its template), then the warm claim
// when warm is true.
func (s *Service) bookTx(ctx context.Context, caller space.Caller, warm bool,
	move func(tx pgx.Tx) (*space.Sandbox, substrate.Template, error)) (sb *space.Sandbox, tmpl substrate.Template, slot *pool.Slot, err error) {
	err = s.db.Tx(ctx, func(tx pgx.Tx) error {
		if err := checkLiveCap(ctx, tx, caller.Key, caller.LiveSandboxes); err != nil {
			return err
		}
		var err error
		if sb, tmpl, err = move(tx); err != nil || !warm {
			return err
		}
		slot, err = s.opts.Pool.Claim(ctx, tx, sb.Shape, tmpl.Version, sb.ID)
		return err
	})
	return sb, tmpl, slot, err
}

// bookNew is a new create's booking in one round trip, one transaction (a
// batch with no BEGIN runs as one): under a live cap the budget key's lock, then the
// row, inserted only under the cap; then the warm claim, which claims nothing for a
// row that was not made. One round trip where bookTx takes four (begin, row,
// claim, commit) or, under a cap, five (and the lock and count), each of which on a
// busy machine waits its turn on the cores as well as on the network.
func (s *Service) bookNew(ctx context.Context, caller space.Caller, sb *space.Sandbox, tmpl substrate.Template) (*pool.Slot, error) {
	b := &pgx.Batch{}
	var capped bool
	if err := queueInsert(b, sb, caller.Lifecycle, caller.LiveSandboxes, &capped); err != nil {
		return nil, err
	}
	claim := s.opts.Pool.QueueClaim(b, sb.Shape, tmpl.Version, sb.ID)
	if err := s.db.Batch(ctx, b); err != nil {
		return nil, err
	}
	if capped {
		return nil, liveCapError(caller.Key, caller.LiveSandboxes)
	}
	return claim.Slot(), nil
}

// finish records a started sandbox as running and answered, provided it is still in the
// transitional state this activation put it in. When it is not, its owner deleted it
// meanwhile (or the reconciler settled it after this replica stalled past the bound):
// nothing owns what was just started, so it is stopped, unless the reconciler already
// recorded that very resource as the sandbox's.
//
// An abandonable sandbox whose caller has gone (callerCtx is done: the connection
// closed) is stopped and failed instead: no answer can reach anyone, and no key can
// claim it later. A caller that leaves after this check, or whose connection breaks
// while the 201 is written, has a running sandbox it was not told of: it finds it by
// listing its sandboxes, or avoids the question with an Idempotency-Key. A write whose
// outcome Postgres leaves unknown is sent again (writeRunning), and one that stays
// unknown leaves no answered create nobody was told of (unanswer). It is observed as
// the activation's finish step, whatever its outcome.
func (s *Service) finish(ctx, callerCtx context.Context, caller space.Caller, a activation, sb *space.Sandbox, ref string, warm, softBreach bool, began time.Time) (*space.Sandbox, error) {
	finishBegan := s.opts.Now()
	defer func() { s.metrics.step(a.kind(), stepFinish, s.opts.Now().Sub(finishBegan)) }()
	outcome := "cold"
	if warm {
		outcome = "warm"
	}
	if a.abandonable() && callerCtx.Err() != nil {
		return nil, s.abandon(ctx, a, sb, ref, began)
	}
	// Answered only while the caller still waits for the answer: a keyed create whose
	// caller has gone is its key's to claim, and when the key expires unclaimed the
	// reconciler ends it (docs/design.md, "Unanswered creates"). Marked answered here,
	// it would run at its client's cost for ever.
	// Its idle clock starts now that it runs, not when it was booked: a slow start
	// or restore does not eat the idle timeout.
	out, err := s.writeRunning(ctx, callerCtx, a.abandonable(), sb.ID, func() stateChange {
		return stateChange{State: space.StateRunning, SubstrateRef: ref, Warm: &warm, Answered: callerCtx.Err() == nil,
			SoftBreach: &softBreach, From: []space.SandboxState{a.transient()}, stamp: activity(caller.Lifecycle)}
	})
	var moved *movedError
	if !errors.As(err, &moved) {
		if err == nil {
			s.metrics.activation(a.kind(), outcome, s.opts.Now().Sub(began))
			return out, nil
		}
		// A write that failed (Postgres down) leaves the sandbox transitional with its
		// resource running: the reconciler settles it. One whose outcome stayed
		// unknown may have committed it running and answered, and this caller is told
		// 503: a create nobody else can claim must not stay answered, or it would run
		// at its client's cost with nobody told of it.
		if a.abandonable() && store.Unreachable(err) {
			s.unanswer(sb.ID, ref)
		}
		return nil, err
	}
	if moved.cur.State == space.StateRunning && moved.cur.SubstrateRef == ref {
		s.metrics.activation(a.kind(), outcome, s.opts.Now().Sub(began))
		return moved.cur, nil
	}
	if serr := s.opts.Substrate.Stop(ctx, ref); serr != nil {
		s.logger.ErrorContext(ctx, "stop what was started for a sandbox that moved on", "sandbox", sb.ID, "ref", ref, "err", serr)
	}
	s.metrics.activation(a.kind(), "failed", s.opts.Now().Sub(began))
	return nil, movedOn(sb.ID, moved.cur.State, a.transient())
}

const (
	// defaultOutcomeWait is Options.OutcomeWait's default.
	defaultOutcomeWait = 10 * time.Second
	// unanswerFor bounds how long unanswer keeps trying while Postgres stays away.
	unanswerFor = 10 * time.Minute
)

// writeRunning writes the change that records an activation's sandbox running. When
// Postgres goes away after the write was sent, its outcome is unknown: it may have
// committed with its reply lost. The write is then sent again, backing off from 50ms
// to 1s, until one is answered or Options.OutcomeWait passes. The write is guarded on
// the transitional state, so a second one either commits it or finds the first's
// commit (the sandbox running with this very resource, which finish takes for
// success): either way the caller is told what Postgres holds. An abandonable
// activation stops trying once its caller has left: no answer can reach anyone.
// change is called for each write, so that each says whether the caller still waits.
func (s *Service) writeRunning(ctx, callerCtx context.Context, abandonable bool, id string, change func() stateChange) (*space.Sandbox, error) {
	out, err := setState(ctx, s.db, id, change())
	if !store.Unreachable(err) {
		return out, err
	}
	s.logger.WarnContext(ctx, "postgres went away while recording a sandbox running; writing it again", "sandbox", id, "err", err)
	wctx, cancel := context.WithTimeout(ctx, s.opts.OutcomeWait)
	defer cancel()
	for backoff := 50 * time.Millisecond; ; backoff = min(2*backoff, time.Second) {
		if abandonable && callerCtx.Err() != nil {
			return nil, err
		}
		if !pause(wctx, backoff) {
			return nil, err
		}
		if out, err = setState(wctx, s.db, id, change()); !store.Unreachable(err) {
			return out, err
		}
	}
}

// unanswer makes sure that sandbox id, started as ref by a create nobody else can
// claim and whose recording the caller was not told of, is not left answered: once
// Postgres answers, the row is marked unanswered if it is running with ref (a write
// whose reply was lost committed it so), and the reconciler ends it as it ends every
// create no client was told of. A row still transitional is the reconciler's already.
// It runs detached, trying each second for at most unanswerFor: a replica that dies
// meanwhile leaves the row as the write left it (docs/design.md, "Unanswered creates").
func (s *Service) unanswer(id, ref string) {
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), unanswerFor)
		defer cancel()
		for {
			tag, err := s.db.Exec(ctx, `UPDATE sandboxes SET answered = false, updated_at = now()
				WHERE id = $1 AND state = 'running' AND substrate_ref = $2 AND answered`, id, ref)
			if err == nil {
				if tag.RowsAffected() > 0 {
					s.logger.WarnContext(ctx, "a sandbox recorded running while its caller was told 503 is marked unanswered, for the reconciler to end", "sandbox", id)
				}
				return
			}
			if !store.Unreachable(err) || !pause(ctx, time.Second) {
				s.logger.ErrorContext(ctx, "mark unanswered a sandbox whose caller was told 503", "sandbox", id, "err", err)
				return
			}
		}
	}()
}

// pause waits d, and reports false at once if ctx ends first: the wait between two
// tries of a write while Postgres is away.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// abandon ends the activation of an abandonable sandbox whose caller has gone: what was
// started is stopped and the sandbox failed, with the reason. Should the write fail,
// the reconciler ends the row the same way (it is unanswered and has no key).
func (s *Service) abandon(ctx context.Context, a activation, sb *space.Sandbox, ref string, began time.Time) error {
	if err := s.opts.Substrate.Stop(ctx, ref); err != nil {
		s.logger.ErrorContext(ctx, "stop the sandbox of a caller that left", "sandbox", sb.ID, "ref", ref, "err", err)
	}
	msg := "the request was not answered: its caller left before the sandbox was ready, and without an Idempotency-Key nobody could claim it, so it was stopped"
	if _, err := setState(ctx, s.db, sb.ID, stateChange{State: space.StateFailed, LastError: &msg, ClearRef: true, From: []space.SandboxState{a.transient()}}); ignoreMoved(err) != nil {
		s.logger.ErrorContext(ctx, "record the sandbox of a caller that left", "sandbox", sb.ID, "err", err)
	}
	s.metrics.unanswered.WithLabelValues(unansweredCallerGone).Inc()
	s.metrics.activation(a.kind(), "failed", s.opts.Now().Sub(began))
	s.logger.InfoContext(ctx, "stopped the sandbox of a create whose caller left before it was ready", "sandbox", sb.ID, "client", string(sb.Client))
	return &space.Error{Code: space.EUNAVAILABLE, Message: fmt.Sprintf("the caller went away before sandbox %s was ready; it was stopped", sb.ID)}
}

// movedOn is the error of an activation whose sandbox moved on while it ran.
func movedOn(id string, now, was space.SandboxState) error {
	return space.Errorf(space.ECONFLICT, "sandbox %s became %s while it was %s; nothing started for it is left running", id, now, was)
}

func activateVerb(kind string) string {
	if kind == "create" {
		return "start"
	}
	return kind
}

// Restore brings caller's paused sandbox id back: the same activation as a create,
// with the sandbox's own shape. A warm hit restores the snapshot into a claimed slot.
func (s *Service) Restore(ctx context.Context, caller space.Caller, id string) (*space.Sandbox, error) {
	if err := CheckID(id); err != nil {
		return nil, err
	}
	return s.activate(ctx, caller, &restoration{s: s, caller: caller, id: id})
}

// Wake is an implicit restore from ingress or the data plane: charged to the
// sandbox's owner (owner is the owner's Caller; see Owner), and a no-op for a sandbox
// that is already running or on its way.
func (s *Service) Wake(ctx context.Context, owner space.Caller, id string) (*space.Sandbox, error) {
	sb, err := s.Restore(ctx, owner, id)
	if space.ErrorCode(err) == space.ECONFLICT {
		cur, gerr := s.Get(ctx, owner.ID, id)
		if gerr == nil && (cur.State == space.StateRunning || cur.State == space.StateRestoring || cur.State == space.StateStarting) {
			return cur, nil
		}
	}
	return sb, err
}

// Owner returns the client that owns sandbox id: who a wake runs as.
func (s *Service) Owner(ctx context.Context, id string) (space.ClientID, error) {
	if err := CheckID(id); err != nil {
		return "", err
	}
	sb, err := getSandbox(ctx, s.db, id, "", false)
	if err != nil {
		return "", err
	}
	return sb.Client, nil
}

var restoring = []space.SandboxState{space.StateRestoring}

// restoration is a restore's part in the activation: a paused row moved to restoring,
// its snapshot started cold or into an adopted slot. A refused or failed restore
// leaves the sandbox paused with its snapshot, so that it can be restored again.
type restoration struct {
	s        *Service
	caller   space.Caller
	id       string
	snapshot string
}

func (r *restoration) kind() string                  { return "restore" }
func (r *restoration) transient() space.SandboxState { return space.StateRestoring }
func (r *restoration) abandonable() bool             { return false }

// book moves the paused sandbox to restoring under the restoring caller's budget
// key, and resolves its shape: a template removed or capped since it was paused is a
// 422, with the transaction (and so the move) rolled back.
func (r *restoration) book(ctx context.Context, caller space.Caller) (*space.Sandbox, substrate.Template, *pool.Slot, error) {
	return r.s.bookTx(ctx, caller, substrate.RestoresWarm(r.s.opts.Substrate), func(tx pgx.Tx) (*space.Sandbox, substrate.Template, error) {
		// A restore is an activity: the idle action is due its idle timeout from now.
		sb, err := transitionStamped(ctx, tx, r.id, r.caller.ID, space.StateRestoring, activity(r.caller.Lifecycle), space.StatePaused)
		if err != nil {
			return nil, substrate.Template{}, err
		}
		tmpl, err := r.s.resolve(r.caller, sb.Shape)
		if err != nil {
			return nil, tmpl, err
		}
		if err := setActivation(ctx, tx, sb, r.caller.Key, tmpl.Version); err != nil {
			return nil, tmpl, err
		}
		r.snapshot = sb.SnapshotRef
		return sb, tmpl, nil
	})
}

func (r *restoration) placed() error { return nil }

func (r *restoration) undo(ctx context.Context, sb *space.Sandbox) error {
	_, err := setState(ctx, r.s.db, sb.ID, stateChange{State: space.StatePaused, From: restoring})
	return ignoreMoved(err)
}

func (r *restoration) start(ctx context.Context, spec substrate.Spec, slotRef string) (string, error) {
	return r.s.opts.Substrate.Restore(ctx, r.snapshot, slotRef, spec)
}

func (r *restoration) failed(ctx context.Context, sb *space.Sandbox, err error) error {
	msg := err.Error()
	_, ferr := setState(ctx, r.s.db, sb.ID, stateChange{State: space.StatePaused, LastError: &msg, From: restoring})
	return ferr
}
