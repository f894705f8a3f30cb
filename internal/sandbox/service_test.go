package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/config"
	"github.com/space-sandbox/space/internal/pool"
	"github.com/space-sandbox/space/internal/sandbox"
	"github.com/space-sandbox/space/internal/substrate"
	"github.com/space-sandbox/space/internal/testenv"
)

var (
	python = space.Shape{Template: "python-3.12", CPUMillis: 1000, MemoryMiB: 2048, DiskGiB: 10}
	node   = space.Shape{Template: "node-22", CPUMillis: 500, MemoryMiB: 1024, DiskGiB: 5}
)

// events is the one ordered record of charges and substrate calls, so tests can assert
// which came first.
type events struct {
	mu  sync.Mutex
	log []string
}

func (e *events) add(s string) {
	e.mu.Lock()
	e.log = append(e.log, s)
	e.mu.Unlock()
}

func (e *events) list() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.log...)
}

// charger records each charge and rejects while reject says so; Refused refuses,
// recording "refuse:<client>", while known says the refusal is known ahead.
type charger struct {
	events *events
	mu     sync.Mutex
	reject func(client space.ClientKey) bool
	known  func(client space.ClientKey) bool
	// during, when set, is called in each charge (a test's clock moved by it).
	during func()
	calls  map[space.ClientKey]int
	// held counts the holds CachedRefusal gave and nobody released yet.
	held atomic.Int64
}

func (c *charger) CachedRefusal(ch space.Charge) (space.Hold, *space.LimitError) {
	client, rate := ch.Key, ch.Rate
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.known == nil || !c.known(client) {
		c.held.Add(1)
		return &fakeHold{held: &c.held}, nil
	}
	c.events.add("refuse:" + string(client))
	return nil, &space.LimitError{Bucket: space.BucketClientActivation, Client: client, RetryAfter: time.Second, Limit: rate, FromMemory: true}
}

// fakeHold counts itself in held until it is released.
type fakeHold struct {
	held     *atomic.Int64
	released atomic.Bool
}

func (h *fakeHold) Release() {
	if !h.released.Swap(true) {
		h.held.Add(-1)
	}
}

func (c *charger) Charge(_ context.Context, ch space.Charge) (space.Charged, error) {
	client, rate := ch.Key, ch.Rate
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.during != nil {
		c.during()
	}
	if c.reject != nil && c.reject(client) {
		c.events.add("reject:" + string(client))
		return space.Charged{}, &space.LimitError{Bucket: space.BucketClientActivation, Client: client, RetryAfter: time.Second, Limit: rate}
	}
	c.events.add("charge:" + string(client))
	if c.calls == nil {
		c.calls = map[space.ClientKey]int{}
	}
	c.calls[client]++
	return space.Charged{}, nil
}

func (c *charger) count(client space.ClientKey) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[client]
}

type bundle struct {
	ctx     context.Context
	db      *pgxpool.Pool
	sim     *substrate.Simulated
	pool    *pool.Pool
	charger *charger
	events  *events
	svc     *sandbox.Service
	fail    func(c substrate.Call) error // set before use; nil fails nothing
	failMu  *sync.Mutex
}

func setup(t *testing.T) *bundle {
	t.Helper()
	b := &bundle{ctx: testenv.Context(t), db: testenv.DB(t), events: &events{}, failMu: &sync.Mutex{}}
	b.sim = substrate.NewSimulated(substrate.SimulatedOptions{Fail: func(c substrate.Call) error {
		b.events.add(string(c.Op))
		b.failMu.Lock()
		fail := b.fail
		b.failMu.Unlock()
		if fail != nil {
			return fail(c) // unlocked: a hook may block one call while others go on
		}
		return nil
	}})
	b.charger = &charger{events: b.events}
	b.pool = pool.New(pool.Options{DB: b.db, Substrate: b.sim})
	b.svc = sandbox.New(b.options())
	return b
}

// options are the Service's options on b's parts.
func (b *bundle) options() sandbox.Options {
	templates := substrate.Templates{
		python.Template: {Name: python.Template, Image: "python:3.12-slim", MaxDiskGiB: 50},
		node.Template:   {Name: node.Template, Image: "node:22-slim"},
	}
	return sandbox.Options{
		DB: b.db, Pool: b.pool, Substrate: b.sim, Charger: b.charger,
		Catalog:        sandbox.Catalog{Templates: templates, Max: space.Shape{CPUMillis: 8000, MemoryMiB: 16384, DiskGiB: 100}},
		IdempotencyTTL: config.Default().IdempotencyKeyTTL,
	}
}

