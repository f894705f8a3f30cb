package dispatcher_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/dispatcher"
	"github.com/space-sandbox/space/internal/idempotency"
	"github.com/space-sandbox/space/internal/sandbox"
	"github.com/space-sandbox/space/internal/substrate"
)

func TestBackpressure(t *testing.T) {
	t.Parallel()

	t.Run("a rejected operation is requeued without spending its retry budget", func(t *testing.T) {
		t.Parallel()
		// One real attempt in all: a snooze that spent one would discard the job.
		b := setup(t, setupOptions{maxAttempts: 1, maxSnooze: 500 * time.Millisecond})
		rate := space.Rate{RefillRPS: 0.4, Burst: 1} // a token every 2.5s
		b.limits.set("acme", &rate, 0)
		b.drain("acme", rate)

		op := b.create("acme", "")
		mid, j := b.waitIdle(op.ID, "two rejections", func(op *space.Operation) bool {
			return op.Snoozes >= 2 && op.State == space.OperationQueued
		})
		if mid.Attempts != 0 || j.Attempt != 0 || j.Errors != 0 {
			t.Fatalf("after %d snoozes: operation attempts %d, river attempt %d with %d errors; want none spent",
				mid.Snoozes, mid.Attempts, j.Attempt, j.Errors)
		}
		if mid.State == space.OperationFailed || mid.Bucket != space.BucketClientActivation || !strings.Contains(mid.LastError, `"acme"`) {
			t.Fatalf("a snoozed operation shows %+v; want it waiting on acme's bucket", mid)
		}

		done := b.waitDone(op.ID)
		j = b.job(op.ID)
		if done.State != space.OperationSucceeded || done.Attempts != 1 || j.Attempt != 1 || j.State != "completed" {
			t.Fatalf("after the refill: %+v, river %+v; want succeeded on its one attempt", done, j)
		}
		if j.Snoozes != done.Snoozes || done.Snoozes < 2 {
			t.Fatalf("river counted %d snoozes, the operation %d", j.Snoozes, done.Snoozes)
		}
		if done.Sandbox == nil || done.Sandbox.ID != op.SandboxID || done.Sandbox.State != space.StateRunning || done.LastError != "" {
			t.Fatalf("succeeded operation shows sandbox %+v (last error %q), want %s running", done.Sandbox, done.LastError, op.SandboxID)
		}
		if n := b.count("SELECT count(*) FROM sandboxes"); n != 1 {
			t.Fatalf("%d sandboxes; the rejected tries must leave none", n)
		}
	})

	t.Run("an operation past its admission deadline fails as admission_timeout", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOptions{deadline: time.Second})
		rate := space.Rate{RefillRPS: 1e-6, Burst: 1} // never refills within the test
		b.limits.set("acme", &rate, 0)
		b.drain("acme", rate)

		start := time.Now()
		op := b.create("acme", "")
		if got := op.AdmissionDeadline.Sub(op.CreatedAt); got != time.Second {
			t.Fatalf("admission deadline %v after creation, want 1s", got)
		}
		done := b.waitDone(op.ID)
		if done.State != space.OperationFailed || done.ErrorCode != space.CodeAdmissionTimeout || done.Attempts != 0 {
			t.Fatalf("operation %+v, want failed as admission_timeout with no attempt spent", done)
		}
		if !strings.Contains(done.LastError, "admission deadline") || !strings.Contains(done.LastError, `"acme"`) {
			t.Fatalf("last error %q does not say why", done.LastError)
		}
		if took := time.Since(start); took < time.Second {
			t.Fatalf("failed after %v, before its deadline", took)
		}
		// The snooze was cut to end at the deadline: one rejection before it, one at it.
		if done.Snoozes != 1 {
			t.Fatalf("%d snoozes, want 1 (the wait until the deadline)", done.Snoozes)
		}
		// River counts the final, timed-out run in its own attempt (only a snooze gives
		// the attempt back); the operation's attempts above stay 0, and the job is
		// cancelled, not retried.
		if j := b.job(op.ID); j.State != "cancelled" || j.Attempt != 1 {
			t.Fatalf("river job %+v, want cancelled on its first (timed-out) run", j)
		}
	})

	t.Run("a full live-sandbox cap is waited out like an empty bucket", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOptions{maxSnooze: 300 * time.Millisecond})
		b.limits.set("acme", nil, 1)
		first := b.waitDone(b.create("acme", "").ID)
		second := b.create("acme", "")
		b.wait(second.ID, "the cap to turn it away", func(op *space.Operation) bool { return op.Snoozes >= 1 })
		if op := b.get(second.ID); op.Bucket != space.BucketLiveSandboxCap || op.Attempts != 0 {
			t.Fatalf("operation %+v, want snoozed on live_sandbox_cap", op)
		}
		if _, err := b.svc.Pause(b.ctx, space.Caller{ID: "acme", Key: "acme"}, first.SandboxID); err != nil {
			t.Fatal(err)
		}
		if done := b.waitDone(second.ID); done.State != space.OperationSucceeded || done.Attempts != 1 {
			t.Fatalf("after a pause freed a place: %+v", done)
		}
	})
}

