package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/idempotency"
	"github.com/space-sandbox/space/internal/pool"
	"github.com/space-sandbox/space/internal/store"
	"github.com/space-sandbox/space/internal/substrate"
)

// CreateRequest is a create's body, validated.
type CreateRequest struct {
	// ID, when set, is the new sandbox's id instead of a random one. The dispatcher
	// fixes it when it accepts a queued create, so that every attempt of that one
	// request works on the same sandbox and a retry leaves no trail of failed ones.
	// With ID set, Create can be repeated (see Create).
	ID       string
	Shape    space.Shape
	Metadata map[string]string
	// IdempotencyKey, when set on a create answered at once, names this request for
	// Options.IdempotencyTTL: a repeat under the key works on the same sandbox (see
	// Create) and a different request under it is EUNPROCESSABLE. Queued creates keep
	// their key on the operation instead, and set ID.
	IdempotencyKey string
}

// createBody is a create's request as a queued operation stores it and an idempotency
// key hashes it: its shape and metadata, in encoding/json's stable order.
type createBody struct {
	space.Shape
	Metadata map[string]string `json:"metadata,omitempty"`
}

// Encode returns req's shape and metadata as a queued create stores them (not its ID).
func (req CreateRequest) Encode() ([]byte, error) {
	b, err := json.Marshal(createBody{Shape: req.Shape, Metadata: req.Metadata})
	if err != nil {
		return nil, fmt.Errorf("encode create request: %w", err)
	}
	return b, nil
}

// DecodeCreate reads back what Encode wrote.
func DecodeCreate(b []byte) (CreateRequest, error) {
	var body createBody
	if err := json.Unmarshal(b, &body); err != nil {
		return CreateRequest{}, fmt.Errorf("decode create request: %w", err)
	}
	return CreateRequest{Shape: body.Shape, Metadata: body.Metadata}, nil
}

// Create makes a new sandbox owned by caller.ID, capped and charged under caller.Key:
// create path steps 3 to 8, docs/design.md.
//
// With req.ID set, a repeat of the same request is safe:
//   - no sandbox has that id yet: it is created with it;
//   - it is failed (an earlier attempt's cold start failed): the activation runs again
//     in that same row, which a refused retry (429, 422, 503) puts back to failed with
//     its error;
//   - it is starting: an attempt is in flight or was cut short mid cold start (its
//     replica died), and nobody can tell which here: an error wrapping ErrSettling,
//     for the caller to try again once the reconciler has settled the row (running:
//     it is returned; failed: it is retried);
//   - any other state: an earlier attempt made it; it is returned as it is and nothing
//     is charged.
//
// An id of another client's sandbox is ECONFLICT.
//
// With req.IdempotencyKey set, the key is claimed for a new sandbox id, or, when the
// key already names this request, the id it named is used: the repeat then returns
// the sandbox the first request made without charging anything, runs again what that
// request left undone (refused, or failed), and is ECONFLICT while the first is still
// starting it (the draft's 409 for a request in progress).
func (s *Service) Create(ctx context.Context, caller space.Caller, req CreateRequest) (*space.Sandbox, error) {
	if err := ValidateCreate(req.Shape, req.Metadata); err != nil {
		return nil, err
	}
	if req.IdempotencyKey != "" {
		id, err := s.claimKey(ctx, caller, req)
		if err != nil {
			return nil, err
		}
		req.ID = id
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
	if tmpl, err := s.opts.Catalog.Resolve(req.Shape); err == nil {
		sb.TemplateVersion = tmpl.Version // inserted with the row; activate checks it again
	}
	// A retry of a failed row takes the usual path, which also keeps that row's
	// history (its refused retries) as it always was.
	if !retry {
		if err := s.Refused(caller, req.Shape); err != nil {
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
				return nil, settling(id, "another attempt of this create is starting it")
			}
			return sb, err
		},
		undo: func(ctx context.Context, sb *space.Sandbox, _ error) error {
			if retry {
				_, err := setState(ctx, s.opts.DB, sb.ID, stateChange{State: space.StateFailed, LastError: &failedWith, From: starting})
				return ignoreMoved(err)
			}
			return deleteReservation(ctx, s.opts.DB, sb.ID)
		},
		start: func(ctx context.Context, sb *space.Sandbox, spec substrate.Spec, slot *pool.Slot) (string, error) {
			if slot != nil {
				return s.opts.Substrate.Adopt(ctx, slot.Ref, spec)
			}
			return s.opts.Substrate.StartCold(ctx, spec)
		},
		failed: func(ctx context.Context, sb *space.Sandbox, err error) (*space.Sandbox, error) {
			msg := err.Error()
			return setState(ctx, s.opts.DB, sb.ID, stateChange{State: space.StateFailed, LastError: &msg, From: starting})
		},
		transient: space.StateStarting,
	})
}

