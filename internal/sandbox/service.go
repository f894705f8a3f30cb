// Package sandbox is the create/restore/pause/wake flow that the HTTP API and the
// dispatcher share (DESIGN.md §2). Its one rule is the order of the steps of an
// activation: live-sandbox cap, then the warm pool, then cold shape resolution, then
// the admission charge, then the cold start — so that a warm hit never costs budget and
// a request that cannot be served never spends a token.
package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/pool"
	"github.com/space-sandbox/space/internal/store"
	"github.com/space-sandbox/space/internal/substrate"
)

// Charger charges one activation to the cluster bucket and, when rate is not nil, to
// client's bucket, both or neither (internal/admission). A *space.LimitError means a
// bucket was empty and nothing was charged.
type Charger interface {
	Charge(ctx context.Context, client space.ClientKey, rate *space.Rate) error
}

// Refuser is a Charger that can also tell, without charging anything, that a charge
// would be refused now (internal/admission's Admitter.Refused). With it the Service
// answers a create of a client whose charges it has just seen refused without
// reserving and undoing a sandbox row first (see refuseEarly).
type Refuser interface {
	// Refuse returns the *space.LimitError that a Charge now would return, counted as
	// that Charge would count it; nil when the charge would not be refused or when it
	// cannot tell (a Redis error, shadow mode): the caller then charges as usual.
	Refuse(ctx context.Context, client space.ClientKey, rate *space.Rate) *space.LimitError
}

// Options configure a Service.
type Options struct {
	DB        *pgxpool.Pool
	Pool      *pool.Pool
	Substrate substrate.Substrate
	Charger   Charger
	Catalog   Catalog
	// OnClaim is called after a warm slot is claimed, e.g. to kick the replenisher.
	OnClaim func()
	// StartTimeout bounds a substrate call that runs after the request's own context
	// is detached (default 5m): a client that hangs up mid cold start does not abort it,
	// since its token is spent either way.
	StartTimeout time.Duration
	Registerer   prometheus.Registerer
	Logger       *slog.Logger
}

// Service runs the flow.
type Service struct {
	opts   Options
	logger *slog.Logger
	starts *prometheus.CounterVec

	// refused remembers, per client key, until when this replica knows that the
	// client's charges fail: the refill time its last refused charge reported, counted
	// from before that charge was sent. It only chooses the path of the next create
	// (refuseEarly); the decision itself is always Redis's. Keys are bounded client
	// keys, so the map is bounded by the allowlist.
	refused sync.Map // space.ClientKey -> *atomic.Int64, nanoseconds since epoch
	epoch   time.Time
}

// New returns a Service.
func New(opts Options) *Service {
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 5 * time.Minute
	}
	if opts.OnClaim == nil {
		opts.OnClaim = func() {}
	}
	s := &Service{opts: opts, logger: opts.Logger, epoch: time.Now()}
	if s.logger == nil {
		s.logger = slog.New(slog.DiscardHandler)
	}
	s.starts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "space_sandbox_activations_total",
		Help: "Sandbox activations by kind (create, restore) and outcome (warm, cold, failed, rejected, unprocessable).",
	}, []string{"kind", "outcome"})
	if opts.Registerer != nil {
		opts.Registerer.MustRegister(s.starts)
	}
	return s
}

// CreateRequest is a create's body, validated.
type CreateRequest struct {
	// ID, when set, is the new sandbox's id instead of a random one. The dispatcher
	// fixes it when it accepts a queued create, so that every attempt of that one
	// request works on the same sandbox and a retry leaves no trail of failed ones.
	// With ID set, Create can be repeated (see Create).
	ID       string
	Shape    space.Shape
	Metadata map[string]string
}

