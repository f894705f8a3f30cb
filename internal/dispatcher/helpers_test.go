package dispatcher_test

import (
	"cmp"
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/riverqueue/river"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/admission"
	"github.com/space-sandbox/space/internal/config"
	"github.com/space-sandbox/space/internal/dispatcher"
	"github.com/space-sandbox/space/internal/pool"
	"github.com/space-sandbox/space/internal/sandbox"
	"github.com/space-sandbox/space/internal/substrate"
	"github.com/space-sandbox/space/internal/testenv"
)

var python = space.Shape{Template: "python-3.12", CPUMillis: 1000, MemoryMiB: 2048, DiskGiB: 10}

var templates = substrate.Templates{
	python.Template: {Name: python.Template, Image: "python:3.12-slim", MaxDiskGiB: 50},
}

// limits is a Callers the tests set per client: each client id is its own budget key;
// a client with no entry has no client bucket and no live cap.
type limits struct {
	mu sync.Mutex
	m  map[space.ClientID]space.Caller
}

func (l *limits) Resolve(_ context.Context, id space.ClientID) space.Caller {
	l.mu.Lock()
	defer l.mu.Unlock()
	if got, ok := l.m[id]; ok {
		return got
	}
	return space.Caller{ID: id, Key: space.ClientKey(id)}
}

func (l *limits) set(id space.ClientID, rate *space.Rate, live int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.m[id] = space.Caller{ID: id, Key: space.ClientKey(id), ClientRate: rate, LiveSandboxes: live}
}

// bundle is one test's world: its own database, its own Redis keys, a real sandbox
// flow on the simulated substrate, and a dispatcher with real River workers.
type bundle struct {
	t        testing.TB
	ctx      context.Context
	db       *pgxpool.Pool
	redis    redis.UniversalClient
	admitter *admission.Admitter
	sim      *substrate.Simulated
	svc      *sandbox.Service
	limits   *limits
	d        *dispatcher.Dispatcher
	// reg holds the first dispatcher's series (a registry takes one dispatcher).
	reg *prometheus.Registry

	failMu sync.Mutex
	fail   func(substrate.Call) error
}

type setupOptions struct {
	workers     int // default 4; -1 for an insert-only dispatcher
	deadline    time.Duration
	maxSnooze   time.Duration
	maxAttempts int
	latency     time.Duration // of every substrate call
	jobTimeout  time.Duration
	rescueAfter time.Duration
	settleWait  time.Duration
	ownerLanes  int // default the operator default (config.Default)
}

func setup(t testing.TB, o setupOptions) *bundle {
	t.Helper()
	b := &bundle{t: t, ctx: testenv.Context(t), db: testenv.DB(t), redis: testenv.Redis(t),
		limits: &limits{m: map[space.ClientID]space.Caller{}}}
	var err error
	b.admitter, err = admission.New(admission.Options{
		Redis: b.redis, Prefix: testenv.Prefix(t), Enabled: true,
		Cluster: space.Rate{RefillRPS: 1000, Burst: 10000},
		Timeout: time.Second, BatchAbove: admission.DefaultBatchAbove,
	})
	if err != nil {
		t.Fatal(err)
	}
	lat := map[substrate.Op]time.Duration{}
	for _, op := range []substrate.Op{substrate.OpStartCold, substrate.OpRestore, substrate.OpSnapshot, substrate.OpAdopt} {
		lat[op] = o.latency
	}
	b.sim = substrate.NewSimulated(substrate.SimulatedOptions{Latency: lat, Fail: func(c substrate.Call) error {
		b.failMu.Lock()
		fail := b.fail
		b.failMu.Unlock()
		if fail != nil {
			return fail(c) // unlocked: a hook may block one call while others go on
		}
		return nil
	}})
	b.svc = sandbox.New(sandbox.Options{
		DB: b.db, Pool: pool.New(pool.Options{DB: b.db, Substrate: b.sim}), Substrate: b.sim,
		Charger: b.admitter, Catalog: sandbox.Catalog{Templates: templates},
		IdempotencyTTL: config.Default().IdempotencyKeyTTL,
	})
	b.d = b.dispatcher(o)
	return b
}

// dispatcher starts another dispatcher (another River client) on b's database,
// stopped when the test ends.
func (b *bundle) dispatcher(o setupOptions) *dispatcher.Dispatcher {
	b.t.Helper()
	workers := o.workers
	switch workers {
	case 0:
		workers = 4
	case -1:
		workers = 0
	}
	var reg prometheus.Registerer
	if b.reg == nil {
		b.reg = prometheus.NewRegistry()
		reg = b.reg
	}
	defaults := config.Default()
	d, err := dispatcher.New(dispatcher.Options{
		DB: b.db, Sandboxes: b.svc, Callers: b.limits, Registerer: reg,
		Workers:           workers,
		AdmissionDeadline: cmp.Or(o.deadline, defaults.Dispatcher.AdmissionDeadline),
		MaxSnooze:         cmp.Or(o.maxSnooze, defaults.Dispatcher.MaxSnooze),
		MaxAttempts:       cmp.Or(o.maxAttempts, defaults.Dispatcher.MaxAttempts),
		OwnerLanes:        cmp.Or(o.ownerLanes, defaults.Dispatcher.OwnerLanes),
		IdempotencyTTL:    defaults.IdempotencyKeyTTL,
		BudgetKeys:        defaults.MetricsBudgetKeys,
		JobTimeout:        cmp.Or(o.jobTimeout, 10*time.Minute), // above any run of these tests
		RescueAfter:       o.rescueAfter,
		SettleWait:        o.settleWait,
		Backoff:           func(int) time.Duration { return 100 * time.Millisecond },
		River: func(c *river.Config) {
			c.TestOnly = true
			c.FetchCooldown = 10 * time.Millisecond
			c.FetchPollInterval = 50 * time.Millisecond
		},
	})
	if err != nil {
		b.t.Fatal(err)
	}
	if err := d.Start(b.ctx); err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := d.Stop(ctx); err != nil {
			b.t.Errorf("stop dispatcher: %v", err)
		}
	})
	return d
}

