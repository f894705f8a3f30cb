package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/admission"
	"github.com/space-sandbox/space/internal/dispatcher"
	"github.com/space-sandbox/space/internal/flags"
	"github.com/space-sandbox/space/internal/sandbox"
	"github.com/space-sandbox/space/internal/store"
)

// The handlers on fakes: what each answer's status, problem and headers are, for
// what the domain returns. End-to-end tests (internal/app) check the same answers
// against real parts; these pin the HTTP layer alone.

// fakeSandboxes answers with what the test sets; a nil func answers a plain success.
type fakeSandboxes struct {
	mu      sync.Mutex
	plan    func(space.Caller, sandbox.CreateRequest) error
	create  func(sandbox.Plan) (*space.Sandbox, error)
	get     func(space.ClientID, string) (*space.Sandbox, error)
	restore func(space.Caller, string) (*space.Sandbox, error)
	delete  func(space.ClientID, string) (bool, error)
	wake    func(space.Caller, string) (*space.Sandbox, error)
	// keepalive is told the timeout each keepalive asked for.
	keepalive func(space.Caller, string, time.Duration) (*space.Sandbox, error)
	// starting, when set, is called with the context of each create and restore
	// where the service would start the sandbox on the substrate.
	starting func(context.Context)
	owner    space.ClientID
	planned  []sandbox.CreateRequest
	created  int
}

var running = &space.Sandbox{ID: "0f0e0d0c-0b0a-4908-8706-050403020100", Client: "acme", State: space.StateRunning,
	Shape: space.Shape{Template: "python-3.12", CPUMillis: 1000, MemoryMiB: 2048, DiskGiB: 10}}

func (f *fakeSandboxes) Plan(caller space.Caller, req sandbox.CreateRequest) (sandbox.Plan, error) {
	f.mu.Lock()
	f.planned = append(f.planned, req)
	f.mu.Unlock()
	if err := sandbox.ValidateCreate(req.Shape, req.Metadata); err != nil {
		return sandbox.Plan{}, err
	}
	if f.plan != nil {
		if err := f.plan(caller, req); err != nil {
			return sandbox.Plan{}, err
		}
	}
	return sandbox.Plan{Caller: caller, Request: req}, nil
}

// Create plans the create (Plan, so that plan's errors apply), then takes its place
// from places as sandbox.Service.Create does: a malformed create after it, any other
// refusal of the plan (422, a refusal from memory) before it.
func (f *fakeSandboxes) Create(ctx context.Context, caller space.Caller, req sandbox.CreateRequest, places sandbox.Places) (*space.Sandbox, space.Lease, error) {
	p, err := f.Plan(caller, req)
	if err != nil && space.ErrorCode(err) != space.EINVALID {
		return nil, space.Lease{}, err
	}
	lease, lerr := places.Acquire(ctx, caller.Key, caller.Concurrency)
	if lerr != nil {
		return nil, space.Lease{}, lerr
	}
	if err != nil {
		return nil, lease, err
	}
	f.mu.Lock()
	f.created++
	f.mu.Unlock()
	if f.starting != nil {
		f.starting(ctx)
	}
	if f.create != nil {
		defer func() {
			if r := recover(); r != nil {
				lease.Release() // as the service gives back the place of a create that panics
				panic(r)
			}
		}()
		sb, err := f.create(p)
		return sb, lease, err
	}
	return running, lease, nil
}

func (f *fakeSandboxes) Get(_ context.Context, client space.ClientID, id string) (*space.Sandbox, error) {
	if f.get != nil {
		return f.get(client, id)
	}
	return running, nil
}

func (f *fakeSandboxes) List(context.Context, space.ClientID, int, string) (*sandbox.Page, error) {
	return &sandbox.Page{Sandboxes: []*space.Sandbox{running}}, nil
}

func (f *fakeSandboxes) Pause(context.Context, space.Caller, string) (*space.Sandbox, error) {
	return running, nil
}