// Create makes a new sandbox owned by caller.ID, capped and charged under caller.Key:
// DESIGN.md §2 steps 3 to 8.
//
// With req.ID set, a repeat of the same request is safe:
//   - no sandbox has that id yet: it is created with it;
//   - it is failed (an earlier attempt's cold start failed): the activation runs again
//     in that same row, which a refused retry (429, 422, 503) puts back to failed with
//     its error;
//   - it is starting: an attempt is in flight or was cut short mid cold start, and
//     nobody can tell which: ECONFLICT;
//   - any other state: an earlier attempt made it; it is returned as it is and nothing
//     is charged.
//
// An id of another client's sandbox is ECONFLICT.
func (s *Service) Create(ctx context.Context, caller space.Caller, req CreateRequest) (*space.Sandbox, error) {
	if err := ValidateCreate(req.Shape, req.Metadata); err != nil {
		return nil, err
	}
	id, retry := req.ID, false
	if id == "" {
		id = uuid.NewString()
	} else {
		cur, err := s.existing(ctx, caller.ID, id)
		switch {
		case err != nil:
			return nil, err
		case cur != nil && cur.State != space.StateFailed:
			return cur, nil
		}
		retry = cur != nil
	}
	sb := &space.Sandbox{
		ID:        id,
		Client:    caller.ID,
		BudgetKey: caller.Key,
		State:     space.StateStarting,
		Shape:     req.Shape,
		Metadata:  req.Metadata,
	}
	// A retry of a failed row takes the usual path, which also keeps that row's
	// history (its refused retries) as it always was.
	if !retry {
		if err := s.refuseEarly(ctx, caller, req.Shape); err != nil {
			s.count("create", err)
			return nil, err
		}
	}
	var failedWith string // a retried row's error, restored when the retry is refused
	return s.activate(ctx, caller, activation{
		kind: "create",
		reserve: func(ctx context.Context, tx pgx.Tx) (*space.Sandbox, error) {
			if retry {
				var err error
				failedWith, err = reviveSandbox(ctx, tx, sb)
				return sb, err
			}
			err := insertSandbox(ctx, tx, sb)
			if req.ID != "" && isUniqueViolation(err) {
				return nil, space.Errorf(space.ECONFLICT, "sandbox %s is being created by another attempt", id)
			}
			return sb, err
		},
		undo: func(ctx context.Context, sb *space.Sandbox, _ error) error {
			if retry {
				_, err := setState(ctx, s.opts.DB, sb.ID, stateChange{State: space.StateFailed, LastError: &failedWith})
				return err
			}
			return deleteSandbox(ctx, s.opts.DB, sb.ID)
		},
		start: func(ctx context.Context, sb *space.Sandbox, spec substrate.Spec, slot *pool.Slot) (string, error) {
			if slot != nil {
				return s.opts.Substrate.Adopt(ctx, slot.Ref, spec)
			}
			return s.opts.Substrate.StartCold(ctx, spec)
		},
		failed: func(ctx context.Context, sb *space.Sandbox, err error) (*space.Sandbox, error) {
			msg := err.Error()
			return setState(ctx, s.opts.DB, sb.ID, stateChange{State: space.StateFailed, LastError: &msg})
		},
	})
}

// existing returns client's sandbox id when a create with a fixed id finds one to
// return or to retry into, nil when there is none yet, and ECONFLICT when the id is
// another client's or the sandbox is starting.
func (s *Service) existing(ctx context.Context, client space.ClientID, id string) (*space.Sandbox, error) {
	if err := CheckID(id); err != nil {
		return nil, err
	}
	cur, err := getSandbox(ctx, s.opts.DB, id, "", false)
	switch {
	case space.ErrorCode(err) == space.ENOTFOUND:
		return nil, nil
	case err != nil:
		return nil, store.Classify(err)
	case cur.Client != client:
		return nil, space.Errorf(space.ECONFLICT, "sandbox id %s is taken", id)
	case cur.State == space.StateStarting:
		return nil, space.Errorf(space.ECONFLICT, "sandbox %s is starting: another attempt of this create is in flight or was cut short", id)
	}
	return cur, nil
}