// syncCreate is what a synchronous create is, for an idempotency key's hash: not the
// same request as a queued create with the same body (that one's answer is an
// operation).
const syncCreate = "create (synchronous)"

// claimKey returns the sandbox id req's idempotency key names: a new one when the key
// is free (or expired), the first request's when the key already names this request.
func (s *Service) claimKey(ctx context.Context, caller space.Caller, req CreateRequest) (string, error) {
	if req.ID != "" {
		return "", errors.New("create: an idempotency key and a fixed id are exclusive")
	}
	if err := idempotency.Check(req.IdempotencyKey); err != nil {
		return "", err
	}
	body, err := req.Encode()
	if err != nil {
		return "", err
	}
	hash := idempotency.Hash(syncCreate, "", body)
	// A repeat is looked up first, so that it gets the first request's sandbox even
	// while the client is refused; a new request that would be refused claims nothing,
	// and its retry claims the key afresh.
	prev, err := idempotency.Get(ctx, s.opts.DB, caller.ID, req.IdempotencyKey)
	if err != nil {
		return "", store.Classify(err)
	}
	if prev == nil {
		if err := s.Refused(caller, req.Shape); err != nil {
			return "", err
		}
		rec := &idempotency.Record{Client: caller.ID, Key: req.IdempotencyKey, RequestHash: hash, SandboxID: uuid.NewString()}
		if prev, err = idempotency.Claim(ctx, s.opts.DB, rec, s.opts.IdempotencyTTL); err != nil {
			return "", store.Classify(err)
		}
		if prev == nil {
			return rec.SandboxID, nil
		}
	}
	if err := prev.Names(hash); err != nil {
		return "", err
	}
	return prev.SandboxID, nil
}

// ErrSettling is in the chain of the error of a create whose sandbox is still
// starting from an attempt that may have died with its replica: the reconciler settles
// such a sandbox (running or failed) within its bound, and the create can be repeated
// then. The dispatcher waits for that instead of failing the operation.
var ErrSettling = errors.New("the sandbox is still settling")

func settling(id, why string) error {
	return &space.Error{Code: space.ECONFLICT, Err: ErrSettling,
		Message: fmt.Sprintf("sandbox %s is starting: %s; it is settled within minutes", id, why)}
}

var starting = []space.SandboxState{space.StateStarting}

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
		return nil, settling(id, "another attempt of this create is in flight or was cut short")
	}
	return cur, nil
}

// CheckShape returns the EUNPROCESSABLE error that a cold start of shape by caller
// would meet (create path step 6, docs/design.md), or nil: for the dispatcher to
// refuse a never-servable create when it is queued rather than when it runs. Nothing
// is charged or reserved.
func (s *Service) CheckShape(caller space.Caller, shape space.Shape) error {
	_, err := s.resolve(caller, shape)
	return err
}