func TestRetries(t *testing.T) {
	t.Parallel()

	coldStartFails := func(b *bundle, times int) {
		var mu sync.Mutex
		b.setFail(func(c substrate.Call) error {
			mu.Lock()
			defer mu.Unlock()
			if c.Op == substrate.OpStartCold && times != 0 {
				times--
				return errors.New("node out of disk")
			}
			return nil
		})
	}

	t.Run("a substrate error spends an attempt and is retried with backoff until the last one fails", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOptions{maxAttempts: 3})
		coldStartFails(b, -1) // always
		op := b.create("acme", "")
		done := b.waitDone(op.ID)
		if done.State != space.OperationFailed || done.Attempts != 3 || done.ErrorCode != space.EUNAVAILABLE || done.Snoozes != 0 {
			t.Fatalf("operation %+v, want failed (unavailable) after 3 attempts", done)
		}
		if !strings.Contains(done.LastError, "substrate failed to start sandbox "+op.SandboxID) {
			t.Fatalf("last error %q does not name the failure", done.LastError)
		}
		j := b.job(op.ID)
		if j.State != "discarded" || j.Attempt != 3 || j.Errors != 3 {
			t.Fatalf("river job %+v, want discarded after 3 attempts with 3 errors", j)
		}
		for i := 1; i < len(j.ErrorsAt); i++ {
			if gap := j.ErrorsAt[i].Sub(j.ErrorsAt[i-1]); gap < 100*time.Millisecond {
				t.Fatalf("attempts %d and %d were %v apart, less than the 100ms backoff", i, i+1, gap)
			}
		}
		// Every attempt worked on the one sandbox the operation named.
		if n := b.count("SELECT count(*) FROM sandboxes"); n != 1 {
			t.Fatalf("%d sandboxes after 3 failed attempts, want the one failed sandbox", n)
		}
		if n := b.count("SELECT count(*) FROM sandboxes WHERE id = $1 AND state = 'failed'", op.SandboxID); n != 1 {
			t.Fatal("the operation's sandbox is not the failed one")
		}
	})

	t.Run("a create that failed twice succeeds in the same sandbox on its third attempt", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOptions{})
		coldStartFails(b, 2)
		op := b.create("acme", "")
		done := b.waitDone(op.ID)
		if done.State != space.OperationSucceeded || done.Attempts != 3 || done.Sandbox == nil || done.Sandbox.ID != op.SandboxID {
			t.Fatalf("operation %+v, want succeeded on attempt 3 with sandbox %s", done, op.SandboxID)
		}
		if n := b.count("SELECT count(*) FROM sandboxes"); n != 1 {
			t.Fatalf("%d sandboxes, want 1: retries reuse the failed row", n)
		}
	})

	t.Run("an error a retry cannot fix fails the operation at once", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOptions{workers: -1}) // accept now, run later
		sb, err := create(b.svc, b.ctx, space.Caller{ID: "acme", Key: "acme"}, sandbox.CreateRequest{Shape: python})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.svc.Pause(b.ctx, space.Caller{ID: "acme", Key: "acme"}, sb.ID); err != nil {
			t.Fatal(err)
		}
		op, _, err := b.d.Enqueue(b.ctx, dispatcher.Request{Kind: space.OperationRestore, Client: "acme", SandboxID: sb.ID})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.svc.Delete(b.ctx, "acme", sb.ID); err != nil { // before a worker gets to it
			t.Fatal(err)
		}
		b.dispatcher(setupOptions{})
		done := b.waitDone(op.ID)
		if done.State != space.OperationFailed || done.ErrorCode != space.ECONFLICT || done.Attempts != 1 {
			t.Fatalf("operation %+v, want failed as conflict after one attempt", done)
		}
		if j := b.job(op.ID); j.State != "cancelled" {
			t.Fatalf("river job %+v, want cancelled", j)
		}
	})
}