// CheckShape returns the EUNPROCESSABLE error that a cold start of shape would meet
// (DESIGN.md §2 step 6), or nil: for the dispatcher to refuse a never-servable create
// when it is queued rather than when it runs. Nothing is charged or reserved.
func (s *Service) CheckShape(shape space.Shape) error {
	_, err := s.opts.Catalog.Resolve(shape)
	return err
}

// Restore brings caller's paused sandbox id back: the same steps as Create with the
// sandbox's own shape. A warm hit restores the snapshot into a claimed slot.
func (s *Service) Restore(ctx context.Context, caller space.Caller, id string) (*space.Sandbox, error) {
	return s.restore(ctx, caller, id)
}

// Wake is an implicit restore from ingress or the data plane: charged to the
// sandbox's owner (owner is the owner's Caller; see Owner), and a no-op for a sandbox
// that is already running or on its way.
func (s *Service) Wake(ctx context.Context, owner space.Caller, id string) (*space.Sandbox, error) {
	sb, err := s.restore(ctx, owner, id)
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
	sb, err := getSandbox(ctx, s.opts.DB, id, "", false)
	if err != nil {
		return "", store.Classify(err)
	}
	return sb.Client, nil
}

func (s *Service) restore(ctx context.Context, caller space.Caller, id string) (*space.Sandbox, error) {
	if err := CheckID(id); err != nil {
		return nil, err
	}
	var snapshot string
	return s.activate(ctx, caller, activation{
		kind: "restore",
		reserve: func(ctx context.Context, tx pgx.Tx) (*space.Sandbox, error) {
			sb, err := transition(ctx, tx, id, caller.ID, space.StateRestoring, space.StatePaused)
			if err != nil {
				return nil, err
			}
			if err := setBudgetKey(ctx, tx, sb, caller.Key); err != nil {
				return nil, err
			}
			snapshot = sb.SnapshotRef
			return sb, nil
		},
		undo: func(ctx context.Context, sb *space.Sandbox, _ error) error {
			_, err := setState(ctx, s.opts.DB, sb.ID, stateChange{State: space.StatePaused})
			return err
		},
		start: func(ctx context.Context, sb *space.Sandbox, spec substrate.Spec, slot *pool.Slot) (string, error) {
			slotRef := ""
			if slot != nil {
				slotRef = slot.Ref
			}
			return s.opts.Substrate.Restore(ctx, snapshot, slotRef, spec)
		},
		// A failed restore leaves the sandbox paused with its snapshot, so it can be
		// restored again; the error says why.
		failed: func(ctx context.Context, sb *space.Sandbox, err error) (*space.Sandbox, error) {
			msg := err.Error()
			return setState(ctx, s.opts.DB, sb.ID, stateChange{State: space.StatePaused, LastError: &msg})
		},
	})
}

// activation is one kind of activation's part in the shared steps.
type activation struct {
	kind string
	// reserve creates or moves the sandbox into a live state inside the transaction
	// that checked the live cap; its error aborts the activation.
	reserve func(ctx context.Context, tx pgx.Tx) (*space.Sandbox, error)
	// undo takes the reservation back when the activation is refused (422, 429, 503).
	undo func(ctx context.Context, sb *space.Sandbox, cause error) error
	// start runs the sandbox on the substrate, in a claimed slot when slot is not nil.
	start func(ctx context.Context, sb *space.Sandbox, spec substrate.Spec, slot *pool.Slot) (string, error)
	// failed records a substrate failure and returns the sandbox as it now is.
	failed func(ctx context.Context, sb *space.Sandbox, err error) (*space.Sandbox, error)
}