// resolve resolves shape as a cold start of caller's would: its template, within the
// caps, at an activation cost the caller's bucket can ever hold. A cost above the
// client bucket's burst could never be admitted: it is a 422 naming the template,
// not a 429 that no wait would end.
func (s *Service) resolve(caller space.Caller, shape space.Shape) (substrate.Template, error) {
	tmpl, err := s.opts.Catalog.Resolve(shape)
	if err != nil {
		return tmpl, err
	}
	if r := caller.ClientRate; r != nil && caller.AdmissionEnabled && int64(tmpl.ActivationCost()) > r.Burst {
		return tmpl, space.FieldError(space.EUNPROCESSABLE, "template",
			"template %q costs %d activation tokens, more than the client_activation bucket of %q holds (burst %d): it could never be admitted",
			shape.Template, tmpl.ActivationCost(), caller.Key, r.Burst)
	}
	return tmpl, nil
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
			_, err := setState(ctx, s.opts.DB, sb.ID, stateChange{State: space.StatePaused, From: restoring})
			return ignoreMoved(err)
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
			return setState(ctx, s.opts.DB, sb.ID, stateChange{State: space.StatePaused, LastError: &msg, From: restoring})
		},
		transient: space.StateRestoring,
		cold:      !substrate.RestoresWarm(s.opts.Substrate),
	})
}

var restoring = []space.SandboxState{space.StateRestoring}

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
	// transient is the state reserve puts the sandbox in (starting, restoring): every
	// later write is guarded on it, so that an activation that finds its sandbox moved
	// on (deleted meanwhile, or settled by the reconciler) writes nothing over it.
	transient space.SandboxState
	// cold skips the warm pool: the substrate cannot use a slot for this kind
	// (substrate.WarmRestorer), so claiming one would only burn it.
	cold bool
}

// activate runs steps 4 to 8 of the create path (docs/design.md), in that order:
//
//  4. live-sandbox cap, checked atomically with the reservation (one transaction under
//     a per-client advisory lock, taken only when the client has a cap);
//  6. resolve the cold shape, in memory, in the same transaction: 422 and nothing
//     reserved, claimed or charged when it cannot be served, warm or cold (a pool
//     target that does not resolve is never warmed, but a slot of it must not serve a
//     create either); the template's version and activation cost come with it;
//  5. warm pool: claim a ready slot of exactly this shape and template version in the
//     same transaction and adopt it: no bucket is charged;
//  7. charge admission, the template's cost from both buckets or neither: 429 (or
//     503 fail-closed);
//  8. cold start; a failure leaves the tokens spent.
func (s *Service) activate(ctx context.Context, caller space.Caller, a activation) (*space.Sandbox, error) {
	began := s.opts.Now()
	var sb *space.Sandbox
	var slot *pool.Slot
	var tmpl substrate.Template
	err := pgx.BeginFunc(ctx, s.opts.DB, func(tx pgx.Tx) error {
		if err := checkLiveCap(ctx, tx, caller.Key, caller.LiveSandboxes); err != nil {
			return err
		}
		var err error
		if sb, err = a.reserve(ctx, tx); err != nil {
			return err
		}
		if tmpl, err = s.resolve(caller, sb.Shape); err != nil {
			return err // the transaction rolls back: nothing is reserved
		}
		if err := setTemplateVersion(ctx, tx, sb, tmpl.Version); err != nil {
			return err
		}
		if a.cold {
			return nil
		}
		slot, err = s.opts.Pool.Claim(ctx, tx, sb.Shape, tmpl.Version, sb.ID)
		return err
	})
	if err != nil {
		s.metrics.refused(a.kind, err, s.opts.Now().Sub(began))
		return nil, store.Classify(err)
	}

	// From here the sandbox exists: finish the activation even if the caller hangs up,
	// so that no sandbox is left half made. The substrate's own timeout bounds it, and
	// the reconciler settles the sandbox after that bound should this replica die.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.Substrate.Timeout())
	defer cancel()
	spec := substrate.Spec{SandboxID: sb.ID, Client: sb.Client, Shape: sb.Shape, Template: tmpl}

	if slot != nil {
		s.opts.OnClaim()
		ref, err := a.start(ctx, sb, spec, slot)
		if err == nil {
			if cerr := s.opts.Pool.Consume(ctx, slot); cerr != nil {
				s.logger.WarnContext(ctx, "consume adopted slot", "slot", slot.ID, "err", cerr)
			}
			return s.finish(ctx, a, sb, ref, true, began)
		}
		// A slot that cannot be adopted is discarded and the activation goes on cold,
		// as if the pool had missed.
		s.logger.WarnContext(ctx, "warm slot adoption failed; starting cold", "sandbox", sb.ID, "slot", slot.ID, "err", err)
		s.opts.Pool.Discard(ctx, slot)
	}

	if err := s.opts.Charger.Charge(ctx, caller.Key, caller.ClientRate, tmpl.ActivationCost()); err != nil {
		if uerr := a.undo(ctx, sb, err); uerr != nil {
			s.logger.ErrorContext(ctx, "undo refused activation", "sandbox", sb.ID, "err", uerr)
		}
		s.metrics.refused(a.kind, err, s.opts.Now().Sub(began))
		return nil, err
	}

	coldBegan := s.opts.Now()
	ref, err := a.start(ctx, sb, spec, nil)
	if err != nil && space.ErrorCode(err) == space.EUNPROCESSABLE {
		// The substrate refused what it was asked to run (the API server's validation
		// of a template's pod): no retry can serve it, so it is the caller's 422 and
		// the reservation is taken back, as for any other 422. The substrate has
		// already removed what it made.
		if uerr := a.undo(ctx, sb, err); uerr != nil {
			s.logger.ErrorContext(ctx, "undo refused activation", "sandbox", sb.ID, "err", uerr)
		}
		s.metrics.refused(a.kind, err, s.opts.Now().Sub(began))
		return nil, err
	}
	if err != nil {
		s.metrics.activation(a.kind, "failed", s.opts.Now().Sub(began))
		s.logger.WarnContext(ctx, "cold start failed", "kind", a.kind, "sandbox", sb.ID, "err", err)
		_, ferr := a.failed(ctx, sb, err)
		var moved *movedError
		if errors.As(ferr, &moved) {
			return nil, movedOn(sb.ID, moved.cur.State, a.transient)
		}
		if ferr != nil {
			s.logger.ErrorContext(ctx, "record failed activation", "sandbox", sb.ID, "err", ferr)
		}
		return nil, &space.Error{Code: space.EUNAVAILABLE, Err: err,
			Message: fmt.Sprintf("the substrate failed to %s sandbox %s; see GET /v1/sandboxes/%s", activateVerb(a.kind), sb.ID, sb.ID)}
	}
	s.metrics.coldStart.WithLabelValues(a.kind).Observe(s.opts.Now().Sub(coldBegan).Seconds())
	return s.finish(ctx, a, sb, ref, false, began)
}