func TestFairness(t *testing.T) {
	t.Parallel()

	t.Run("a client flooding the queue is snoozed on its own bucket while another client's work runs", func(t *testing.T) {
		t.Parallel()
		// The worst case for one shared queue: all of the flooder's operations are
		// queued ahead of the polite client's before any worker runs.
		b := setup(t, setupOptions{workers: -1})
		flooder := space.Rate{RefillRPS: 0.5, Burst: 1}
		b.limits.set("flooder", &flooder, 1000)
		b.limits.set("polite", &space.Rate{RefillRPS: 1, Burst: 10}, 0)

		const floods = 200
		start := time.Now()
		for range floods {
			b.create("flooder", "")
		}
		enqueued := time.Since(start)
		var polite []*space.Operation
		for range 5 {
			polite = append(polite, b.create("polite", ""))
		}

		workersStart := time.Now()
		b.dispatcher(setupOptions{workers: 4})
		for _, op := range polite {
			if done := b.waitDone(op.ID); done.State != space.OperationSucceeded || done.Snoozes != 0 || done.Attempts != 1 {
				t.Fatalf("polite operation %+v, want succeeded at once, never snoozed", done)
			}
		}
		politeTook := time.Since(workersStart)
		finished := b.count("SELECT count(*) FROM operations WHERE client = 'flooder' AND state IN ('succeeded', 'failed')")
		if finished > 10 {
			t.Fatalf("%d of the flooder's operations finished before the polite client's 5: they were not held back", finished)
		}
		snoozed := b.count("SELECT count(*) FROM operations WHERE client = 'flooder' AND snoozes > 0 AND last_bucket = 'client_activation'")
		if snoozed == 0 {
			t.Fatal("no flooder operation was snoozed on the flooder's bucket")
		}
		t.Logf("%d flooder creates queued in %v ahead of 5 polite ones; from the workers' start the polite 5 all ran within %v, "+
			"while %d of the flooder's had finished and %d were snoozed on its own bucket",
			floods, enqueued.Round(time.Millisecond), politeTook.Round(time.Millisecond), finished, snoozed)
	})
}