// activate runs DESIGN.md §2 steps 4 to 8, in that order:
//
//  4. live-sandbox cap, checked atomically with the reservation (one transaction under
//     a per-client advisory lock, taken only when the client has a cap);
//  5. warm pool: claim a ready slot of exactly this shape in the same transaction and
//     adopt it — no bucket is charged;
//  6. resolve the cold shape — 422 and no bucket charged when it cannot be served;
//  7. charge admission, both buckets or neither — 429 (or 503 fail-closed);
//  8. cold start; a failure leaves the token spent.
func (s *Service) activate(ctx context.Context, caller space.Caller, a activation) (*space.Sandbox, error) {
	var sb *space.Sandbox
	var slot *pool.Slot
	err := pgx.BeginFunc(ctx, s.opts.DB, func(tx pgx.Tx) error {
		if err := checkLiveCap(ctx, tx, caller.Key, caller.LiveSandboxes); err != nil {
			return err
		}
		var err error
		if sb, err = a.reserve(ctx, tx); err != nil {
			return err
		}
		slot, err = s.opts.Pool.Claim(ctx, tx, sb.Shape, sb.ID)
		return err
	})
	if err != nil {
		s.count(a.kind, err)
		return nil, store.Classify(err)
	}

	// From here the sandbox exists: finish the activation even if the caller hangs up,
	// so that no sandbox is left half made.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.StartTimeout)
	defer cancel()
	spec := substrate.Spec{SandboxID: sb.ID, Client: sb.Client, Shape: sb.Shape}

	if slot != nil {
		s.opts.OnClaim()
		spec.Template = s.opts.Catalog.Templates[sb.Template]
		ref, err := a.start(ctx, sb, spec, slot)
		if err == nil {
			if cerr := s.opts.Pool.Consume(ctx, slot); cerr != nil {
				s.logger.WarnContext(ctx, "consume adopted slot", "slot", slot.ID, "err", cerr)
			}
			warm := true
			sb, err = setState(ctx, s.opts.DB, sb.ID, stateChange{State: space.StateRunning, SubstrateRef: ref, Warm: &warm})
			s.starts.WithLabelValues(a.kind, "warm").Inc()
			return sb, store.Classify(err)
		}
		// A slot that cannot be adopted is discarded and the activation goes on cold,
		// as if the pool had missed.
		s.logger.WarnContext(ctx, "warm slot adoption failed; starting cold", "sandbox", sb.ID, "slot", slot.ID, "err", err)
		s.opts.Pool.Discard(ctx, slot)
	}

	tmpl, err := s.opts.Catalog.Resolve(sb.Shape)
	if err == nil {
		sent := time.Now()
		err = s.opts.Charger.Charge(ctx, caller.Key, caller.ClientRate)
		s.noteCharge(caller.Key, sent, err)
	}
	if err != nil {
		if uerr := a.undo(ctx, sb, err); uerr != nil {
			s.logger.ErrorContext(ctx, "undo refused activation", "sandbox", sb.ID, "err", uerr)
		}
		s.count(a.kind, err)
		return nil, err
	}

	spec.Template = tmpl
	ref, err := a.start(ctx, sb, spec, nil)
	if err != nil {
		s.starts.WithLabelValues(a.kind, "failed").Inc()
		s.logger.WarnContext(ctx, "cold start failed", "kind", a.kind, "sandbox", sb.ID, "err", err)
		if _, ferr := a.failed(ctx, sb, err); ferr != nil {
			s.logger.ErrorContext(ctx, "record failed activation", "sandbox", sb.ID, "err", ferr)
		}
		return nil, &space.Error{Code: space.EUNAVAILABLE, Err: err,
			Message: fmt.Sprintf("the substrate failed to %s sandbox %s; see GET /v1/sandboxes/%s", activateVerb(a.kind), sb.ID, sb.ID)}
	}
	warm := false
	sb, err = setState(ctx, s.opts.DB, sb.ID, stateChange{State: space.StateRunning, SubstrateRef: ref, Warm: &warm})
	s.starts.WithLabelValues(a.kind, "cold").Inc()
	return sb, store.Classify(err)
}