func (f *fakeSandboxes) Keepalive(_ context.Context, caller space.Caller, id string, timeout time.Duration) (*space.Sandbox, error) {
	if f.keepalive != nil {
		return f.keepalive(caller, id, timeout)
	}
	return running, nil
}

func (f *fakeSandboxes) Restore(ctx context.Context, caller space.Caller, id string) (*space.Sandbox, error) {
	if f.starting != nil {
		f.starting(ctx)
	}
	if f.restore != nil {
		return f.restore(caller, id)
	}
	return running, nil
}

func (f *fakeSandboxes) Delete(_ context.Context, client space.ClientID, id string) (bool, error) {
	if f.delete != nil {
		return f.delete(client, id)
	}
	return false, nil
}

func (f *fakeSandboxes) Owner(context.Context, string) (space.ClientID, error) { return f.owner, nil }

func (f *fakeSandboxes) Wake(_ context.Context, owner space.Caller, id string) (*space.Sandbox, error) {
	if f.wake != nil {
		return f.wake(owner, id)
	}
	return running, nil
}

func (f *fakeSandboxes) Costs() map[string]int { return map[string]int{"python-3.12": 1} }

// fakeOperations queues nothing real; it records what it was asked to queue.
type fakeOperations struct {
	mu     sync.Mutex
	queued []dispatcher.Request
}

var queuedOp = &space.Operation{ID: "a1b2c3d4-e5f6-4a7b-8c9d-0e1f2a3b4c5d", Kind: space.OperationCreate, State: space.OperationQueued}

func (f *fakeOperations) Enqueue(_ context.Context, req dispatcher.Request) (*space.Operation, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.queued = append(f.queued, req)
	return queuedOp, true, nil
}

func (f *fakeOperations) Get(context.Context, space.ClientID, string) (*space.Operation, error) {
	return queuedOp, nil
}

func (f *fakeOperations) GetAny(context.Context, string) (*space.Operation, error) {
	return queuedOp, nil
}

// fakeLeases counts the places taken and refuses while full says so; its leases are
// roomy when roomy says so, and given back through onRelease when it is set. It lets
// places be taken alongside while alongside says so, and counts those done.
type fakeLeases struct {
	mu        sync.Mutex
	full      bool
	roomy     bool
	alongside bool
	onRelease func()
	acquired  int
	done      int
}

func (f *fakeLeases) Alongside(space.ClientKey, int) (func(), bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.alongside {
		return nil, false
	}
	return func() { f.mu.Lock(); f.done++; f.mu.Unlock() }, true
}

func (f *fakeLeases) Acquire(_ context.Context, key space.ClientKey, cap int) (space.Lease, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.full {
		return space.Lease{}, &space.LimitError{Bucket: space.BucketClientConcurrency, Client: key, Cap: cap, RetryAfter: time.Second}
	}
	f.acquired++
	release := func() {}
	if f.onRelease != nil {
		release = f.onRelease
	}
	return space.NewLease(release, f.roomy), nil
}

// fakeCallers makes every id its own budget key, and records whom it resolved; with,
// when set, changes what it resolves.
type fakeCallers struct {
	mu       sync.Mutex
	resolved []space.ClientID
	with     func(*space.Caller)
}

func (f *fakeCallers) Resolve(_ context.Context, id space.ClientID) space.Caller {
	f.mu.Lock()
	f.resolved = append(f.resolved, id)
	f.mu.Unlock()
	c := space.Caller{ID: id, Key: space.ClientKey(id), Allowlisted: true, Concurrency: 10, LiveSandboxes: 50,
		AdmissionEnabled: true, Cluster: space.Rate{RefillRPS: 100, Burst: 200}, RateSource: space.SourceEnv}
	if f.with != nil {
		f.with(&c)
	}
	return c
}

// fakeTiers serves the tier table the test sets (none by default).
type fakeTiers struct {
	table flags.TierTable
}

func (f *fakeTiers) Tiers(context.Context) flags.TierTable { return f.table }

type fakeBudgets struct{}