func (b *bundle) setFail(f func(c substrate.Call) error) {
	b.failMu.Lock()
	b.fail = f
	b.failMu.Unlock()
}

// addReadySlots puts n ready slots of shape in the pool, warmed on the substrate.
func (b *bundle) addReadySlots(t *testing.T, shape space.Shape, n int) {
	t.Helper()
	for i := range n {
		id := fmt.Sprintf("00000000-0000-4000-8000-%012d", i+1+int(time.Now().UnixNano()%1e6)*100)
		ref, err := b.sim.Warm(b.ctx, id, shape, substrate.Template{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.db.Exec(b.ctx, `INSERT INTO pool_slots (id, template, cpu_millis, memory_mib, disk_gib, state, substrate_ref)
			VALUES ($6, $1, $2, $3, $4, 'ready', $5)`, shape.Template, shape.CPUMillis, shape.MemoryMiB, shape.DiskGiB, ref, id); err != nil {
			t.Fatal(err)
		}
	}
	b.events.mu.Lock()
	b.events.log = nil // the warm-ups are set-up, not the flow under test
	b.events.mu.Unlock()
}

func (b *bundle) readySlots(t *testing.T) int {
	t.Helper()
	var n int
	if err := b.db.QueryRow(b.ctx, "SELECT count(*) FROM pool_slots WHERE state = 'ready'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (b *bundle) count(t *testing.T, where string, args ...any) int {
	t.Helper()
	var n int
	if err := b.db.QueryRow(b.ctx, "SELECT count(*) FROM sandboxes WHERE "+where, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func acme() space.Caller {
	return space.Caller{ID: "acme", Key: "acme", LiveSandboxes: 100, ClientRate: &space.Rate{RefillRPS: 1, Burst: 10}}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestCreate(t *testing.T) {
	t.Parallel()

	t.Run("a warm hit adopts a slot of the exact shape and charges nothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.addReadySlots(t, node, 1) // another shape: must not be taken
		b.addReadySlots(t, python, 1)
		sb, err := create(b.svc, b.ctx, acme(), sandbox.CreateRequest{Shape: python})
		if err != nil {
			t.Fatal(err)
		}
		if !sb.Warm || sb.State != space.StateRunning || sb.SubstrateRef == "" {
			t.Fatalf("sandbox = %+v, want warm and running", sb)
		}
		if got := b.events.list(); !equal(got, []string{"adopt"}) {
			t.Fatalf("events = %v, want only the adoption", got)
		}
		if b.readySlots(t) != 1 {
			t.Fatalf("ready slots = %d, want the node slot left", b.readySlots(t))
		}
	})

	t.Run("a cold create is charged once, after the pool missed, then starts cold", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.addReadySlots(t, python, 1)
		other := python
		other.DiskGiB = 11 // one GiB off: not the slot's shape
		sb, err := create(b.svc, b.ctx, acme(), sandbox.CreateRequest{Shape: other, Metadata: map[string]string{"run": "42"}})
		if err != nil {
			t.Fatal(err)
		}
		if sb.Warm || sb.State != space.StateRunning || sb.Metadata["run"] != "42" {
			t.Fatalf("sandbox = %+v, want cold, running, with its metadata", sb)
		}
		if got := b.events.list(); !equal(got, []string{"charge:acme", "start_cold"}) {
			t.Fatalf("events = %v, want the charge then the cold start", got)
		}
	})

	t.Run("a start that waits on the substrate is idle (space.Idle); one that returns at once is not", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx := space.WithIdle(b.ctx, space.IdleFunc(func() { b.events.add("idle") }))
		// The simulated substrate's starts return at once: warm, cold, restore.
		b.addReadySlots(t, python, 1)
		if _, err := create(b.svc, ctx, acme(), sandbox.CreateRequest{Shape: python}); err != nil {
			t.Fatal(err)
		}
		sb, err := create(b.svc, ctx, acme(), sandbox.CreateRequest{Shape: python})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.svc.Pause(b.ctx, space.Caller{ID: "acme", Key: "acme"}, sb.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := b.svc.Restore(ctx, acme(), sb.ID); err != nil {
			t.Fatal(err)
		}
		want := []string{"adopt", "charge:acme", "start_cold", "snapshot", "charge:acme", "restore"}
		if got := b.events.list(); !equal(got, want) {
			t.Fatalf("events = %v, want %v and never idle", got, want)
		}

		// A cold start held at the substrate: idle once it has waited, after the
		// charge, and the create still ends well once the start returns.
		b2 := setup(t)
		ctx2 := space.WithIdle(b2.ctx, space.IdleFunc(func() { b2.events.add("idle") }))
		release := b2.holdColdStarts()
		created := make(chan error, 1)
		go func() {
			_, err := create(b2.svc, ctx2, acme(), sandbox.CreateRequest{Shape: python})
			created <- err
		}()
		waitFor(t, "the held start to be idle", func() bool { return len(b2.events.list()) == 3 })
		close(release)
		if err := <-created; err != nil {
			t.Fatalf("create after an idle start = %v", err)
		}
		if want, got := []string{"charge:acme", "start_cold", "idle"}, b2.events.list(); !equal(got, want) {
			t.Fatalf("events = %v, want %v", got, want)
		}
	})

	t.Run("a shape that does not resolve is refused without a charge or a sandbox", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for _, tc := range []struct {
			name  string
			shape space.Shape
			field string
		}{
			{"unknown template", space.Shape{Template: "cobol-85", CPUMillis: 1, MemoryMiB: 1, DiskGiB: 1}, "template"},
			{"disk over the global cap", space.Shape{Template: "node-22", CPUMillis: 1, MemoryMiB: 1, DiskGiB: 101}, "disk_gib"},
			{"disk over the template's cap", space.Shape{Template: "python-3.12", CPUMillis: 1, MemoryMiB: 1, DiskGiB: 51}, "disk_gib"},
			{"cpu over the global cap", space.Shape{Template: "node-22", CPUMillis: 8001, MemoryMiB: 1, DiskGiB: 1}, "cpu_millis"},
		} {
			_, err := create(b.svc, b.ctx, acme(), sandbox.CreateRequest{Shape: tc.shape})
			var de *space.Error
			if !errors.As(err, &de) || de.Code != space.EUNPROCESSABLE || de.Field != tc.field {
				t.Errorf("%s: err = %v, want unprocessable naming %s", tc.name, err, tc.field)
			}
		}
		if got := b.events.list(); len(got) != 0 {
			t.Fatalf("events = %v, want no charge and no substrate call", got)
		}
		if n := b.count(t, "true"); n != 0 {
			t.Fatalf("%d sandboxes left behind", n)
		}
	})

	t.Run("a bad request is refused before anything is touched", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.addReadySlots(t, python, 1)
		bad := python
		bad.CPUMillis = 0
		_, err := create(b.svc, b.ctx, acme(), sandbox.CreateRequest{Shape: bad})
		var de *space.Error
		if !errors.As(err, &de) || de.Code != space.EINVALID || de.Field != "cpu_millis" {
			t.Fatalf("err = %v, want invalid cpu_millis", err)
		}
		if b.readySlots(t) != 1 || len(b.events.list()) != 0 {
			t.Fatal("a bad request claimed a slot or charged")
		}
	})

	t.Run("a rejected charge leaves no sandbox and starts nothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.charger.reject = func(space.ClientKey) bool { return true }
		_, err := create(b.svc, b.ctx, acme(), sandbox.CreateRequest{Shape: python})
		var le *space.LimitError
		if !errors.As(err, &le) || le.Bucket != space.BucketClientActivation {
			t.Fatalf("err = %v, want the charger's limit error", err)
		}
		if got := b.events.list(); !equal(got, []string{"reject:acme"}) {
			t.Fatalf("events = %v, want only the rejection", got)
		}
		if n := b.count(t, "true"); n != 0 {
			t.Fatalf("%d sandboxes left behind by a rejected create", n)
		}
	})

	t.Run("a client at its live cap claims no slot and is charged nothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		caller := acme()
		caller.LiveSandboxes = 1
		if _, err := create(b.svc, b.ctx, caller, sandbox.CreateRequest{Shape: node}); err != nil {
			t.Fatal(err)
		}
		b.addReadySlots(t, python, 1)
		_, err := create(b.svc, b.ctx, caller, sandbox.CreateRequest{Shape: python})
		var le *space.LimitError
		if !errors.As(err, &le) || le.Bucket != space.BucketLiveSandboxCap || le.Cap != 1 {
			t.Fatalf("err = %v, want live_sandbox_cap with cap 1", err)
		}
		if b.readySlots(t) != 1 || len(b.events.list()) != 0 {
			t.Fatalf("over the cap: ready slots %d, events %v; want the slot untouched and nothing charged", b.readySlots(t), b.events.list())
		}
	})

	t.Run("an attempt that loses the race to insert its fixed id keeps no slot claim", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.addReadySlots(t, python, 1)
		id := uuid.NewString()
		// Another attempt's row, inserted and not yet committed: the create's lookup
		// does not see it, and its insert waits on it, then fails.
		other, err := b.db.Begin(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer other.Rollback(b.ctx)
		if _, err := other.Exec(b.ctx, `INSERT INTO sandboxes (id, client, budget_key, state, template, cpu_millis, memory_mib, disk_gib)
			VALUES ($1, 'acme', 'acme', 'starting', $2, $3, $4, $5)`, id, python.Template, python.CPUMillis, python.MemoryMiB, python.DiskGiB); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := create(b.svc, b.ctx, acme(), sandbox.CreateRequest{Shape: python, ID: id})
			done <- err
		}()
		testenv.Eventually(t, 10*time.Second, "the create's insert waits on the other attempt's row", func() bool {
			var waiting int
			err := b.db.QueryRow(b.ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE 'INSERT INTO sandboxes%'`).Scan(&waiting)
			return err == nil && waiting == 1
		})
		if err := other.Commit(b.ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-done; !errors.Is(err, sandbox.ErrSettling) {
			t.Fatalf("create = %v, want ErrSettling", err)
		}
		// The claim went in the transaction of the failed insert: rolled back with it.
		if n := b.readySlots(t); n != 1 {
			t.Fatalf("%d ready slots, want the one slot still ready", n)
		}
		if got := b.events.list(); len(got) != 0 {
			t.Fatalf("events = %v, want nothing charged or started", got)
		}
	})

	t.Run("concurrent creates over the live cap leave exactly the cap live", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		const capN, extra = 5, 7
		caller := acme()
		caller.LiveSandboxes = capN
		var wg sync.WaitGroup
		errs := make(chan error, capN+extra)
		for range capN + extra {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := create(b.svc, b.ctx, caller, sandbox.CreateRequest{Shape: python})
				errs <- err
			}()
		}
		wg.Wait()
		close(errs)
		rejected := 0
		for err := range errs {
			var le *space.LimitError
			switch {
			case err == nil:
			case errors.As(err, &le) && le.Bucket == space.BucketLiveSandboxCap:
				rejected++
			default:
				t.Errorf("unexpected error: %v", err)
			}
		}
		if live := b.count(t, "client = 'acme' AND state = 'running'"); live != capN || rejected != extra {
			t.Fatalf("live = %d, rejected = %d; want %d and %d", live, rejected, capN, extra)
		}
		if got := b.charger.count("acme"); got != capN {
			t.Fatalf("charged %d times, want %d: a capped create must not be charged", got, capN)
		}
	})

	t.Run("pausing a sandbox frees a live place", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		caller := acme()
		caller.LiveSandboxes = 1
		sb, err := create(b.svc, b.ctx, caller, sandbox.CreateRequest{Shape: python})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := create(b.svc, b.ctx, caller, sandbox.CreateRequest{Shape: python}); space.ErrorCode(err) != space.ELIMITED {
			t.Fatalf("second create = %v, want limited", err)
		}
		if _, err := b.svc.Pause(b.ctx, space.Caller{ID: "acme", Key: "acme"}, sb.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := create(b.svc, b.ctx, caller, sandbox.CreateRequest{Shape: python}); err != nil {
			t.Fatalf("create after pause = %v, want the freed place", err)
		}
	})

	t.Run("fifty concurrent creates against ten ready slots make exactly ten warm hits", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.addReadySlots(t, python, 10)
		var wg sync.WaitGroup
		results := make(chan *space.Sandbox, 50)
		for range 50 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sb, err := create(b.svc, b.ctx, acme(), sandbox.CreateRequest{Shape: python})
				if err != nil {
					t.Error(err)
					return
				}
				results <- sb
			}()
		}
		wg.Wait()
		close(results)
		warm, cold := 0, 0
		refs := map[string]bool{}
		for sb := range results {
			if refs[sb.SubstrateRef] {
				t.Errorf("substrate ref %s given to two sandboxes", sb.SubstrateRef)
			}
			refs[sb.SubstrateRef] = true
			if sb.Warm {
				warm++
			} else {
				cold++
			}
		}
		if warm != 10 || cold != 40 {
			t.Fatalf("warm = %d, cold = %d; want 10 and 40", warm, cold)
		}
		if got := b.charger.count("acme"); got != 40 {
			t.Fatalf("charged %d times, want 40 (the cold ones only)", got)
		}
		if b.readySlots(t) != 0 {
			t.Fatalf("%d ready slots left", b.readySlots(t))
		}
	})

	t.Run("a failed cold start leaves the sandbox failed and the token spent", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.setFail(func(c substrate.Call) error {
			if c.Op == substrate.OpStartCold {
				return errors.New("image pull backoff")
			}
			return nil
		})
		_, err := create(b.svc, b.ctx, acme(), sandbox.CreateRequest{Shape: python})
		if space.ErrorCode(err) != space.EUNAVAILABLE {
			t.Fatalf("err = %v, want unavailable", err)
		}
		if n := b.count(t, "state = 'failed' AND last_error LIKE '%image pull backoff%'"); n != 1 {
			t.Fatalf("%d failed sandboxes recording the cause, want 1", n)
		}
		if b.charger.count("acme") != 1 {
			t.Fatal("the token was not spent (or spent twice)")
		}
		if b.count(t, "state <> 'failed'") != 0 {
			t.Fatal("something else changed")
		}
	})

	t.Run("a slot that cannot be adopted is discarded and the create goes cold", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.addReadySlots(t, python, 1)
		b.setFail(func(c substrate.Call) error {
			if c.Op == substrate.OpAdopt {
				return errors.New("slot vanished")
			}
			return nil
		})
		sb, err := create(b.svc, b.ctx, acme(), sandbox.CreateRequest{Shape: python})
		if err != nil {
			t.Fatal(err)
		}
		if sb.Warm {
			t.Fatal("a failed adoption reported warm")
		}
		if got := b.events.list(); !equal(got, []string{"adopt", "stop", "charge:acme", "start_cold"}) {
			t.Fatalf("events = %v", got)
		}
		var slots int
		if err := b.db.QueryRow(b.ctx, "SELECT count(*) FROM pool_slots").Scan(&slots); err != nil || slots != 0 {
			t.Fatalf("slots left = %d (%v), want the broken one gone", slots, err)
		}
	})
}

func TestLifecycle(t *testing.T) {
	t.Parallel()

	t.Run("pause then restore charges the restore and runs it from the snapshot", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		sb, err := create(b.svc, b.ctx, acme(), sandbox.CreateRequest{Shape: python})
		if err != nil {
			t.Fatal(err)
		}
		paused, err := b.svc.Pause(b.ctx, space.Caller{ID: "acme", Key: "acme"}, sb.ID)
		if err != nil || paused.State != space.StatePaused || paused.SnapshotRef == "" || paused.SubstrateRef != "" {
			t.Fatalf("pause = %+v, %v", paused, err)
		}
		if b.sim.IsRunning(sb.SubstrateRef) {
			t.Fatal("a paused sandbox still runs on the substrate")
		}
		restored, err := b.svc.Restore(b.ctx, acme(), sb.ID)
		if err != nil || restored.State != space.StateRunning || restored.Warm {
			t.Fatalf("restore = %+v, %v", restored, err)
		}
		if got := b.events.list(); !equal(got, []string{"charge:acme", "start_cold", "snapshot", "charge:acme", "restore"}) {
			t.Fatalf("events = %v", got)
		}
	})

	t.Run("a warm restore loads the snapshot into a slot and charges nothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		sb, _ := create(b.svc, b.ctx, acme(), sandbox.CreateRequest{Shape: python})
		if _, err := b.svc.Pause(b.ctx, space.Caller{ID: "acme", Key: "acme"}, sb.ID); err != nil {
			t.Fatal(err)
		}
		b.addReadySlots(t, python, 1)
		restored, err := b.svc.Restore(b.ctx, acme(), sb.ID)
		if err != nil || !restored.Warm || restored.State != space.StateRunning {
			t.Fatalf("restore = %+v, %v", restored, err)
		}
		if got := b.events.list(); !equal(got, []string{"restore"}) {
			t.Fatalf("events = %v, want only the restore into the slot", got)
		}
	})

	t.Run("transitions the state does not allow are conflicts", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		sb, _ := create(b.svc, b.ctx, acme(), sandbox.CreateRequest{Shape: python})
		if _, err := b.svc.Restore(b.ctx, acme(), sb.ID); space.ErrorCode(err) != space.ECONFLICT {
			t.Fatalf("restore of a running sandbox = %v, want conflict", err)
		}
		if _, err := b.svc.Pause(b.ctx, space.Caller{ID: "acme", Key: "acme"}, sb.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := b.svc.Pause(b.ctx, space.Caller{ID: "acme", Key: "acme"}, sb.ID); space.ErrorCode(err) != space.ECONFLICT {
			t.Fatalf("pause of a paused sandbox = %v, want conflict", err)
		}
		if b.charger.count("acme") != 1 {
			t.Fatal("a refused transition was charged")
		}
	})

	t.Run("another client's sandbox is not found", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		sb, _ := create(b.svc, b.ctx, acme(), sandbox.CreateRequest{Shape: python})
		globex := space.Caller{ID: "globex", Key: "globex"}
		checks := map[string]error{}
		_, checks["get"] = b.svc.Get(b.ctx, "globex", sb.ID)
		_, checks["pause"] = b.svc.Pause(b.ctx, space.Caller{ID: "globex", Key: "globex"}, sb.ID)
		_, checks["restore"] = b.svc.Restore(b.ctx, globex, sb.ID)
		_, checks["delete"] = b.svc.Delete(b.ctx, "globex", sb.ID)
		for op, err := range checks {
			if space.ErrorCode(err) != space.ENOTFOUND {
				t.Errorf("%s of another client's sandbox = %v, want not found", op, err)
			}
		}
		if got, err := b.svc.Get(b.ctx, "acme", sb.ID); err != nil || got.State != space.StateRunning {
			t.Fatalf("the owner's sandbox changed: %+v %v", got, err)
		}
	})

	t.Run("delete stops the sandbox and is idempotent", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		sb, _ := create(b.svc, b.ctx, acme(), sandbox.CreateRequest{Shape: python})
		for range 2 {
			if _, err := b.svc.Delete(b.ctx, "acme", sb.ID); err != nil {
				t.Fatal(err)
			}
		}
		got, _ := b.svc.Get(b.ctx, "acme", sb.ID)
		if got.State != space.StateTerminated || b.sim.IsRunning(sb.SubstrateRef) {
			t.Fatalf("after delete: %+v, running %v", got, b.sim.IsRunning(sb.SubstrateRef))
		}
	})

	t.Run("a wake is charged to the owner and is a no-op for a running sandbox", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		sb, _ := create(b.svc, b.ctx, acme(), sandbox.CreateRequest{Shape: python})
		if _, err := b.svc.Pause(b.ctx, space.Caller{ID: "acme", Key: "acme"}, sb.ID); err != nil {
			t.Fatal(err)
		}
		owner, err := b.svc.Owner(b.ctx, sb.ID)
		if err != nil || owner != "acme" {
			t.Fatalf("owner = %q, %v", owner, err)
		}
		woken, err := b.svc.Wake(b.ctx, space.Caller{ID: space.ClientID(owner), Key: space.ClientKey(owner)}, sb.ID)
		if err != nil || woken.State != space.StateRunning {
			t.Fatalf("wake = %+v, %v", woken, err)
		}
		if b.charger.count("acme") != 2 || b.charger.count(space.Unknown) != 0 {
			t.Fatalf("charges: acme %d, unknown %d; want the wake on acme", b.charger.count("acme"), b.charger.count(space.Unknown))
		}
		again, err := b.svc.Wake(b.ctx, space.Caller{ID: space.ClientID(owner), Key: space.ClientKey(owner)}, sb.ID)
		if err != nil || again.State != space.StateRunning || b.charger.count("acme") != 2 {
			t.Fatalf("second wake = %+v, %v; want a free no-op", again, err)
		}
	})

	t.Run("a failed restore leaves the sandbox paused with its snapshot", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		sb, _ := create(b.svc, b.ctx, acme(), sandbox.CreateRequest{Shape: python})
		paused, _ := b.svc.Pause(b.ctx, space.Caller{ID: "acme", Key: "acme"}, sb.ID)
		b.setFail(func(c substrate.Call) error {
			if c.Op == substrate.OpRestore {
				return errors.New("snapshot store down")
			}
			return nil
		})
		if _, err := b.svc.Restore(b.ctx, acme(), sb.ID); space.ErrorCode(err) != space.EUNAVAILABLE {
			t.Fatalf("restore = %v, want unavailable", err)
		}
		got, _ := b.svc.Get(b.ctx, "acme", sb.ID)
		if got.State != space.StatePaused || got.SnapshotRef != paused.SnapshotRef || got.LastError == "" {
			t.Fatalf("after a failed restore: %+v", got)
		}
	})

	t.Run("a malformed id never reaches a query", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for _, id := range []string{"", "1", "'; DROP TABLE sandboxes; --", "00000000-0000-0000-0000-00000000000g"} {
			if _, err := b.svc.Get(b.ctx, "acme", id); space.ErrorCode(err) != space.EINVALID {
				t.Errorf("get %q = %v, want invalid", id, err)
			}
		}
	})
}

func TestList(t *testing.T) {
	t.Parallel()

	t.Run("pages through a client's own sandboxes, newest first", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var ids []string
		for range 5 {
			sb, err := create(b.svc, b.ctx, acme(), sandbox.CreateRequest{Shape: python})
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, sb.ID)
		}
		if _, err := create(b.svc, b.ctx, space.Caller{ID: "globex", Key: "globex"}, sandbox.CreateRequest{Shape: python}); err != nil {
			t.Fatal(err)
		}
		var seen []string
		token := ""
		for pages := 0; ; pages++ {
			page, err := b.svc.List(b.ctx, "acme", 2, token)
			if err != nil {
				t.Fatal(err)
			}
			for _, sb := range page.Sandboxes {
				if sb.Client != "acme" {
					t.Fatalf("listed %s's sandbox", sb.Client)
				}
				seen = append(seen, sb.ID)
			}
			if token = page.NextPageToken; token == "" {
				break
			}
			if pages > 5 {
				t.Fatal("pagination does not end")
			}
		}
		if len(seen) != 5 {
			t.Fatalf("listed %d sandboxes, want 5", len(seen))
		}
		for i := range seen {
			if seen[i] != ids[len(ids)-1-i] {
				t.Fatalf("order = %v, want newest first %v", seen, ids)
			}
		}
	})

	t.Run("a bad limit or page token is invalid", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		if _, err := b.svc.List(b.ctx, "acme", 501, ""); space.ErrorCode(err) != space.EINVALID {
			t.Fatalf("limit 501 = %v", err)
		}
		if _, err := b.svc.List(b.ctx, "acme", 10, "bm9wZQ"); space.ErrorCode(err) != space.EINVALID {
			t.Fatalf("forged token = %v", err)
		}
	})
}

func TestOutage(t *testing.T) {
	t.Parallel()

	t.Run("postgres unreachable is unavailable, and the service recovers", func(t *testing.T) {
		t.Parallel()
		url, proxy := testenv.ProxyDatabaseURL(t, testenv.DatabaseURL(t))
		db := testenv.Pool(t, url)
		sim := substrate.NewSimulated(substrate.SimulatedOptions{})
		svc := sandbox.New(sandbox.Options{
			DB: db, Pool: pool.New(pool.Options{DB: db, Substrate: sim}), Substrate: sim, Charger: &charger{events: &events{}},
			Catalog: sandbox.Catalog{Templates: substrate.Templates{python.Template: {Image: "python"}}},
		})
		ctx := testenv.Context(t)
		proxy.Cut()
		if _, err := create(svc, ctx, acme(), sandbox.CreateRequest{Shape: python}); space.ErrorCode(err) != space.EUNAVAILABLE {
			t.Fatalf("create with postgres down = %v, want unavailable", err)
		}
		if _, err := svc.List(ctx, "acme", 10, ""); space.ErrorCode(err) != space.EUNAVAILABLE {
			t.Fatalf("list with postgres down = %v, want unavailable", err)
		}
		proxy.Restore()
		testenv.Eventually(t, 10*time.Second, "create to succeed again", func() bool {
			_, err := create(svc, ctx, acme(), sandbox.CreateRequest{Shape: python})
			return err == nil
		})
	})
}

// create makes req for caller at once, as a synchronous create does, with no
// concurrency cap.
func create(svc *sandbox.Service, ctx context.Context, caller space.Caller, req sandbox.CreateRequest) (*space.Sandbox, error) {
	sb, _, err := svc.Create(ctx, caller, req, nil)
	return sb, err
}