// refuseEarly answers a create with the charge's refusal without reserving a
// sandbox row, when this replica has just seen the client's charges refused and the
// create would reach the charge: under a flood of creates from a client over its
// rate, the usual path reserves a row under the client's lock and deletes it again
// for every refused create (seven Postgres round trips, serialised per client),
// where this takes one read and one Redis call.
//
// It runs the steps of DESIGN.md §2 in their order, reading instead of reserving:
// the live cap and the warm pool (one round trip, no lock), the cold shape, then the
// Refuser's decision on Redis time. Only when each of them would let the create
// through to the charge and the charge is refused does it answer (the refusal it
// returns is that of the usual path, counted the same way); in every other case
// (over the cap, a ready slot, an unknown shape, a charge that would now pass, an
// error) it returns nil and the usual path decides, under the lock. A refusal
// answered here leaves nothing behind, as the usual path's undo would.
func (s *Service) refuseEarly(ctx context.Context, caller space.Caller, shape space.Shape) error {
	refuser, ok := s.opts.Charger.(Refuser)
	if !ok || !s.knownRefused(caller.Key) {
		return nil
	}
	if _, err := s.opts.Catalog.Resolve(shape); err != nil {
		return nil
	}
	if through, err := s.wouldReachCharge(ctx, caller, shape); err != nil || !through {
		return nil
	}
	sent := time.Now()
	le := refuser.Refuse(ctx, caller.Key, caller.ClientRate)
	if le == nil {
		s.noteCharge(caller.Key, sent, nil)
		return nil
	}
	s.noteCharge(caller.Key, sent, le)
	s.opts.Pool.CountMiss()
	return le
}

// wouldReachCharge reads, in one round trip and without the client's lock, whether a
// create of shape by caller would pass the live cap and miss the warm pool now.
func (s *Service) wouldReachCharge(ctx context.Context, caller space.Caller, shape space.Shape) (bool, error) {
	var b pgx.Batch
	var live int
	if caller.LiveSandboxes > 0 {
		queueLiveCount(&b, caller.Key, caller.LiveSandboxes, &live)
	}
	var ready bool
	s.opts.Pool.QueueReady(&b, shape, &ready)
	if err := s.opts.DB.SendBatch(ctx, &b).Close(); err != nil {
		return false, err
	}
	return !ready && (caller.LiveSandboxes <= 0 || live < caller.LiveSandboxes), nil
}

// maxRefusedFor bounds how long one refusal routes a client's creates to
// refuseEarly: a bucket that never refills reports a refill centuries away.
const maxRefusedFor = time.Hour

// noteCharge records a charge's outcome for refuseEarly: a refusal by an activation
// bucket marks the client refused until its refill time, counted from sent (before
// the charge was sent, so never later than Redis's own refill); anything else clears
// the mark.
func (s *Service) noteCharge(client space.ClientKey, sent time.Time, err error) {
	var le *space.LimitError
	refused := errors.As(err, &le) &&
		(le.Bucket == space.BucketClientActivation || le.Bucket == space.BucketClusterActivation)
	v, ok := s.refused.Load(client)
	if !refused {
		if ok {
			v.(*atomic.Int64).Store(0)
		}
		return
	}
	until := int64(sent.Sub(s.epoch) + min(le.RetryAfter, maxRefusedFor))
	if !ok {
		v, _ = s.refused.LoadOrStore(client, &atomic.Int64{})
	}
	v.(*atomic.Int64).Store(until)
}

// knownRefused reports whether client's charges are known to fail now.
func (s *Service) knownRefused(client space.ClientKey) bool {
	v, ok := s.refused.Load(client)
	return ok && int64(time.Since(s.epoch)) < v.(*atomic.Int64).Load()
}

func activateVerb(kind string) string {
	if kind == "create" {
		return "start"
	}
	return kind
}

