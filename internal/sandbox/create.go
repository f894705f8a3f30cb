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
	"github.com/space-sandbox/space/internal/admission/model"
	"github.com/space-sandbox/space/internal/idempotency"
	"github.com/space-sandbox/space/internal/pool"
	"github.com/space-sandbox/space/internal/substrate"
)

// The create flow, top to bottom: a request is planned once (Plan: validated, its
// shape resolved, a refusal known from memory asked), then created (Create: its
// Idempotency-Key or fixed id looked up, the refusal asked if Plan could not, then
// the activation shared with restore, activate.go). Every step reads what the plan
// carries; nothing is validated, resolved or refused twice.

// CreateRequest is a create as its caller sent it.
type CreateRequest struct {
	Shape    space.Shape
	Metadata map[string]string
	// ID, when set, is the new sandbox's id instead of a random one. The dispatcher
	// fixes it when it accepts a queued create, so that every attempt of that one
	// request works on the same sandbox and a retry leaves no trail of failed ones.
	// With ID set, Create can be repeated (see Create).
	ID string
	// IdempotencyKey names the request for the key's time to live: a repeat under it
	// gets what the first made, and a different request under it is EUNPROCESSABLE.
	// A queued create's key is kept on its operation (internal/dispatcher).
	IdempotencyKey string
	// Async is true for a create to be queued (Prefer: respond-async) rather than run
	// now: it waits for its bucket in the queue, so no refusal is asked when it is
	// planned.
	Async bool
	// Answered is true when the caller was told of the sandbox before it exists: a
	// queued create's 202 named its id. A synchronous create is answered only by its
	// 201; until then nobody but this request can claim the sandbox (see finish).
	Answered bool
}

// createBody is a create's request as a queued operation stores it and an idempotency
// key hashes it: its shape and metadata, in encoding/json's stable order.
type createBody struct {
	space.Shape
	Metadata map[string]string `json:"metadata,omitempty"`
}

// Encode returns req's shape and metadata as a queued create stores them.
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

// Plan is a create checked once and carried to the end: who asks and under which
// limits, what it asks, and the template its shape resolved to. Only Service.Plan
// makes one.
type Plan struct {
	Caller   space.Caller
	Request  CreateRequest
	Template substrate.Template
	// refusalAsked is true when Plan asked for a refusal known from memory; Create
	// asks after its lookups otherwise.
	refusalAsked bool
	// hold is what the refusal cache let this create through with (see
	// space.Charger): held until Create has charged, or the create ends without.
	hold space.Hold
	// cold is true when Plan found the pool view knowing no ready slot of the shape.
	cold bool
	// place, when set, waits for the create's concurrency place, taken alongside its
	// reservation (WithPlace).
	place func() error
}

// Alongside reports whether p's create may take its concurrency place alongside its
// reservation rather than before it (the API's choice, as
// admission.ConcurrencyLimiter.Alongside allows): a plain synchronous create (no key,
// no fixed id, not queued: one that is never a repeat) of a shape the pool view knew
// no ready slot of when it was planned, so that the reservation it runs beside is all
// but certain to claim none.
func (p Plan) Alongside() bool { return p.refusalAsked && p.cold }

// WithPlace returns p with place, the wait for its concurrency place being taken
// alongside its reservation. Create calls it once the reservation is made, before
// anything is adopted, charged or started; an error from it takes the reservation
// back (a slot it claimed all the same is discarded) and is Create's error.
func (p Plan) WithPlace(place func() error) Plan {
	p.place = place
	return p
}

// Release gives back what the plan holds of the buckets' known tokens (see
// space.Charger.CachedRefusal). Create releases it itself; whoever makes a Plan and
// may not pass it to Create (a create refused by its concurrency cap after it was
// planned) releases it too. Releasing twice is harmless.
func (p Plan) Release() {
	if p.hold != nil {
		p.hold.Release()
	}
}

