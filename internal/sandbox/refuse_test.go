package sandbox_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/pool"
	"github.com/space-sandbox/space/internal/sandbox"
	"github.com/space-sandbox/space/internal/substrate"
)

// view is a running pool.View on b's database whose targets the test sets, and a
// signal of its changes.
type view struct {
	*pool.View
	mu      sync.Mutex
	targets []pool.Target
	changes chan struct{}
}

// waitCold waits until the view says shape is cold: synced and current.
func (v *view) waitCold(shape space.Shape) {
	for !v.Cold(shape) {
		<-v.changes
	}
}

func (v *view) setTargets(ts ...pool.Target) {
	v.mu.Lock()
	v.targets = ts
	v.mu.Unlock()
}

// setupRefusing is setup with a Service whose early refusal works: a pool view that
// has synced once.
func setupRefusing(t *testing.T) (*bundle, *view) {
	t.Helper()
	b := setup(t)
	v := &view{changes: make(chan struct{}, 64)}
	v.View = pool.NewView(pool.ViewOptions{DB: b.db, Resync: time.Second,
		Targets: func(context.Context) ([]pool.Target, error) {
			v.mu.Lock()
			defer v.mu.Unlock()
			return append([]pool.Target(nil), v.targets...), nil
		},
		OnChange: func() {
			select {
			case v.changes <- struct{}{}:
			default:
			}
		}})
	go v.Run(b.ctx)
	<-v.changes // the first sync
	opts := b.options()
	opts.View = v.View
	b.svc = sandbox.New(opts)
	return b, v
}