func (fakeBudgets) Report(context.Context, space.Charge) (admission.Decision, admission.Enforcement, error) {
	return admission.Decision{Admitted: true, Cluster: admission.BucketState{Remaining: 150}}, admission.Enforced, nil
}

type handlers struct {
	t          *testing.T
	sandboxes  *fakeSandboxes
	operations *fakeOperations
	leases     *fakeLeases
	callers    *fakeCallers
	tiers      *fakeTiers
	server     *Server
	public     http.Handler
	internal   http.Handler
}

func setup(t *testing.T) *handlers {
	t.Helper()
	h := &handlers{t: t, sandboxes: &fakeSandboxes{owner: "acme"}, operations: &fakeOperations{}, leases: &fakeLeases{}, callers: &fakeCallers{},
		tiers: &fakeTiers{}}
	s := New(Options{
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
		Registry:    prometheus.NewRegistry(),
		Identity:    space.IdentityTrustedHeader,
		Auth:        &TrustedHeader{Trusted: []netip.Prefix{netip.MustParsePrefix("192.0.2.1/32")}},
		Callers:     h.callers,
		Tiers:       h.tiers,
		Concurrency: h.leases,
		Budgets:     fakeBudgets{},
		Sandboxes:   h.sandboxes,
		Operations:  h.operations,
	})
	h.server, h.public, h.internal = s, s.Public(), s.Internal()
	return h
}

const pythonCreate = `{"template":"python-3.12","cpu_millis":1000,"memory_mib":2048,"disk_gib":10}`

// do sends a request as acme through the trusted gateway, with header pairs.
func (h *handlers) do(handler http.Handler, method, path, body string, header ...string) *httptest.ResponseRecorder {
	h.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	r := httptest.NewRequest(method, path, rd)
	r.RemoteAddr = "192.0.2.1:40000"
	r.Header.Set(HeaderClientID, "acme")
	if body != "" {
		r.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	handler.ServeHTTP(w, r)
	return w
}

func problemOf(t *testing.T, w *httptest.ResponseRecorder) Problem {
	t.Helper()
	if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("%d with content type %q, want a problem: %s", w.Code, ct, w.Body)
	}
	var p Problem
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatal(err)
	}
	if p.Status != w.Code || p.Type != ProblemType(p.Code) || p.RequestID == "" || p.RequestID != w.Header().Get("X-Request-ID") {
		t.Fatalf("problem %+v does not match its answer %d (request id %q)", p, w.Code, w.Header().Get("X-Request-ID"))
	}
	return p
}