func (b *bundle) setFail(f func(substrate.Call) error) {
	b.failMu.Lock()
	b.fail = f
	b.failMu.Unlock()
}

// drain empties client's bucket of rate, so that the next activation is rejected.
func (b *bundle) drain(client space.ClientKey, rate space.Rate) {
	b.t.Helper()
	for i := int64(0); i < rate.Burst; i++ {
		if _, err := b.admitter.Charge(b.ctx, space.Charge{Key: client, Rate: &rate, Cost: 1}); err != nil {
			b.t.Fatalf("draining %s: %v", client, err)
		}
	}
}

// tokens is what client's bucket of rate holds now (a Report takes none).
func (b *bundle) tokens(client space.ClientKey, rate space.Rate) float64 {
	b.t.Helper()
	d, _, err := b.admitter.Report(b.ctx, space.Charge{Key: client, Rate: &rate, Cost: 1})
	if err != nil || d.Client == nil {
		b.t.Fatalf("peek %s: %+v %v", client, d, err)
	}
	return d.Client.Remaining
}

func (b *bundle) create(client space.ClientID, key string) *space.Operation {
	b.t.Helper()
	op, _, err := b.enqueueCreate(client, sandbox.CreateRequest{Shape: python, IdempotencyKey: key})
	if err != nil {
		b.t.Fatalf("enqueue create for %s: %v", client, err)
	}
	return op
}

// enqueueCreate plans req for client and queues it, as the API does with a create that
// prefers respond-async.
func (b *bundle) enqueueCreate(client space.ClientID, req sandbox.CreateRequest) (*space.Operation, bool, error) {
	req.Async = true
	plan, err := b.svc.Plan(b.limits.Resolve(b.ctx, client), req)
	if err != nil {
		return nil, false, err
	}
	return b.d.Enqueue(b.ctx, dispatcher.Request{Kind: space.OperationCreate, Client: client, Create: &plan, IdempotencyKey: req.IdempotencyKey})
}

func (b *bundle) get(id string) *space.Operation {
	b.t.Helper()
	op, err := b.d.GetAny(b.ctx, id)
	if err != nil {
		b.t.Fatalf("get operation %s: %v", id, err)
	}
	return op
}

// wait polls operation id until cond holds.
func (b *bundle) wait(id string, what string, cond func(*space.Operation) bool) *space.Operation {
	b.t.Helper()
	var op *space.Operation
	testenv.Eventually(b.t, 20*time.Second, what, func() bool {
		op = b.get(id)
		return cond(op)
	})
	return op
}

// waitDone waits for operation id to be final, and for River to have recorded its
// job's outcome too (River writes it after the worker returns).
func (b *bundle) waitDone(id string) *space.Operation {
	b.t.Helper()
	return b.wait(id, "operation "+id+" to finish", func(op *space.Operation) bool {
		if !op.State.Done() {
			return false
		}
		switch b.job(id).State {
		case "completed", "discarded", "cancelled":
			return true
		}
		return false
	})
}

// waitIdle waits until cond holds for operation id while its job is not running (a
// running job has had its attempt counted provisionally by River's fetch).
func (b *bundle) waitIdle(id string, what string, cond func(*space.Operation) bool) (*space.Operation, job) {
	b.t.Helper()
	var j job
	op := b.wait(id, what, func(op *space.Operation) bool {
		if !cond(op) {
			return false
		}
		j = b.job(id)
		return j.State != "running"
	})
	return op, j
}

// job is River's row of an operation's job.
type job struct {
	State    string
	Attempt  int
	Errors   int
	Snoozes  int
	ErrorsAt []time.Time
}

func (b *bundle) job(opID string) job {
	b.t.Helper()
	var j job
	var meta []byte
	err := b.db.QueryRow(b.ctx, `SELECT j.state::text, j.attempt, coalesce(array_length(j.errors, 1), 0), j.metadata,
			coalesce(ARRAY(SELECT (e->>'at')::timestamptz FROM unnest(j.errors) e), '{}')
		FROM river_job j JOIN operations o ON o.job_id = j.id WHERE o.id = $1`, opID).
		Scan(&j.State, &j.Attempt, &j.Errors, &meta, &j.ErrorsAt)
	if err != nil {
		b.t.Fatalf("river job of operation %s: %v", opID, err)
	}
	var m struct{ Snoozes int }
	_ = json.Unmarshal(meta, &m)
	j.Snoozes = m.Snoozes
	return j
}

func (b *bundle) count(sql string, args ...any) int {
	b.t.Helper()
	var n int
	if err := b.db.QueryRow(b.ctx, sql, args...).Scan(&n); err != nil {
		b.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// create makes req for caller at once, as a synchronous create does, with no
// concurrency cap.
func create(svc *sandbox.Service, ctx context.Context, caller space.Caller, req sandbox.CreateRequest) (*space.Sandbox, error) {
	sb, _, err := svc.Create(ctx, caller, req, nil)
	return sb, err
}
