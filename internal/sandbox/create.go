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

// The create order, top to bottom in Service.create: validate (Plan), look up a
// repeat, the refusal from memory (once, for a create that is no repeat), the
// concurrency place (place.go), then the activation a create shares with a restore
// (activate.go): book, charge, start, finish. Nothing is validated, resolved or
// refused twice.

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
	// hold is what the refusal from memory let this create through with (see
	// space.Charger.CachedRefusal): held until the create has charged, or ends
	// without.
	hold space.Hold
	// cold is true when the refusal from memory found the pool view knowing no ready
	// slot of the shape.
	cold bool
}

// release gives back what the plan holds of the buckets' known tokens. Releasing
// twice is harmless.
func (p *Plan) release() {
	if p.hold != nil {
		p.hold.Release()
	}
}

// Plan validates a create, in the order its caller is answered, and returns it
// planned:
//
//  1. the body is valid: EINVALID naming the field, before any limit is looked at;
//  2. the shape can ever be served: its template known, within the caps, at a cost the
//     client's bucket can hold; EUNPROCESSABLE naming the field otherwise, before any
//     refusal: a 429 would have its caller wait for what no wait can give.
//
// It is Create's first step; the API calls it alone for a create it queues, which is
// planned now and created when the dispatcher runs it (CreateQueued).
func (s *Service) Plan(caller space.Caller, req CreateRequest) (Plan, error) {
	return s.plan(caller, req, s.opts.Now())
}