func TestCreateHandler(t *testing.T) {
	t.Parallel()

	t.Run("a create is a 201 with the sandbox and its Location, planned once for the authenticated caller", func(t *testing.T) {
		t.Parallel()
		h := setup(t)
		w := h.do(h.public, "POST", "/v1/sandboxes", pythonCreate)
		var sb space.Sandbox
		if err := json.Unmarshal(w.Body.Bytes(), &sb); err != nil || w.Code != http.StatusCreated || sb.ID != running.ID {
			t.Fatalf("create = %d %s", w.Code, w.Body)
		}
		if loc := w.Header().Get("Location"); loc != "/v1/sandboxes/"+running.ID {
			t.Fatalf("Location %q", loc)
		}
		if len(h.sandboxes.planned) != 1 || h.sandboxes.created != 1 || h.leases.acquired != 1 {
			t.Fatalf("planned %d, created %d, leases %d; want one each", len(h.sandboxes.planned), h.sandboxes.created, h.leases.acquired)
		}
		if got := h.sandboxes.planned[0]; got.Async || got.IdempotencyKey != "" || got.Shape.Template != "python-3.12" {
			t.Fatalf("planned %+v", got)
		}
	})

	t.Run("a malformed body is a 400 naming the field, and nothing is created", func(t *testing.T) {
		t.Parallel()
		h := setup(t)
		w := h.do(h.public, "POST", "/v1/sandboxes", `{"template":"python-3.12","cpu_millis":"many","memory_mib":1,"disk_gib":1}`)
		if p := problemOf(t, w); w.Code != http.StatusBadRequest || p.Code != space.EINVALID || p.Field != "cpu_millis" {
			t.Fatalf("create = %d %+v", w.Code, p)
		}
		if h.sandboxes.created != 0 {
			t.Fatal("a malformed create was created")
		}
	})

	t.Run("a create that can never pass is a 422 naming the field, before it takes a concurrency place", func(t *testing.T) {
		t.Parallel()
		h := setup(t)
		h.sandboxes.plan = func(space.Caller, sandbox.CreateRequest) error {
			return space.FieldError(space.EUNPROCESSABLE, "template", "template %q is not known", "cobol")
		}
		w := h.do(h.public, "POST", "/v1/sandboxes", pythonCreate)
		if p := problemOf(t, w); w.Code != http.StatusUnprocessableEntity || p.Field != "template" || w.Header().Get("Retry-After") != "" {
			t.Fatalf("create = %d %+v, Retry-After %q", w.Code, p, w.Header().Get("Retry-After"))
		}
		if h.leases.acquired != 0 || h.sandboxes.created != 0 {
			t.Fatalf("leases %d, created %d; want neither", h.leases.acquired, h.sandboxes.created)
		}
	})

	t.Run("a refusal known from memory is a 429 with its headers, before a concurrency place", func(t *testing.T) {
		t.Parallel()
		h := setup(t)
		h.sandboxes.plan = func(c space.Caller, _ sandbox.CreateRequest) error {
			return &space.LimitError{Bucket: space.BucketClientActivation, Client: c.Key, RetryAfter: 3 * time.Second,
				Limit: &space.Rate{RefillRPS: 1, Burst: 5}, Remaining: 0.4, FromMemory: true}
		}
		w := h.do(h.public, "POST", "/v1/sandboxes", pythonCreate)
		p := problemOf(t, w)
		if w.Code != http.StatusTooManyRequests || p.Bucket != space.BucketClientActivation || p.Client != "acme" {
			t.Fatalf("create = %d %+v", w.Code, p)
		}
		if ra := w.Header().Get("Retry-After"); ra != "3" && ra != "4" && ra != "5" {
			t.Fatalf("Retry-After %q, want the refill of 3s, jittered up by at most half", ra)
		}
		if got := w.Header().Get("RateLimit-Policy"); got != `"client_activation";q=5;w=5` {
			t.Fatalf("RateLimit-Policy %q", got)
		}
		if got := w.Header().Get("RateLimit"); !strings.HasPrefix(got, `"client_activation";r=0;t=`) {
			t.Fatalf("RateLimit %q", got)
		}
		if h.leases.acquired != 0 || h.sandboxes.created != 0 {
			t.Fatalf("leases %d, created %d; want neither", h.leases.acquired, h.sandboxes.created)
		}
	})

	t.Run("a malformed body from a client over its concurrency cap is told the cap", func(t *testing.T) {
		t.Parallel()
		h := setup(t)
		h.leases.full = true
		w := h.do(h.public, "POST", "/v1/sandboxes", `{"template":""}`)
		if p := problemOf(t, w); w.Code != http.StatusTooManyRequests || p.Bucket != space.BucketClientConcurrency {
			t.Fatalf("create = %d %+v, want the concurrency cap's 429", w.Code, p)
		}
	})

	t.Run("Prefer: respond-async queues the planned create: 202 with Location and Preference-Applied", func(t *testing.T) {
		t.Parallel()
		h := setup(t)
		w := h.do(h.public, "POST", "/v1/sandboxes", pythonCreate, "Prefer", "wait=5, respond-async", "Idempotency-Key", `"k-1"`)
		if w.Code != http.StatusAccepted || w.Header().Get("Location") != "/v1/operations/"+queuedOp.ID || w.Header().Get("Preference-Applied") != "respond-async" {
			t.Fatalf("create = %d %v %s", w.Code, w.Header(), w.Body)
		}
		if len(h.operations.queued) != 1 || h.sandboxes.created != 0 {
			t.Fatalf("queued %d, created %d", len(h.operations.queued), h.sandboxes.created)
		}
		q := h.operations.queued[0]
		if q.Kind != space.OperationCreate || q.Client != "acme" || q.Create == nil || !q.Create.Request.Async || q.IdempotencyKey != "k-1" {
			t.Fatalf("queued %+v (plan %+v)", q, q.Create)
		}
	})

	t.Run("an Idempotency-Key sent twice is a 400 naming the header", func(t *testing.T) {
		t.Parallel()
		h := setup(t)
		r := httptest.NewRequest("POST", "/v1/sandboxes", strings.NewReader(pythonCreate))
		r.RemoteAddr = "192.0.2.1:40000"
		r.Header.Set(HeaderClientID, "acme")
		r.Header.Set("Content-Type", "application/json")
		r.Header.Add("Idempotency-Key", "a")
		r.Header.Add("Idempotency-Key", "b")
		w := httptest.NewRecorder()
		h.public.ServeHTTP(w, r)
		if p := problemOf(t, w); w.Code != http.StatusBadRequest || p.Field != "Idempotency-Key" {
			t.Fatalf("create = %d %+v", w.Code, p)
		}
	})
}