// countInserts makes the test's database count every sandbox row ever inserted, in a
// table of its own: a booked-then-undone row leaves no sandbox but counts there.
func (b *bundle) countInserts(t *testing.T) {
	t.Helper()
	for _, sql := range []string{
		"CREATE TABLE sandbox_inserts (n int NOT NULL)",
		"INSERT INTO sandbox_inserts VALUES (0)",
		`CREATE FUNCTION count_sandbox_insert() RETURNS trigger LANGUAGE plpgsql AS
			$$ BEGIN UPDATE sandbox_inserts SET n = n + 1; RETURN NEW; END $$`,
		"CREATE TRIGGER count_sandbox_insert AFTER INSERT ON sandboxes FOR EACH ROW EXECUTE FUNCTION count_sandbox_insert()",
	} {
		if _, err := b.db.Exec(b.ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
}

func (b *bundle) inserted(t *testing.T) int {
	t.Helper()
	var n int
	if err := b.db.QueryRow(b.ctx, "SELECT n FROM sandbox_inserts").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestEarlyRefusal(t *testing.T) {
	t.Parallel()
	always := func(space.ClientKey) bool { return true }

	t.Run("a client known refused is refused without a booking or a charge", func(t *testing.T) {
		t.Parallel()
		b, v := setupRefusing(t)
		b.countInserts(t)
		b.charger.known = always
		for i := range 3 {
			v.waitCold(python)
			_, err := create(b.svc, b.ctx, acme(), sandbox.CreateRequest{Shape: python})
			var le *space.LimitError
			if !errors.As(err, &le) || le.Bucket != space.BucketClientActivation || le.Client != "acme" {
				t.Fatalf("create %d: err = %v, want the known client_activation refusal", i, err)
			}
		}
		if got := b.events.list(); !equal(got, []string{"refuse:acme", "refuse:acme", "refuse:acme"}) {
			t.Fatalf("events = %v, want three refusals and nothing else", got)
		}
		if n := b.inserted(t); n != 0 {
			t.Fatalf("%d rows booked for refused creates", n)
		}
	})

	t.Run("every create let through gives back its hold, however it ends", func(t *testing.T) {
		t.Parallel()
		b, v := setupRefusing(t)
		capped := acme()
		capped.ID, capped.Key, capped.LiveSandboxes = "initech", "initech", 1
		v.waitCold(python)
		for _, tc := range []struct {
			name   string
			caller space.Caller
			req    sandbox.CreateRequest
			reject bool
			ok     bool
		}{
			{"admitted cold", acme(), sandbox.CreateRequest{Shape: python}, false, true},
			{"refused by the charge", acme(), sandbox.CreateRequest{Shape: python}, true, false},
			{"the first under the live cap", capped, sandbox.CreateRequest{Shape: python}, false, true},
			{"refused by the live cap", capped, sandbox.CreateRequest{Shape: python}, false, false},
			{"under an idempotency key", acme(), sandbox.CreateRequest{Shape: python, IdempotencyKey: "k-1"}, false, true},
			{"a repeat under the key", acme(), sandbox.CreateRequest{Shape: python, IdempotencyKey: "k-1"}, false, true},
			{"with a fixed id", acme(), sandbox.CreateRequest{Shape: python, ID: "00000000-0000-4000-8000-00000000c0de"}, false, true},
		} {
			b.charger.reject = func(space.ClientKey) bool { return tc.reject }
			_, err := create(b.svc, b.ctx, tc.caller, tc.req)
			if (err == nil) != tc.ok {
				t.Fatalf("%s: err = %v, want ok %v", tc.name, err, tc.ok)
			}
			if n := b.charger.held.Load(); n != 0 {
				t.Fatalf("%s: %d holds not given back", tc.name, n)
			}
		}
		// A create let through by its refusal from memory and then refused its
		// concurrency place gives its hold back too.
		full := &places{refuse: overCap}
		if _, _, err := b.svc.Create(b.ctx, acme(), sandbox.CreateRequest{Shape: python}, full); !errors.Is(err, overCap) {
			t.Fatalf("over its concurrency cap: err = %v, want the cap's refusal", err)
		}
		if n := b.charger.held.Load(); n != 0 {
			t.Fatalf("refused its place: %d holds not given back", n)
		}
	})

	t.Run("other clients are not refused for one client's refusal", func(t *testing.T) {
		t.Parallel()
		b, _ := setupRefusing(t)
		b.charger.known = func(c space.ClientKey) bool { return c == "acme" }
		globex := acme()
		globex.ID, globex.Key = "globex", "globex"
		if _, err := create(b.svc, b.ctx, globex, sandbox.CreateRequest{Shape: python}); err != nil {
			t.Fatalf("globex: %v", err)
		}
		if got := b.events.list(); !equal(got, []string{"charge:globex", "start_cold"}) {
			t.Fatalf("events = %v, want globex charged by the usual path", got)
		}
	})

	t.Run("a ready slot appearing while the client is known refused makes the next create a warm hit", func(t *testing.T) {
		t.Parallel()
		b, v := setupRefusing(t)
		b.charger.known = always
		b.charger.reject = always // refused on whichever path the view's freshness picks
		if _, err := create(b.svc, b.ctx, acme(), sandbox.CreateRequest{Shape: python}); err == nil {
			t.Fatal("admitted")
		}
		b.addReadySlots(t, python, 1) // notified to the view by the slot's trigger
		for v.Cold(python) {
			<-v.changes
		}
		sb, err := create(b.svc, b.ctx, acme(), sandbox.CreateRequest{Shape: python})
		if err != nil || !sb.Warm {
			t.Fatalf("create = %+v, %v; want a warm hit", sb, err)
		}
		if got := b.events.list(); !equal(got, []string{"adopt"}) {
			t.Fatalf("events = %v, want only the adoption", got)
		}
	})

	t.Run("a shape a pool target makes slots of is never refused early", func(t *testing.T) {
		t.Parallel()
		b, v := setupRefusing(t)
		v.setTargets(pool.Fixed(python, 2))
		for v.Cold(python) {
			<-v.changes
		}
		b.charger.known = always
		b.charger.reject = always
		if _, err := create(b.svc, b.ctx, acme(), sandbox.CreateRequest{Shape: python}); err == nil {
			t.Fatal("admitted")
		}
		if got := b.events.list(); !equal(got, []string{"reject:acme"}) {
			t.Fatalf("events = %v, want the usual path's charge (which looked at the pool first)", got)
		}
	})

	t.Run("an unservable shape of a refused client is a 422, never a refusal", func(t *testing.T) {
		t.Parallel()
		b, _ := setupRefusing(t)
		b.charger.known = always
		_, err := create(b.svc, b.ctx, acme(), sandbox.CreateRequest{Shape: space.Shape{Template: "cobol-85", CPUMillis: 1, MemoryMiB: 1, DiskGiB: 1}})
		if space.ErrorCode(err) != space.EUNPROCESSABLE {
			t.Fatalf("err = %v, want unprocessable", err)
		}
	})

	t.Run("a view that has not synced refuses nothing early", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.svc = sandbox.New(sandbox.Options{DB: b.db, Pool: b.pool, Substrate: b.sim, Charger: b.charger,
			View:    pool.NewView(pool.ViewOptions{DB: b.db}), // never run
			Catalog: sandbox.Catalog{Templates: substrate.Templates{python.Template: {Name: python.Template, Image: "python"}}}})
		b.charger.known = always
		if _, err := create(b.svc, b.ctx, acme(), sandbox.CreateRequest{Shape: python}); err != nil {
			t.Fatalf("refused %v without a view that can tell", err)
		}
		if got := b.events.list(); !equal(got, []string{"charge:acme", "start_cold"}) {
			t.Fatalf("events = %v, want the charge asked, not a refusal from memory", got)
		}
	})
}