func TestDurability(t *testing.T) {
	t.Parallel()

	t.Run("operations accepted while no worker runs complete when new workers start", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOptions{workers: -1})
		var ids []string
		for range 3 {
			ids = append(ids, b.create("acme", "").ID)
		}
		for _, id := range ids {
			if op := b.get(id); op.State != space.OperationQueued {
				t.Fatalf("operation %+v ran without workers", op)
			}
			if j := b.job(id); j.State != "available" {
				t.Fatalf("river job %+v, want available", j)
			}
		}
		b.dispatcher(setupOptions{workers: 2}) // a new process's River client
		for _, id := range ids {
			if done := b.waitDone(id); done.State != space.OperationSucceeded || done.Attempts != 1 {
				t.Fatalf("operation %+v, want succeeded once", done)
			}
		}
		if n := b.count("SELECT count(*) FROM sandboxes WHERE state = 'running'"); n != 3 {
			t.Fatalf("%d running sandboxes, want 3", n)
		}
	})

	t.Run("stopping the workers lets a running operation finish", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOptions{latency: 300 * time.Millisecond})
		op := b.create("acme", "")
		b.wait(op.ID, "the operation to start", func(op *space.Operation) bool { return op.State == space.OperationRunning })
		ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
		defer cancel()
		if err := b.d.Stop(ctx); err != nil {
			t.Fatalf("stop: %v", err)
		}
		if got := b.get(op.ID); got.State != space.OperationSucceeded {
			t.Fatalf("after a graceful stop the operation is %+v, want succeeded", got)
		}
	})

	t.Run("the same Idempotency-Key gives one operation, also from ten concurrent requests", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOptions{workers: -1})
		first := b.create("acme", "order-1")
		again := b.create("acme", "order-1")
		if again.ID != first.ID || again.SandboxID != first.SandboxID {
			t.Fatalf("a repeat got operation %s, want %s", again.ID, first.ID)
		}
		other := b.create("globex", "order-1") // keys are per client
		if other.ID == first.ID {
			t.Fatal("another client's key returned acme's operation")
		}

		var wg sync.WaitGroup
		ids := make(chan string, 10)
		created := make(chan bool, 10)
		for range 10 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				op, c, err := b.enqueueCreate("acme", sandbox.CreateRequest{Shape: python, IdempotencyKey: "order-2"})
				if err != nil {
					t.Error(err)
					return
				}
				ids <- op.ID
				created <- c
			}()
		}
		wg.Wait()
		close(ids)
		close(created)
		seen := map[string]bool{}
		for id := range ids {
			seen[id] = true
		}
		nCreated := 0
		for c := range created {
			if c {
				nCreated++
			}
		}
		if len(seen) != 1 || nCreated != 1 {
			t.Fatalf("10 concurrent requests made operations %v (%d reported created), want one", seen, nCreated)
		}
		if n := b.count("SELECT count(*) FROM operations WHERE idempotency_key = 'order-2'"); n != 1 {
			t.Fatalf("%d operation rows for one key", n)
		}
		if n := b.count("SELECT count(*) FROM river_job"); n != 3 {
			t.Fatalf("%d river jobs, want 3 (order-1 twice, order-2)", n)
		}
	})

	t.Run("an Idempotency-Key reused for a different request is unprocessable, naming the key", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOptions{workers: -1})
		b.create("acme", "k")
		bigger := python
		bigger.DiskGiB = 20
		_, _, err := b.enqueueCreate("acme", sandbox.CreateRequest{Shape: bigger, IdempotencyKey: "k"})
		var de *space.Error
		if !errors.As(err, &de) || de.Code != space.EUNPROCESSABLE || de.Field != idempotency.Header {
			t.Fatalf("err = %v, want EUNPROCESSABLE naming %s", err, idempotency.Header)
		}
	})
}

func TestIdempotencyKeyExpiry(t *testing.T) {
	t.Parallel()

	t.Run("an expired key queues a new operation, even for another request", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOptions{workers: -1})
		first := b.create("acme", "k")
		if _, err := b.db.Exec(b.ctx, "UPDATE idempotency_keys SET expires_at = now() - interval '1 second'"); err != nil {
			t.Fatal(err)
		}
		bigger := python
		bigger.DiskGiB = 20
		op, created, err := b.enqueueCreate("acme", sandbox.CreateRequest{Shape: bigger, IdempotencyKey: "k"})
		if err != nil || !created || op.ID == first.ID {
			t.Fatalf("Enqueue under the expired key = %+v, created %v, %v; want a new operation", op, created, err)
		}
		again, created, err := b.enqueueCreate("acme", sandbox.CreateRequest{Shape: bigger, IdempotencyKey: "k"})
		if err != nil || created || again.ID != op.ID {
			t.Fatalf("a repeat under the key claimed again = %+v, created %v, %v; want operation %s", again, created, err, op.ID)
		}
		if n := b.count("SELECT count(*) FROM operations WHERE idempotency_key = 'k'"); n != 2 {
			t.Fatalf("%d operations under the key, want 2 (one per claim)", n)
		}
	})
}