func TestSandboxHandlers(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name   string
		err    error
		status int
		code   string
		detail string
	}{
		{"another client's sandbox is a 404", space.Errorf(space.ENOTFOUND, "no sandbox %s", running.ID), http.StatusNotFound, space.ENOTFOUND, "no sandbox " + running.ID},
		{"a state that does not allow it is a 409", space.Errorf(space.ECONFLICT, "sandbox is running"), http.StatusConflict, space.ECONFLICT, "sandbox is running"},
		{"a Postgres outage is a 503 naming only what is down", store.Classify(&net.OpError{Op: "dial", Net: "tcp", Err: errors.New("127.0.0.1:5432: connect: connection refused")}), http.StatusServiceUnavailable, space.EUNAVAILABLE, "postgres is unavailable"},
		{"an unexpected error is a 500 that says nothing of it", errors.New("secret detail"), http.StatusInternalServerError, space.EINTERNAL, "internal error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := setup(t)
			h.sandboxes.get = func(space.ClientID, string) (*space.Sandbox, error) { return nil, tc.err }
			w := h.do(h.public, "GET", "/v1/sandboxes/"+running.ID, "")
			p := problemOf(t, w)
			if w.Code != tc.status || p.Code != tc.code || p.Detail != tc.detail {
				t.Fatalf("GET = %d %+v, want %d %s %q", w.Code, p, tc.status, tc.code, tc.detail)
			}
			if strings.Contains(w.Body.String(), "secret") || strings.Contains(w.Body.String(), "5432") {
				t.Fatalf("the answer leaks the cause: %s", w.Body)
			}
		})
	}

	t.Run("a sandbox is read as its owner", func(t *testing.T) {
		t.Parallel()
		h := setup(t)
		var asked space.ClientID
		h.sandboxes.get = func(c space.ClientID, _ string) (*space.Sandbox, error) { asked = c; return running, nil }
		if w := h.do(h.public, "GET", "/v1/sandboxes/"+running.ID, ""); w.Code != http.StatusOK || asked != "acme" {
			t.Fatalf("GET = %d as %q", w.Code, asked)
		}
	})

	t.Run("a delete is a 204, or a 202 while the sandbox was mid-transition", func(t *testing.T) {
		t.Parallel()
		h := setup(t)
		if w := h.do(h.public, "DELETE", "/v1/sandboxes/"+running.ID, ""); w.Code != http.StatusNoContent || w.Body.Len() != 0 {
			t.Fatalf("DELETE = %d %s", w.Code, w.Body)
		}
		h.sandboxes.delete = func(space.ClientID, string) (bool, error) { return true, nil }
		if w := h.do(h.public, "DELETE", "/v1/sandboxes/"+running.ID, ""); w.Code != http.StatusAccepted {
			t.Fatalf("DELETE mid-transition = %d", w.Code)
		}
	})

	t.Run("an Idempotency-Key on a synchronous restore is a 400 naming the header", func(t *testing.T) {
		t.Parallel()
		h := setup(t)
		w := h.do(h.public, "POST", "/v1/sandboxes/"+running.ID+"/restore", "", "Idempotency-Key", "k")
		if p := problemOf(t, w); w.Code != http.StatusBadRequest || p.Field != "Idempotency-Key" {
			t.Fatalf("restore = %d %+v", w.Code, p)
		}
		w = h.do(h.public, "POST", "/v1/sandboxes/"+running.ID+"/restore", "", "Idempotency-Key", "k", "Prefer", "respond-async")
		if w.Code != http.StatusAccepted || len(h.operations.queued) != 1 || h.operations.queued[0].IdempotencyKey != "k" {
			t.Fatalf("queued restore = %d, queued %+v", w.Code, h.operations.queued)
		}
	})

	t.Run("a restore with a malformed id is a 400 naming the id", func(t *testing.T) {
		t.Parallel()
		h := setup(t)
		w := h.do(h.public, "POST", "/v1/sandboxes/nope/restore", "")
		if p := problemOf(t, w); w.Code != http.StatusBadRequest || p.Field != "id" {
			t.Fatalf("restore = %d %+v", w.Code, p)
		}
	})

	t.Run("an internal wake runs as the sandbox's owner, whoever asks", func(t *testing.T) {
		t.Parallel()
		h := setup(t)
		h.sandboxes.owner = "globex"
		var as space.ClientID
		h.sandboxes.wake = func(owner space.Caller, _ string) (*space.Sandbox, error) { as = owner.ID; return running, nil }
		w := h.do(h.internal, "POST", "/internal/v1/sandboxes/"+running.ID+"/wake", "")
		if w.Code != http.StatusOK || as != "globex" {
			t.Fatalf("wake = %d as %q, want 200 as the owner globex", w.Code, as)
		}
	})

	t.Run("a request from outside the gateway is a 401 with WWW-Authenticate", func(t *testing.T) {
		t.Parallel()
		h := setup(t)
		r := httptest.NewRequest("GET", "/v1/sandboxes", nil)
		r.RemoteAddr = "203.0.113.9:40000"
		r.Header.Set(HeaderClientID, "acme")
		w := httptest.NewRecorder()
		h.public.ServeHTTP(w, r)
		if p := problemOf(t, w); w.Code != http.StatusUnauthorized || p.Code != space.EUNAUTHORIZED || w.Header().Get("WWW-Authenticate") == "" {
			t.Fatalf("GET = %d %+v, WWW-Authenticate %q", w.Code, p, w.Header().Get("WWW-Authenticate"))
		}
		if len(h.callers.resolved) != 0 {
			t.Fatal("an unauthenticated request was resolved")
		}
	})

	t.Run("GET /v1/limits reports the caller as it was resolved, without a concurrency place", func(t *testing.T) {
		t.Parallel()
		h := setup(t)
		h.leases.full = true
		w := h.do(h.public, "GET", "/v1/limits", "")
		var l LimitsBody
		if err := json.Unmarshal(w.Body.Bytes(), &l); err != nil || w.Code != http.StatusOK {
			t.Fatalf("limits = %d %s", w.Code, w.Body)
		}
		if l.ClientID != "acme" || l.Client != "acme" || l.Admission != admission.Enforced || *l.Concurrency != 10 ||
			*l.Cluster.Remaining != 150 || l.ActivationCosts["python-3.12"] != 1 {
			t.Fatalf("limits %+v", l)
		}
	})
}

