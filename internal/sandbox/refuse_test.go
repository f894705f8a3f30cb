package sandbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/sandbox"
	"github.com/space-sandbox/space/internal/substrate"
)

// refuser is the test charger that is also a sandbox.Refuser: Refuse answers as the
// charger's reject says, recording "refuse:<client>" or "would_admit:<client>".
type refuser struct{ *charger }

func (r refuser) Refuse(_ context.Context, client space.ClientKey, rate *space.Rate) *space.LimitError {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.reject != nil && r.reject(client) {
		r.events.add("refuse:" + string(client))
		return &space.LimitError{Bucket: space.BucketClientActivation, Client: client, RetryAfter: time.Second, Limit: rate}
	}
	r.events.add("would_admit:" + string(client))
	return nil
}

// setupRefusing is setup with a Service whose charger is a Refuser.
func setupRefusing(t *testing.T) *bundle {
	t.Helper()
	b := setup(t)
	b.svc = sandbox.New(sandbox.Options{
		DB: b.db, Pool: b.pool, Substrate: b.sim, Charger: refuser{b.charger},
		Catalog: sandbox.Catalog{Templates: substrate.Templates{
			python.Template: {Name: python.Template, Image: "python:3.12-slim", MaxDiskGiB: 50},
			node.Template:   {Name: node.Template, Image: "node:22-slim"},
		}, Max: space.Shape{CPUMillis: 8000, MemoryMiB: 16384, DiskGiB: 100}},
	})
	return b
}