func TestRecovery(t *testing.T) {
	t.Parallel()

	t.Run("a queued create whose replica died mid cold start is rescued, waits for the reconciler and succeeds once", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOptions{workers: -1})
		op := b.create("acme", "")
		// A replica took the job, reserved the sandbox and died mid cold start: its job
		// is running under a client that is gone, its sandbox starting for a day.
		for _, sql := range []string{
			`UPDATE river_job SET state = 'running', attempt = 1, attempted_at = now() - interval '1 hour',
				attempted_by = ARRAY['a-dead-replica'] WHERE id = (SELECT job_id FROM operations WHERE id = $1)`,
			`UPDATE operations SET state = 'running', started_at = now() - interval '1 hour' WHERE id = $1`,
			`INSERT INTO sandboxes (id, client, budget_key, state, template, cpu_millis, memory_mib, disk_gib, updated_at)
				SELECT sandbox_id, 'acme', 'acme', 'starting', 'python-3.12', 1000, 2048, 10, now() - interval '1 day'
				FROM operations WHERE id = $1`,
		} {
			if _, err := b.db.Exec(b.ctx, sql, op.ID); err != nil {
				t.Fatal(err)
			}
		}
		// A surviving replica: River rescues the job, a run finds the sandbox still
		// settling and waits, the reconciler settles it, the next run creates it.
		b.dispatcher(setupOptions{jobTimeout: time.Second, rescueAfter: 2 * time.Second, settleWait: 100 * time.Millisecond})
		rec, err := sandbox.NewReconciler(sandbox.ReconcilerOptions{Service: b.svc, Grace: time.Hour, Interval: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		done := b.wait(op.ID, "the rescued operation to finish", func(got *space.Operation) bool {
			if got.State == space.OperationQueued && got.LastError != "" {
				if _, err := rec.Round(b.ctx); err != nil {
					t.Fatalf("reconcile: %v", err)
				}
			}
			return got.State.Done()
		})
		if done.State != space.OperationSucceeded || done.Sandbox == nil || done.Sandbox.State != space.StateRunning {
			t.Fatalf("rescued operation %+v, want succeeded with its sandbox running", done)
		}
		starts := 0
		for _, c := range b.sim.Calls() {
			if c.Op == substrate.OpStartCold && c.SandboxID == op.SandboxID {
				starts++
			}
		}
		if starts != 1 || b.count("SELECT count(*) FROM sandboxes") != 1 {
			t.Fatalf("%d cold starts and %d sandboxes for one operation, want one each", starts, b.count("SELECT count(*) FROM sandboxes"))
		}
	})

	t.Run("an operation whose job river discarded is failed with the reason", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOptions{workers: -1})
		op := b.create("acme", "")
		if _, err := b.db.Exec(b.ctx, `UPDATE river_job SET state = 'discarded', finalized_at = now() - interval '1 hour'
			WHERE id = (SELECT job_id FROM operations WHERE id = $1)`, op.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := b.db.Exec(b.ctx, `UPDATE operations SET state = 'running', updated_at = now() - interval '1 hour' WHERE id = $1`, op.ID); err != nil {
			t.Fatal(err)
		}
		n, err := b.d.SettleLost(b.ctx)
		if err != nil || n != 1 {
			t.Fatalf("SettleLost = %d, %v; want 1", n, err)
		}
		got := b.get(op.ID)
		if got.State != space.OperationFailed || got.ErrorCode != space.EUNAVAILABLE || !strings.Contains(got.LastError, "discarded") {
			t.Fatalf("lost operation %+v, want failed saying its job was discarded", got)
		}
		if n, _ := b.d.SettleLost(b.ctx); n != 0 {
			t.Fatalf("a second pass failed %d more", n)
		}
	})
}

func TestWake(t *testing.T) {
	t.Parallel()

	t.Run("a wake operation charges the sandbox owner's bucket", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOptions{})
		acme := space.Rate{RefillRPS: 1e-6, Burst: 5}
		unknown := space.Rate{RefillRPS: 1e-6, Burst: 5}
		b.limits.set("acme", &acme, 0)
		b.limits.set("unknown", &unknown, 0)
		sb, err := create(b.svc, b.ctx, space.Caller{ID: "acme", Key: "acme", ClientRate: &acme}, sandbox.CreateRequest{Shape: python})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.svc.Pause(b.ctx, space.Caller{ID: "acme", Key: "acme"}, sb.ID); err != nil {
			t.Fatal(err)
		}
		a0, u0 := b.tokens("acme", acme), b.tokens(space.Unknown, unknown)

		// Ingress asks without a client of its own.
		op, _, err := b.d.Enqueue(b.ctx, dispatcher.Request{Kind: space.OperationWake, SandboxID: sb.ID})
		if err != nil {
			t.Fatal(err)
		}
		if op.Client != "acme" {
			t.Fatalf("wake operation runs as %q, want the owner acme", op.Client)
		}
		if done := b.waitDone(op.ID); done.State != space.OperationSucceeded || done.Sandbox.State != space.StateRunning {
			t.Fatalf("wake %+v", done)
		}
		a1, u1 := b.tokens("acme", acme), b.tokens(space.Unknown, unknown)
		if a0-a1 < 0.99 || a0-a1 > 1.01 || u1 != u0 {
			t.Fatalf("acme %v -> %v, unknown %v -> %v; want one token from acme alone", a0, a1, u0, u1)
		}
	})
}