func TestLeaseGivenBackAfterAnswer(t *testing.T) {
	t.Parallel()

	// answeredAtRelease sends a create as acme with a lease as roomy says, and returns
	// what the recorder had of the answer when the lease was given back.
	answeredAtRelease := func(t *testing.T, roomy bool) (flushed bool, length string, body int, w *httptest.ResponseRecorder) {
		h := setup(t)
		var once sync.Once
		released := false
		h.leases.roomy = roomy
		w = httptest.NewRecorder()
		h.leases.onRelease = func() {
			once.Do(func() {
				released = true
				flushed, length, body = w.Flushed, w.Header().Get("Content-Length"), w.Body.Len()
			})
		}
		r := httptest.NewRequest("POST", "/v1/sandboxes", strings.NewReader(pythonCreate))
		r.RemoteAddr = "192.0.2.1:40000"
		r.Header.Set(HeaderClientID, "acme")
		r.Header.Set("Content-Type", "application/json")
		h.public.ServeHTTP(w, r)
		if !released {
			t.Fatal("the create's lease was never given back")
		}
		return flushed, length, body, w
	}

	t.Run("a roomy lease is given back once the whole answer is flushed, with its length", func(t *testing.T) {
		t.Parallel()
		flushed, length, body, w := answeredAtRelease(t, true)
		if w.Code != http.StatusCreated || w.Body.Len() == 0 {
			t.Fatalf("create = %d %s", w.Code, w.Body)
		}
		if !flushed || body != w.Body.Len() || length != fmt.Sprint(w.Body.Len()) {
			t.Fatalf("at the lease's release: flushed %v, Content-Length %q, %d bytes of %d; want the whole answer flushed with its length",
				flushed, length, body, w.Body.Len())
		}
	})

	t.Run("a handler that panics before answering with a roomy lease is a 500, its lease given back", func(t *testing.T) {
		t.Parallel()
		h := setup(t)
		h.leases.roomy = true
		released := make(chan struct{})
		h.leases.onRelease = func() { close(released) }
		h.sandboxes.create = func(sandbox.Plan) (*space.Sandbox, error) { panic("a bug") }
		w := h.do(h.public, "POST", "/v1/sandboxes", pythonCreate)
		if p := problemOf(t, w); w.Code != http.StatusInternalServerError || p.Code != space.EINTERNAL {
			t.Fatalf("a panicking create = %d %s, want a 500 problem", w.Code, w.Body)
		}
		select {
		case <-released:
		default:
			t.Fatal("the lease of a panicking create was not given back")
		}
	})

	t.Run("a lease that is not roomy is given back before the answer is flushed", func(t *testing.T) {
		t.Parallel()
		flushed, _, _, w := answeredAtRelease(t, false)
		if w.Code != http.StatusCreated {
			t.Fatalf("create = %d %s", w.Code, w.Body)
		}
		if flushed {
			t.Fatal("the answer was flushed before a lease near its cap was given back")
		}
	})

	t.Run("over a real connection, the caller has its whole answer while a roomy lease is still held", func(t *testing.T) {
		t.Parallel()
		h := setup(t)
		releasing, proceed := make(chan struct{}), make(chan struct{})
		h.leases.roomy = true
		h.leases.onRelease = func() {
			close(releasing)
			<-proceed // the place is given back only once the test has seen the answer
		}
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			r.RemoteAddr = "192.0.2.1:40000" // through the trusted gateway
			h.public.ServeHTTP(w, r)
		}))
		t.Cleanup(srv.Close)
		t.Cleanup(func() {
			select {
			case <-proceed:
			default:
				close(proceed)
			}
		})
		type answer struct {
			code int
			body []byte
			err  error
		}
		got := make(chan answer, 1)
		go func() {
			req, _ := http.NewRequest("POST", srv.URL+"/v1/sandboxes", strings.NewReader(pythonCreate))
			req.Header.Set(HeaderClientID, "acme")
			req.Header.Set("Content-Type", "application/json")
			resp, err := srv.Client().Do(req)
			if err != nil {
				got <- answer{err: err}
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			got <- answer{code: resp.StatusCode, body: b, err: err}
		}()
		<-releasing
		select {
		case a := <-got:
			var sb space.Sandbox
			if a.err != nil || a.code != http.StatusCreated || json.Unmarshal(a.body, &sb) != nil || sb.ID != running.ID {
				t.Fatalf("answer while the lease was held = %d %s %v", a.code, a.body, a.err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the caller had no whole answer while its roomy lease was held")
		}
		close(proceed)
	})
}