// countInserts makes the test's database count every sandbox row ever inserted, in a
// table of its own: a reserved-then-undone row leaves no sandbox but counts there.
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

	t.Run("a client refused a moment ago is refused again without a charge or a reservation", func(t *testing.T) {
		t.Parallel()
		b := setupRefusing(t)
		b.charger.reject = func(space.ClientKey) bool { return true }
		for i := range 3 {
			_, err := b.svc.Create(b.ctx, acme(), sandbox.CreateRequest{Shape: python})
			var le *space.LimitError
			if !errors.As(err, &le) || le.Bucket != space.BucketClientActivation || le.Client != "acme" {
				t.Fatalf("create %d: err = %v, want the charger's client_activation refusal", i, err)
			}
		}
		// The first refusal took the usual path (reserve, charge, undo); the next two
		// only asked the Refuser.
		if got := b.events.list(); !equal(got, []string{"reject:acme", "refuse:acme", "refuse:acme"}) {
			t.Fatalf("events = %v, want one refused charge, then two refusals", got)
		}
		if n := b.count(t, "true"); n != 0 {
			t.Fatalf("%d sandboxes left behind", n)
		}
	})

	t.Run("other clients are not refused early for one client's refusal", func(t *testing.T) {
		t.Parallel()
		b := setupRefusing(t)
		b.charger.reject = func(c space.ClientKey) bool { return c == "acme" }
		if _, err := b.svc.Create(b.ctx, acme(), sandbox.CreateRequest{Shape: python}); err == nil {
			t.Fatal("acme was admitted")
		}
		globex := acme()
		globex.ID, globex.Key = "globex", "globex"
		if _, err := b.svc.Create(b.ctx, globex, sandbox.CreateRequest{Shape: python}); err != nil {
			t.Fatalf("globex: %v", err)
		}
		if got := b.events.list(); !equal(got, []string{"reject:acme", "charge:globex", "start_cold"}) {
			t.Fatalf("events = %v, want globex charged by the usual path", got)
		}
	})

	t.Run("a refused client still gets a warm hit, uncharged", func(t *testing.T) {
		t.Parallel()
		b := setupRefusing(t)
		b.charger.reject = func(space.ClientKey) bool { return true }
		if _, err := b.svc.Create(b.ctx, acme(), sandbox.CreateRequest{Shape: python}); err == nil {
			t.Fatal("admitted")
		}
		b.addReadySlots(t, python, 1) // also clears the events
		sb, err := b.svc.Create(b.ctx, acme(), sandbox.CreateRequest{Shape: python})
		if err != nil || !sb.Warm {
			t.Fatalf("create = %+v, %v; want a warm hit", sb, err)
		}
		if got := b.events.list(); !equal(got, []string{"adopt"}) {
			t.Fatalf("events = %v, want only the adoption", got)
		}
	})

	t.Run("a refused client over its live cap is refused for the cap", func(t *testing.T) {
		t.Parallel()
		b := setupRefusing(t)
		caller := acme()
		caller.LiveSandboxes = 1
		b.charger.reject = func(space.ClientKey) bool { return true }
		if _, err := b.svc.Create(b.ctx, caller, sandbox.CreateRequest{Shape: python}); err == nil {
			t.Fatal("admitted")
		}
		if _, err := b.db.Exec(b.ctx, `INSERT INTO sandboxes (id, client, budget_key, state, template, cpu_millis, memory_mib, disk_gib)
			VALUES (gen_random_uuid(), 'acme', 'acme', 'running', 'node-22', 1, 1, 1)`); err != nil {
			t.Fatal(err)
		}
		_, err := b.svc.Create(b.ctx, caller, sandbox.CreateRequest{Shape: python})
		var le *space.LimitError
		if !errors.As(err, &le) || le.Bucket != space.BucketLiveSandboxCap {
			t.Fatalf("err = %v, want live_sandbox_cap", err)
		}
		if got := b.events.list(); !equal(got, []string{"reject:acme"}) {
			t.Fatalf("events = %v: the capped create must not reach the charge or the Refuser", got)
		}
	})

	t.Run("a refused client's unservable shape is a 422, never a refusal", func(t *testing.T) {
		t.Parallel()
		b := setupRefusing(t)
		b.charger.reject = func(space.ClientKey) bool { return true }
		if _, err := b.svc.Create(b.ctx, acme(), sandbox.CreateRequest{Shape: python}); err == nil {
			t.Fatal("admitted")
		}
		_, err := b.svc.Create(b.ctx, acme(), sandbox.CreateRequest{Shape: space.Shape{Template: "cobol-85", CPUMillis: 1, MemoryMiB: 1, DiskGiB: 1}})
		if space.ErrorCode(err) != space.EUNPROCESSABLE {
			t.Fatalf("err = %v, want unprocessable", err)
		}
	})

	t.Run("once the bucket would admit again, the usual path charges and starts", func(t *testing.T) {
		t.Parallel()
		b := setupRefusing(t)
		refusing := true
		b.charger.reject = func(space.ClientKey) bool { return refusing }
		if _, err := b.svc.Create(b.ctx, acme(), sandbox.CreateRequest{Shape: python}); err == nil {
			t.Fatal("admitted")
		}
		b.charger.mu.Lock()
		refusing = false
		b.charger.mu.Unlock()
		for range 2 {
			if _, err := b.svc.Create(b.ctx, acme(), sandbox.CreateRequest{Shape: python}); err != nil {
				t.Fatal(err)
			}
		}
		// The second create no longer asks the Refuser: the admission cleared the mark.
		want := []string{"reject:acme", "would_admit:acme", "charge:acme", "start_cold", "charge:acme", "start_cold"}
		if got := b.events.list(); !equal(got, want) {
			t.Fatalf("events = %v, want %v", got, want)
		}
	})

	t.Run("an early refusal reserves nothing, where the usual path reserves and undoes", func(t *testing.T) {
		t.Parallel()
		b := setupRefusing(t)
		b.charger.reject = func(space.ClientKey) bool { return true }
		b.countInserts(t)
		before := b.inserted(t)
		if _, err := b.svc.Create(b.ctx, acme(), sandbox.CreateRequest{Shape: python}); err == nil {
			t.Fatal("admitted")
		}
		first := b.inserted(t)
		for range 5 {
			if _, err := b.svc.Create(b.ctx, acme(), sandbox.CreateRequest{Shape: python}); err == nil {
				t.Fatal("admitted")
			}
		}
		if after := b.inserted(t); first-before != 1 || after != first {
			t.Fatalf("rows inserted: %d by the first refusal, %d by the next five; want 1 and 0", first-before, after-first)
		}
	})
}