func TestEnqueue(t *testing.T) {
	t.Parallel()

	t.Run("a request that could never run is refused before anything is queued", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOptions{workers: -1})
		running, err := create(b.svc, b.ctx, space.Caller{ID: "acme", Key: "acme"}, sandbox.CreateRequest{Shape: python})
		if err != nil {
			t.Fatal(err)
		}
		tooBig := python
		tooBig.DiskGiB = 51
		createOf := func(req sandbox.CreateRequest) func() error {
			return func() error { _, _, err := b.enqueueCreate("acme", req); return err }
		}
		enqueue := func(req dispatcher.Request) func() error {
			return func() error { _, _, err := b.d.Enqueue(b.ctx, req); return err }
		}
		for _, tc := range []struct {
			name    string
			enqueue func() error
			code    string
			field   string
		}{
			{"a bad body", createOf(sandbox.CreateRequest{Shape: space.Shape{Template: "python-3.12"}}), space.EINVALID, "cpu_millis"},
			{"a shape no cold start serves", createOf(sandbox.CreateRequest{Shape: tooBig}), space.EUNPROCESSABLE, "disk_gib"},
			{"a bad idempotency key", createOf(sandbox.CreateRequest{Shape: python, IdempotencyKey: "caf\u00e9"}), space.EINVALID, idempotency.Header},
			{"a restore of a running sandbox", enqueue(dispatcher.Request{Kind: space.OperationRestore, Client: "acme", SandboxID: running.ID}), space.ECONFLICT, ""},
			{"a restore of another client's sandbox", enqueue(dispatcher.Request{Kind: space.OperationRestore, Client: "globex", SandboxID: running.ID}), space.ENOTFOUND, ""},
			{"a wake of no sandbox", enqueue(dispatcher.Request{Kind: space.OperationWake, SandboxID: "00000000-0000-4000-8000-000000000001"}), space.ENOTFOUND, ""},
			{"a malformed sandbox id", enqueue(dispatcher.Request{Kind: space.OperationRestore, Client: "acme", SandboxID: "x"}), space.EINVALID, "id"},
			{"a bad idempotency key on a restore", enqueue(dispatcher.Request{Kind: space.OperationRestore, Client: "acme", SandboxID: running.ID, IdempotencyKey: "caf\u00e9"}), space.EINVALID, idempotency.Header},
		} {
			err := tc.enqueue()
			var de *space.Error
			if !errors.As(err, &de) || de.Code != tc.code || de.Field != tc.field {
				t.Errorf("%s: err = %v, want %s naming %q", tc.name, err, tc.code, tc.field)
			}
		}
		if n := b.count("SELECT count(*) FROM operations"); n != 0 {
			t.Fatalf("%d operations queued by refused requests", n)
		}
	})

	t.Run("a client sees only its own operations and a malformed id is invalid", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOptions{workers: -1})
		op := b.create("acme", "")
		if got, err := b.d.Get(b.ctx, "acme", op.ID); err != nil || got.ID != op.ID || got.State != space.OperationQueued {
			t.Fatalf("acme reads %+v %v", got, err)
		}
		if _, err := b.d.Get(b.ctx, "globex", op.ID); space.ErrorCode(err) != space.ENOTFOUND {
			t.Fatalf("globex reads acme's operation: err = %v, want not found", err)
		}
		var de *space.Error
		if _, err := b.d.Get(b.ctx, "acme", "42"); !errors.As(err, &de) || de.Code != space.EINVALID || de.Field != "id" {
			t.Fatalf("a malformed id: err = %v, want invalid naming id", err)
		}
	})
}