// Plan checks a create once, in the order its caller is answered:
//
//  1. the body is valid: EINVALID naming the field, before any limit is looked at;
//  2. the shape can ever be served: its template known, within the caps, at a cost the
//     client's bucket can hold; EUNPROCESSABLE naming the field otherwise, before any
//     refusal: a 429 would have its caller wait for what no wait can give;
//  3. a refusal this replica already knows (see knownRefusal), asked here for a plain
//     synchronous create, so that a client flooding over its rate is answered before
//     it takes a concurrency place. A create that may repeat an earlier request (an
//     Idempotency-Key, a fixed id) is asked in Create instead, once it is known not to
//     be a repeat, whose answer is what the first made; a queued create is not asked
//     at all: it waits for its bucket.
func (s *Service) Plan(caller space.Caller, req CreateRequest) (Plan, error) {
	began := s.opts.Now()
	p := Plan{Caller: caller, Request: req}
	if err := ValidateCreate(req.Shape, req.Metadata); err != nil {
		return p, err
	}
	if req.ID != "" {
		if err := CheckID(req.ID); err != nil {
			return p, err
		}
	}
	if req.IdempotencyKey != "" {
		if err := idempotency.Check(req.IdempotencyKey); err != nil {
			return p, err
		}
	}
	var err error
	if p.Template, err = s.resolve(caller, req.Shape); err != nil {
		s.metrics.refused("create", err, s.opts.Now().Sub(began))
		return p, err
	}
	if !req.Async && req.ID == "" && req.IdempotencyKey == "" {
		p.refusalAsked = true
		if err := s.knownRefusal(&p, began); err != nil {
			return p, err
		}
	}
	return p, nil
}

// resolve resolves shape as a cold start of caller's would: its template, within the
// caps, at an activation cost the caller may ask for (its max_activation_cost) and its
// bucket can ever hold.
func (s *Service) resolve(caller space.Caller, shape space.Shape) (substrate.Template, error) {
	tmpl, err := s.opts.Catalog.Resolve(shape)
	if err != nil {
		return tmpl, err
	}
	if m := caller.MaxActivationCost; m > 0 && tmpl.ActivationCost() > m {
		return tmpl, space.FieldError(space.EUNPROCESSABLE, "template",
			"template %q costs %d activation tokens, more than %s may ask for (max_activation_cost %d)",
			shape.Template, tmpl.ActivationCost(), whose(caller), m)
	}
	if r := caller.ClientRate; r != nil && caller.AdmissionEnabled && int64(tmpl.ActivationCost()) > r.Burst {
		return tmpl, space.FieldError(space.EUNPROCESSABLE, "template",
			"template %q costs %d activation tokens, more than the client_activation bucket of %q holds (burst %d): it could never be admitted",
			shape.Template, tmpl.ActivationCost(), caller.Key, r.Burst)
	}
	if caller.AdmissionEnabled {
		// The cluster side: what the caller's tier may ever draw (its reserve, the
		// shared remainder, what idle tiers lend), or the cluster bucket's burst.
		lim := model.Limits{Cluster: caller.Cluster, Reservations: caller.Reservations}
		if most := model.Most(lim, caller.Tier); float64(tmpl.ActivationCost()) > most {
			where := "the cluster_activation bucket's burst"
			if caller.Reservations != nil {
				where = fmt.Sprintf("what tier %q can ever draw from the cluster_activation bucket (its reserve, the shared remainder and what idle tiers lend)", caller.Tier)
			}
			return tmpl, space.FieldError(space.EUNPROCESSABLE, "template",
				"template %q costs %d activation tokens, more than %s holds (%g): it could never be admitted",
				shape.Template, tmpl.ActivationCost(), where, most)
		}
	}
	return tmpl, nil
}

// whose names whose limit a refusal is: the caller's tier, or its budget key.
func whose(c space.Caller) string {
	if c.Tier != "" && c.Sources.MaxActivationCost != space.SourceClient {
		return fmt.Sprintf("tier %q", c.Tier)
	}
	return fmt.Sprintf("client %q", c.Key)
}