// finish records a started sandbox as running, provided it is still in the transitional
// state this activation put it in. When it is not, its owner deleted it meanwhile (or
// the reconciler settled it after this replica stalled past the bound): nothing owns
// what was just started, so it is stopped, unless the reconciler already recorded that
// very resource as the sandbox's.
func (s *Service) finish(ctx context.Context, a activation, sb *space.Sandbox, ref string, warm bool, began time.Time) (*space.Sandbox, error) {
	outcome := "cold"
	if warm {
		outcome = "warm"
	}
	out, err := setState(ctx, s.opts.DB, sb.ID, stateChange{State: space.StateRunning, SubstrateRef: ref, Warm: &warm, From: []space.SandboxState{a.transient}})
	var moved *movedError
	if !errors.As(err, &moved) {
		if err == nil {
			s.metrics.activation(a.kind, outcome, s.opts.Now().Sub(began))
		}
		// A write that failed (Postgres down) leaves the sandbox transitional with its
		// resource running: the reconciler finds it and records it running.
		return out, store.Classify(err)
	}
	if moved.cur.State == space.StateRunning && moved.cur.SubstrateRef == ref {
		s.metrics.activation(a.kind, outcome, s.opts.Now().Sub(began))
		return moved.cur, nil
	}
	if serr := s.opts.Substrate.Stop(ctx, ref); serr != nil {
		s.logger.ErrorContext(ctx, "stop what was started for a sandbox that moved on", "sandbox", sb.ID, "ref", ref, "err", serr)
	}
	s.metrics.activation(a.kind, "failed", s.opts.Now().Sub(began))
	return nil, movedOn(sb.ID, moved.cur.State, a.transient)
}

// movedOn is the error of an activation whose sandbox moved on while it ran.
func movedOn(id string, now, was space.SandboxState) error {
	return space.Errorf(space.ECONFLICT, "sandbox %s became %s while it was %s; nothing started for it is left running", id, now, was)
}