func TestQueueSignals(t *testing.T) {
	t.Parallel()

	t.Run("the queue's depth and its oldest waiting operation are read from Postgres at each scrape, by budget key and tier", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOptions{workers: -1})
		want := func(body string) {
			t.Helper()
			if err := testutil.GatherAndCompare(b.reg, strings.NewReader(body),
				"space_dispatcher_queue_depth", "space_dispatcher_oldest_queued_seconds"); err != nil {
				t.Fatal(err)
			}
		}
		const header = `# HELP space_dispatcher_oldest_queued_seconds Age of the oldest queued operation since it was accepted, by kind, budget key and tier; 0 when none is queued. Read at scrape time (aggregate with max).
# TYPE space_dispatcher_oldest_queued_seconds gauge
`
		const depthHeader = `# HELP space_dispatcher_queue_depth Operations not yet final, by kind, state (queued: waiting for a worker, parked behind their owner's lanes, snoozed by a limit or backing off after a failed attempt; running), and the budget key (the SPACE_METRICS_BUDGET_KEYS largest backlogs; the rest summed as _other) and tier they were accepted under; read from Postgres at scrape time (the same on every replica: aggregate with max).
# TYPE space_dispatcher_queue_depth gauge
`
		const unknownOldest = `space_dispatcher_oldest_queued_seconds{budget_key="unknown",kind="create",tier=""} 0
space_dispatcher_oldest_queued_seconds{budget_key="unknown",kind="restore",tier=""} 0
space_dispatcher_oldest_queued_seconds{budget_key="unknown",kind="wake",tier=""} 0
`
		const unknownDepth = `space_dispatcher_queue_depth{budget_key="unknown",kind="create",state="queued",tier=""} 0
space_dispatcher_queue_depth{budget_key="unknown",kind="create",state="running",tier=""} 0
space_dispatcher_queue_depth{budget_key="unknown",kind="restore",state="queued",tier=""} 0
space_dispatcher_queue_depth{budget_key="unknown",kind="restore",state="running",tier=""} 0
space_dispatcher_queue_depth{budget_key="unknown",kind="wake",state="queued",tier=""} 0
space_dispatcher_queue_depth{budget_key="unknown",kind="wake",state="running",tier=""} 0
`
		// Nothing queued: every kind and state of the unknown key is there, at 0.
		want(header + unknownOldest + depthHeader + unknownDepth)

		b.limits.mu.Lock()
		b.limits.m["acme"] = space.Caller{ID: "acme", Key: "acme", Tier: "pro"}
		b.limits.m["someone-new"] = space.Caller{ID: "someone-new", Key: space.Unknown}
		b.limits.mu.Unlock()
		old := b.create("acme", "")
		b.create("acme", "")
		running := b.create("acme", "")
		b.create("someone-new", "") // off the allowlist: the unknown key's
		for sql, id := range map[string]string{
			"UPDATE operations SET created_at = now() - interval '1 hour' WHERE id = $1": old.ID,
			"UPDATE operations SET state = 'running' WHERE id = $1":                      running.ID,
		} {
			if _, err := b.db.Exec(b.ctx, sql, id); err != nil {
				t.Fatal(err)
			}
		}
		families, err := b.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		ages := map[string]float64{}
		for _, f := range families {
			if f.GetName() != "space_dispatcher_oldest_queued_seconds" {
				continue
			}
			for _, m := range f.GetMetric() {
				l := m.GetLabel() // budget_key, kind, tier
				ages[l[0].GetValue()+"/"+l[1].GetValue()+"/"+l[2].GetValue()] = m.GetGauge().GetValue()
			}
		}
		if age := ages["acme/create/pro"]; age < 3600 || age > 3700 {
			t.Fatalf("acme's oldest queued create is %vs old, want about an hour (all: %v)", age, ages)
		}
		if err := testutil.GatherAndCompare(b.reg, strings.NewReader(depthHeader+`space_dispatcher_queue_depth{budget_key="acme",kind="create",state="queued",tier="pro"} 2
space_dispatcher_queue_depth{budget_key="acme",kind="create",state="running",tier="pro"} 1
`+strings.Replace(unknownDepth, `{budget_key="unknown",kind="create",state="queued",tier=""} 0`, `{budget_key="unknown",kind="create",state="queued",tier=""} 1`, 1)),
			"space_dispatcher_queue_depth"); err != nil {
			t.Fatal(err)
		}
	})
}