// plan is Plan for a create that began at began, on the clock Create has read.
func (s *Service) plan(caller space.Caller, req CreateRequest, began time.Time) (Plan, error) {
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
		if req.ID != "" {
			return p, errors.New("create: an idempotency key and a fixed id are exclusive")
		}
	}
	var err error
	if p.Template, err = s.resolve(caller, req.Shape); err != nil {
		s.metrics.refused("create", err, s.opts.Now().Sub(began))
		return p, err
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

// refuseFromMemory answers a create with the refusal it is known to meet, at once and
// for nothing: no booking, no place, no call to Postgres or Redis. It is the path
// of a client flooding over its rate, whose every create would otherwise book a
// row, charge, be refused and undo the row.
//
// It refuses only when every step before the charge would let the create through to
// it, read from memory: the pool view knows no ready slot of the shape and no target
// making them (a warm hit costs no budget and must never be refused for want of one),
// and the Charger's refusal cache already knows that a charge of the template's cost
// would be refused (a *space.LimitError with FromMemory set). The live cap is not
// looked at: a create over it and over its rate may be told either reason. Anything
// else returns nil, and the charge asks Redis.
//
// A create it lets through holds its cost in p until it is charged.
func (s *Service) refuseFromMemory(p *Plan, began time.Time) error {
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

// Create makes the sandbox a synchronous create asks for, owned by its caller's id and
// capped and charged under its budget key, taking its concurrency place from places
// (the API's; nil takes none). It returns the place with the outcome: whoever called
// gives it back (Release) once it has answered, whatever the outcome (a zero Lease
// when no place was taken).
//
// The order, each step only for a create the step before let through:
//
//  1. validate: the body and the shape (Plan); a shape that can never be served is a
//     422 before any limit, a malformed body a 400 after the concurrency place (in
//     the order the limits apply: a client over its cap is told the cap);
//  2. look up a repeat: under an Idempotency-Key (internal/idempotency), the sandbox
//     the first request made, which is answered as it is; with a fixed id (a queued
//     create's run, or a repeat under a key), by that id: no sandbox yet, it is
//     created with it; failed (an earlier attempt's cold start failed), the
//     activation runs again in that row, which a refused retry (429, 422, 503) puts
//     back to failed with its error; starting, an attempt is in flight or was cut short
//     with its replica, and nobody can tell which here: an error wrapping ErrSettling,
//     for the caller to try again once the reconciler has settled the row; any other
//     state, an earlier attempt made it, and it is returned as it is. An id of another
//     client's sandbox is ECONFLICT;
//  3. the refusal from memory (refuseFromMemory), once, for a create that is no
//     repeat and no retry: a client flooding over its rate is answered before it takes
//     a place or a key;
//  4. claim a new Idempotency-Key for a new sandbox id: a refused create left it free
//     for its retry;
//  5. the concurrency place (takePlace): before the booking, or alongside it for a
//     plain create the pool cannot serve warm;
//  6. the activation (activate.go): book, charge, start, finish.
func (s *Service) Create(ctx context.Context, caller space.Caller, req CreateRequest, places Places) (*space.Sandbox, space.Lease, error) {
	return s.create(ctx, caller, req, places)
}

// CreateQueued is the dispatcher's run of a queued create (CreateRequest.ID fixed, its
// 202 answered): Create's order without a concurrency place, which bounds requests in
// flight; queued work is bounded by its lanes instead.
func (s *Service) CreateQueued(ctx context.Context, caller space.Caller, req CreateRequest) (*space.Sandbox, error) {
	sb, _, err := s.create(ctx, caller, req, nil)
	return sb, err
}

func (s *Service) create(ctx context.Context, caller space.Caller, req CreateRequest, places Places) (*space.Sandbox, space.Lease, error) {
	began := s.opts.Now()
	// 1. Validate.
	p, err := s.plan(caller, req, began)
	if space.ErrorCode(err) == space.EINVALID {
		// A malformed create is told so after its place, in the order the limits
		// apply: a client over its concurrency cap is told the cap.
		pl, perr := s.takePlace(ctx, caller, places, false)
		if perr != nil {
			return nil, space.Lease{}, perr
		}
		lease, _ := pl.wait()
		return nil, lease, err
	}
	if err != nil {
		return nil, space.Lease{}, err
	}
	defer p.release() // the hold of the refusal from memory, if it let the create through

	// 2. Look up a repeat. The creation is made for the repeat's look, or past the
	// refusal from memory: a create refused from memory makes none.
	var c *creation
	newCreation := func() *creation {
		return &creation{s: s, tmpl: p.Template, unclaimable: !req.Answered && req.IdempotencyKey == ""}
	}
	id, byKey := req.ID, false
	if req.IdempotencyKey != "" {
		first, err := s.keyHolder(ctx, &p)
		if err != nil {
			return nil, space.Lease{}, err
		}
		if first != nil {
			id, byKey = first.SandboxID, true
		}
	}
	if id != "" {
		c = newCreation()
		done, err := s.repeat(ctx, c, caller.ID, id)
		if err != nil || done != nil {
			return done, space.Lease{}, err
		}
	}

	// 3. The refusal from memory.
	if c == nil || !c.retry {
		if err := s.refuseFromMemory(&p, began); err != nil {
			return nil, space.Lease{}, err
		}
	}
	if c == nil {
		c = newCreation()
	}

	// 4. A new key claimed for a new sandbox.
	if req.IdempotencyKey != "" && !byKey {
		var twin bool
		if id, twin, err = s.claimKey(ctx, &p); err != nil {
			return nil, space.Lease{}, err
		}
		if twin {
			// A concurrent twin claimed the key first: this create repeats it.
			done, err := s.repeat(ctx, c, caller.ID, id)
			if err != nil || done != nil {
				return done, space.Lease{}, err
			}
		}
	}
	c.fixedID = id != ""
	if id == "" {
		id = uuid.NewString()
	}
	c.sb = &space.Sandbox{
		ID:              id,
		Client:          caller.ID,
		BudgetKey:       caller.Key,
		State:           space.StateStarting,
		Shape:           req.Shape,
		TemplateVersion: p.Template.Version,
		Metadata:        req.Metadata,
		Answered:        req.Answered,
	}

	// 5. The concurrency place.
	plain := req.ID == "" && req.IdempotencyKey == ""
	placeBegan := s.opts.Now()
	pl, err := s.takePlace(ctx, caller, places, plain && p.cold)
	if err != nil {
		return nil, space.Lease{}, err
	}
	c.place, c.placeTook = pl, s.opts.Now().Sub(placeBegan)
	handed := false
	defer func() {
		if !handed {
			// The activation panicked: the place is given back here, since nobody
			// else holds it (a place kept is renewed for as long as its replica runs).
			lease, _ := pl.wait()
			lease.Release()
		}
	}()

	// 6. The activation.
	sb, err := s.activate(ctx, caller, c)
	// The activation may end before it waits for a place taken alongside (its
	// booking failed): the place is waited for all the same, to be given back, or
	// to be what the caller is told, as it would have been first.
	lease, perr := pl.wait()
	handed = true
	if err != nil && perr != nil {
		return nil, lease, perr
	}
	return sb, lease, err
}

// keyHolder returns the request that p's Idempotency-Key names, nil when the key is
// free (or expired); a key naming a different request is EUNPROCESSABLE.
func (s *Service) keyHolder(ctx context.Context, p *Plan) (*idempotency.Record, error) {
	rec, err := s.keyRecord(p)
	if err != nil {
		return nil, err
	}
	first, err := idempotency.Get(ctx, s.db, rec.Client, rec.Key)
	if err != nil || first == nil {
		return nil, err
	}
	return first, first.Names(rec.RequestHash)
}

// repeat looks up the sandbox a create with a fixed id repeats, into c: a sandbox to
// answer with as it is (done), a failed one to retry in its row (c.retry), or none
// yet, to be created with the id. See Create for each case.
func (s *Service) repeat(ctx context.Context, c *creation, client space.ClientID, id string) (done *space.Sandbox, err error) {
	cur, err := s.existing(ctx, client, id)
	switch {
	case err != nil:
		return nil, err
	case cur != nil && cur.State != space.StateFailed:
		// A repeat is answered with the sandbox, which from then on no longer depends
		// on a key to be claimed.
		if err := markAnswered(ctx, s.db, cur); err != nil {
			return nil, err
		}
		return cur, nil
	}
	// A retry of a failed row takes the usual path, so that the row keeps the history
	// of its refused retries.
	c.retry = cur != nil
	return nil, nil
}

// claimKey claims p's free Idempotency-Key for a new sandbox id, and returns the id. A
// concurrent twin whose claim committed first makes this create a repeat of it: the
// twin's sandbox id is returned (twin true), which this create then works on as a
// fixed id.
func (s *Service) claimKey(ctx context.Context, p *Plan) (id string, twin bool, err error) {
	rec, err := s.keyRecord(p)
	if err != nil {
		return "", false, err
	}
	var first *idempotency.Record
	err = s.db.Tx(ctx, func(tx pgx.Tx) error {
		var err error
		first, err = idempotency.Claim(ctx, tx, rec, s.opts.IdempotencyTTL)
		return err
	})
	switch {
	case err != nil:
		return "", false, err
	case first != nil:
		return first.SandboxID, true, nil
	}
	return rec.SandboxID, false, nil
}

// keyRecord is the record p's Idempotency-Key is claimed with: the synchronous create
// it names, by its hash, and a new sandbox id.
func (s *Service) keyRecord(p *Plan) (*idempotency.Record, error) {
	body, err := p.Request.Encode()
	if err != nil {
		return nil, err
	}
	return &idempotency.Record{Client: p.Caller.ID, Key: p.Request.IdempotencyKey,
		RequestHash: idempotency.Hash(syncCreate, "", body), SandboxID: uuid.NewString()}, nil
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
	// place is the create's concurrency place (takePlace), and placeTook what taking
	// it took before the booking (next to nothing when it is taken alongside).
	place     *place
	placeTook time.Duration
}

func (c *creation) kind() string                  { return "create" }
func (c *creation) transient() space.SandboxState { return space.StateStarting }
func (c *creation) abandonable() bool             { return c.unclaimable }

func (c *creation) book(ctx context.Context, caller space.Caller) (*space.Sandbox, substrate.Template, *pool.Slot, error) {
	if c.retry {
		return c.s.bookTx(ctx, caller, true, func(tx pgx.Tx) (*space.Sandbox, substrate.Template, error) {
			var err error
			c.failedWith, err = reviveSandbox(ctx, tx, c.sb, caller.Lifecycle)
			return c.sb, c.tmpl, err
		})
	}
	slot, err := c.s.bookNew(ctx, caller, c.sb, c.tmpl)
	if c.fixedID && isUniqueViolation(err) {
		return nil, c.tmpl, nil, settling(c.sb.ID, "another attempt of this create is starting it")
	}
	if err != nil {
		return nil, c.tmpl, nil, err
	}
	return c.sb, c.tmpl, slot, nil
}

// placed waits for the place taken alongside the booking, and observes the place
// step: what taking it held the create up, before the booking and after it.
func (c *creation) placed() error {
	if c.place == nil {
		return nil
	}
	began := c.s.opts.Now()
	_, err := c.place.wait()
	c.s.metrics.step(c.kind(), stepPlace, c.placeTook+c.s.opts.Now().Sub(began))
	return err
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