func (s *Service) count(kind string, err error) {
	switch space.ErrorCode(err) {
	case space.ELIMITED:
		s.starts.WithLabelValues(kind, "rejected").Inc()
	case space.EUNPROCESSABLE:
		s.starts.WithLabelValues(kind, "unprocessable").Inc()
	}
}

// Pause snapshots caller's running sandbox and stops it; a paused sandbox no longer
// holds a live-sandbox place.
func (s *Service) Pause(ctx context.Context, client space.ClientID, id string) (*space.Sandbox, error) {
	if err := CheckID(id); err != nil {
		return nil, err
	}
	sb, err := transition(ctx, s.opts.DB, id, client, space.StatePausing, space.StateRunning)
	if err != nil {
		return nil, store.Classify(err)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.StartTimeout)
	defer cancel()
	snap, err := s.opts.Substrate.Snapshot(ctx, sb.SubstrateRef)
	if err != nil {
		msg := err.Error()
		if _, serr := setState(ctx, s.opts.DB, id, stateChange{State: space.StateRunning, LastError: &msg}); serr != nil {
			s.logger.ErrorContext(ctx, "record failed pause", "sandbox", id, "err", serr)
		}
		if errors.Is(err, substrate.ErrUnsupported) {
			return nil, &space.Error{Code: space.EUNPROCESSABLE, Message: "this substrate cannot snapshot sandboxes", Err: err}
		}
		return nil, &space.Error{Code: space.EUNAVAILABLE, Message: "the substrate failed to snapshot sandbox " + id + "; it is still running", Err: err}
	}
	sb, err = setState(ctx, s.opts.DB, id, stateChange{State: space.StatePaused, SnapshotRef: snap, ClearRef: true})
	return sb, store.Classify(err)
}

// Delete stops caller's sandbox and marks it terminated. A sandbox mid-transition
// (starting, pausing, restoring) cannot be deleted until it settles.
func (s *Service) Delete(ctx context.Context, client space.ClientID, id string) error {
	if err := CheckID(id); err != nil {
		return err
	}
	sb, err := getSandbox(ctx, s.opts.DB, id, client, false)
	if err != nil {
		return store.Classify(err)
	}
	if sb.State == space.StateTerminated {
		return nil
	}
	sb, err = transition(ctx, s.opts.DB, id, client, space.StateTerminated, space.StateRunning, space.StatePaused, space.StateFailed)
	if err != nil {
		return store.Classify(err)
	}
	if sb.SubstrateRef != "" {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.StartTimeout)
		defer cancel()
		if err := s.opts.Substrate.Stop(ctx, sb.SubstrateRef); err != nil {
			// The sandbox is terminated for its client; the substrate leak is logged
			// for an operator.
			s.logger.ErrorContext(ctx, "stop terminated sandbox", "sandbox", id, "ref", sb.SubstrateRef, "err", err)
		}
	}
	return nil
}

// Get returns caller's sandbox id; another client's is ENOTFOUND.
func (s *Service) Get(ctx context.Context, client space.ClientID, id string) (*space.Sandbox, error) {
	if err := CheckID(id); err != nil {
		return nil, err
	}
	sb, err := getSandbox(ctx, s.opts.DB, id, client, false)
	return sb, store.Classify(err)
}

// Page size bounds for List.
const (
	DefaultPageSize = 50
	MaxPageSize     = 500
)

// List returns one page of caller's sandboxes, newest first.
func (s *Service) List(ctx context.Context, client space.ClientID, limit int, pageToken string) (*Page, error) {
	if limit == 0 {
		limit = DefaultPageSize
	}
	if limit < 1 || limit > MaxPageSize {
		return nil, space.FieldError(space.EINVALID, "limit", "must be between 1 and %d", MaxPageSize)
	}
	after, err := decodePageToken(pageToken)
	if err != nil {
		return nil, err
	}
	page, err := listSandboxes(ctx, s.opts.DB, client, limit, after)
	return page, store.Classify(err)
}