// knownRefusal answers a create with the refusal it is known to meet, at once and for
// nothing: no reservation, no lease, no call to Postgres or Redis. It is the path of a
// client flooding over its rate, whose every create would otherwise reserve a row,
// charge, be refused and undo the row.
//
// It refuses only when every step before the charge would let the create through to
// it, read from memory: the pool view knows no ready slot of the shape and no target
// making them (a warm hit costs no budget and must never be refused for want of one),
// and the Charger's refusal cache already knows that a charge of the template's cost
// would be refused. The live cap is not looked at: a create over it and over its rate
// may be told either reason. Anything else returns nil, and the charge asks Redis.
//
// A create it lets through holds its cost in p (Plan.Release) until it is charged.
func (s *Service) knownRefusal(p *Plan, began time.Time) error {
	if s.opts.View == nil || !s.opts.View.Cold(p.Request.Shape) {
		return nil
	}
	p.cold = true
	hold, le := s.opts.Charger.CachedRefusal(p.Caller.Charge(p.Template.ActivationCost()))
	if le == nil {
		p.hold = hold
		return nil
	}
	s.metrics.refused("create", le, s.opts.Now().Sub(began))
	return le
}

// syncCreate is what a synchronous create is, for an idempotency key's hash: not the
// same request as a queued create with the same body (that one's answer is an
// operation).
const syncCreate = "create (synchronous)"

// Create makes the sandbox of a planned create, owned by its caller's id and capped
// and charged under its budget key.
//
// A create that may repeat an earlier one is looked up first:
//   - under an Idempotency-Key (internal/idempotency): a repeat works on the sandbox
//     the first request made, and charges nothing when that one runs; a new request
//     claims the key for a new sandbox id;
//   - with a fixed id (a queued create's run, or a repeat under a key), by that id: no
//     sandbox yet, it is created with it; failed (an earlier attempt's cold start
//     failed), the activation runs again in that row, which a refused retry (429, 422,
//     503) puts back to failed with its error; starting, an attempt is in flight or
//     was cut short with its replica, and nobody can tell which here: an error
//     wrapping ErrSettling, for the caller to try again once the reconciler has
//     settled the row; any other state, an earlier attempt made it, and it is
//     returned as it is. An id of another client's sandbox is ECONFLICT.
func (s *Service) Create(ctx context.Context, p Plan) (*space.Sandbox, error) {
	defer func() { p.Release() }() // the hold p has by the end: Plan's, or one asked below
	req := p.Request
	if req.IdempotencyKey != "" {
		if req.ID != "" {
			return nil, errors.New("create: an idempotency key and a fixed id are exclusive")
		}
		id, asked, err := s.claimKey(ctx, &p)
		if err != nil {
			return nil, err
		}
		req.ID, p.refusalAsked = id, asked
	}

	id, retry := req.ID, false
	if id == "" {
		id = uuid.NewString()
	} else {
		cur, err := s.existing(ctx, p.Caller.ID, id)
		switch {
		case err != nil:
			return nil, err
		case cur != nil && cur.State != space.StateFailed:
			// A repeat is answered with the sandbox, which from then on no longer
			// depends on a key to be claimed.
			if err := markAnswered(ctx, s.db, cur); err != nil {
				return nil, err
			}
			return cur, nil
		}
		retry = cur != nil
		// A retry of a failed row takes the usual path, so that the row keeps the
		// history of its refused retries.
		if !retry && !p.refusalAsked {
			if err := s.knownRefusal(&p, s.opts.Now()); err != nil {
				return nil, err
			}
		}
	}

	sb := &space.Sandbox{
		ID:              id,
		Client:          p.Caller.ID,
		BudgetKey:       p.Caller.Key,
		State:           space.StateStarting,
		Shape:           req.Shape,
		TemplateVersion: p.Template.Version,
		Metadata:        req.Metadata,
		Answered:        req.Answered,
	}
	return s.activate(ctx, p.Caller, &creation{s: s, sb: sb, tmpl: p.Template, retry: retry, fixedID: req.ID != "",
		unclaimable: !req.Answered && req.IdempotencyKey == "", place: p.place})
}

