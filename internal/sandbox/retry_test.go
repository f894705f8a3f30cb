package sandbox_test

import (
	"errors"
	"testing"

	"github.com/google/uuid"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/sandbox"
	"github.com/space-sandbox/space/internal/substrate"
)

// TestCreateWithFixedID covers CreateRequest.ID: the dispatcher's retries of one queued
// create all work on one sandbox.
func TestCreateWithFixedID(t *testing.T) {
	t.Parallel()

	failColdStarts := func(b *bundle, n int) {
		b.setFail(func(c substrate.Call) error {
			if c.Op == substrate.OpStartCold && n > 0 {
				n--
				return errors.New("image pull backoff")
			}
			return nil
		})
	}

	t.Run("a retry after a failed cold start reuses the failed row and leaves no trail", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		failColdStarts(b, 1)
		id := uuid.NewString()
		req := sandbox.CreateRequest{ID: id, Shape: python, Metadata: map[string]string{"run": "1"}}
		if _, err := create(b.svc, b.ctx, acme(), req); space.ErrorCode(err) != space.EUNAVAILABLE {
			t.Fatalf("first attempt: err = %v, want unavailable", err)
		}
		failed, err := b.svc.Get(b.ctx, "acme", id)
		if err != nil || failed.State != space.StateFailed {
			t.Fatalf("after the failed attempt: %+v %v", failed, err)
		}
		sb, err := create(b.svc, b.ctx, acme(), req)
		if err != nil {
			t.Fatalf("retry: %v", err)
		}
		if sb.ID != id || sb.State != space.StateRunning || sb.LastError != "" || sb.Metadata["run"] != "1" {
			t.Fatalf("retry made %+v, want sandbox %s running without the old error", sb, id)
		}
		if !sb.CreatedAt.Equal(failed.CreatedAt) {
			t.Fatalf("created_at moved from %v to %v: the row was replaced, not retried", failed.CreatedAt, sb.CreatedAt)
		}
		if n := b.count(t, "true"); n != 1 {
			t.Fatalf("%d sandboxes, want the one retried row", n)
		}
		if b.charger.count("acme") != 2 {
			t.Fatalf("%d charges, want one per cold start attempt", b.charger.count("acme"))
		}
	})

	t.Run("a refused retry puts the row back to failed with its error", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		failColdStarts(b, 1)
		id := uuid.NewString()
		req := sandbox.CreateRequest{ID: id, Shape: python}
		if _, err := create(b.svc, b.ctx, acme(), req); err == nil {
			t.Fatal("first attempt succeeded")
		}
		b.charger.mu.Lock()
		b.charger.reject = func(space.ClientKey) bool { return true }
		b.charger.mu.Unlock()
		var le *space.LimitError
		if _, err := create(b.svc, b.ctx, acme(), req); !errors.As(err, &le) {
			t.Fatalf("retry: err = %v, want the limit error", err)
		}
		if n := b.count(t, "id = $1 AND state = 'failed' AND last_error LIKE '%image pull backoff%'", id); n != 1 {
			t.Fatal("the refused retry did not leave the row failed with its first error")
		}
	})

	t.Run("a repeat after success returns the sandbox the earlier attempt made, uncharged", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := uuid.NewString()
		req := sandbox.CreateRequest{ID: id, Shape: python}
		first, err := create(b.svc, b.ctx, acme(), req)
		if err != nil {
			t.Fatal(err)
		}
		again, err := create(b.svc, b.ctx, acme(), req)
		if err != nil || again.ID != first.ID || again.State != space.StateRunning {
			t.Fatalf("repeat = %+v %v, want the running sandbox %s", again, err, first.ID)
		}
		if b.charger.count("acme") != 1 {
			t.Fatalf("%d charges, want 1", b.charger.count("acme"))
		}
	})

	t.Run("another client's id and a starting sandbox are conflicts", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := uuid.NewString()
		if _, err := create(b.svc, b.ctx, acme(), sandbox.CreateRequest{ID: id, Shape: python}); err != nil {
			t.Fatal(err)
		}
		globex := space.Caller{ID: "globex", Key: "globex"}
		if _, err := create(b.svc, b.ctx, globex, sandbox.CreateRequest{ID: id, Shape: python}); space.ErrorCode(err) != space.ECONFLICT {
			t.Fatalf("globex reusing acme's id: err = %v, want conflict", err)
		}
		if _, err := b.db.Exec(b.ctx, "UPDATE sandboxes SET state = 'starting' WHERE id = $1", id); err != nil {
			t.Fatal(err)
		}
		if _, err := create(b.svc, b.ctx, acme(), sandbox.CreateRequest{ID: id, Shape: python}); space.ErrorCode(err) != space.ECONFLICT {
			t.Fatalf("a starting sandbox: err = %v, want conflict", err)
		}
		if _, err := create(b.svc, b.ctx, acme(), sandbox.CreateRequest{ID: "nope", Shape: python}); space.ErrorCode(err) != space.EINVALID {
			t.Fatalf("a malformed id: err = %v, want invalid", err)
		}
	})

	t.Run("a queued create's plan refuses what a cold start could not serve, and nothing else", func(t *testing.T) {
		t.Parallel()
		b, v := setupRefusing(t)
		v.waitCold(python)
		b.charger.known = func(space.ClientKey) bool { return true }
		if _, err := create(b.svc, b.ctx, acme(), sandbox.CreateRequest{Shape: python}); space.ErrorCode(err) != space.ELIMITED {
			t.Fatalf("a synchronous create known refused: err = %v, want the refusal", err)
		}
		if _, err := b.svc.Plan(acme(), sandbox.CreateRequest{Shape: python, Async: true}); err != nil {
			t.Fatalf("python: %v; a queued create waits for its bucket rather than being refused", err)
		}
		bad := python
		bad.DiskGiB = 51 // over the template's cap of 50
		if _, err := b.svc.Plan(acme(), sandbox.CreateRequest{Shape: bad, Async: true}); space.ErrorCode(err) != space.EUNPROCESSABLE {
			t.Fatalf("over the cap: err = %v, want unprocessable", err)
		}
	})
}