// claimKey returns the sandbox id p's idempotency key names: a new one when the key
// is free (or expired), the first request's when the key already names this request.
// A new request is asked for a known refusal before it claims anything (asked is then
// true), so that a refused one leaves the key free for its retry; a repeat is not: its
// answer is what the first made, even while the client is refused.
func (s *Service) claimKey(ctx context.Context, p *Plan) (id string, asked bool, err error) {
	body, err := p.Request.Encode()
	if err != nil {
		return "", false, err
	}
	rec := &idempotency.Record{Client: p.Caller.ID, Key: p.Request.IdempotencyKey,
		RequestHash: idempotency.Hash(syncCreate, "", body), SandboxID: uuid.NewString()}
	first, err := idempotency.Run(ctx, s.db, rec, s.opts.IdempotencyTTL, func() error {
		asked = true
		return s.knownRefusal(p, s.opts.Now())
	}, nil)
	switch {
	case err != nil:
		return "", asked, err
	case first != nil:
		return first.SandboxID, asked, nil
	}
	return rec.SandboxID, asked, nil
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

// existing returns client's sandbox id when a create with a fixed id finds one to
// return or to retry into, nil when there is none yet, and ECONFLICT when the id is
// another client's or the sandbox is starting.
func (s *Service) existing(ctx context.Context, client space.ClientID, id string) (*space.Sandbox, error) {
	cur, err := getSandbox(ctx, s.db, id, "", false)
	switch {
	case space.ErrorCode(err) == space.ENOTFOUND:
		return nil, nil
	case err != nil:
		return nil, err
	case cur.Client != client:
		return nil, space.Errorf(space.ECONFLICT, "sandbox id %s is taken", id)
	case cur.State == space.StateStarting:
		return nil, settling(id, "another attempt of this create is in flight or was cut short")
	}
	return cur, nil
}

var starting = []space.SandboxState{space.StateStarting}

// creation is a create's part in the activation: a new row (or a failed one revived),
// started cold or in an adopted slot.
type creation struct {
	s    *Service
	sb   *space.Sandbox
	tmpl substrate.Template
	// retry is true when the row exists, failed, and is revived; fixedID when its id
	// was given (two attempts of one create may race to insert it).
	retry, fixedID bool
	// unclaimable: only this request's answer can ever tell a client of the sandbox.
	unclaimable bool
	// failedWith is a revived row's error, put back when the retry is refused.
	failedWith string
	// place is the plan's wait for its concurrency place (Plan.WithPlace), or nil.
	place func() error
}

func (c *creation) kind() string                  { return "create" }
func (c *creation) transient() space.SandboxState { return space.StateStarting }
func (c *creation) abandonable() bool             { return c.unclaimable }

func (c *creation) reserve(ctx context.Context, caller space.Caller) (*space.Sandbox, substrate.Template, *pool.Slot, error) {
	if c.retry {
		return c.s.reserveTx(ctx, caller, true, func(tx pgx.Tx) (*space.Sandbox, substrate.Template, error) {
			var err error
			c.failedWith, err = reviveSandbox(ctx, tx, c.sb, caller.Lifecycle)
			return c.sb, c.tmpl, err
		})
	}
	slot, err := c.s.reserveNew(ctx, caller, c.sb, c.tmpl)
	if c.fixedID && isUniqueViolation(err) {
		return nil, c.tmpl, nil, settling(c.sb.ID, "another attempt of this create is starting it")
	}
	if err != nil {
		return nil, c.tmpl, nil, err
	}
	return c.sb, c.tmpl, slot, nil
}

func (c *creation) placed() error {
	if c.place == nil {
		return nil
	}
	return c.place()
}

func (c *creation) undo(ctx context.Context, sb *space.Sandbox) error {
	if c.retry {
		_, err := setState(ctx, c.s.db, sb.ID, stateChange{State: space.StateFailed, LastError: &c.failedWith, From: starting})
		return ignoreMoved(err)
	}
	return deleteReservation(ctx, c.s.db, sb.ID)
}

func (c *creation) start(ctx context.Context, spec substrate.Spec, slotRef string) (string, error) {
	if slotRef != "" {
		return c.s.opts.Substrate.Adopt(ctx, slotRef, spec)
	}
	return c.s.opts.Substrate.StartCold(ctx, spec)
}

func (c *creation) failed(ctx context.Context, sb *space.Sandbox, err error) error {
	msg := err.Error()
	_, ferr := setState(ctx, c.s.db, sb.ID, stateChange{State: space.StateFailed, LastError: &msg, From: starting})
	return ferr
}
