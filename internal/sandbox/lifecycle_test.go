package sandbox_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/sandbox"
	"github.com/space-sandbox/space/internal/substrate"
	"github.com/space-sandbox/space/internal/testenv"
)

// lifecycleBundle is a Service and its Lifecycle, with the callers it resolves owners
// to: acme's lifecycle is the test's to set.
type lifecycleBundle struct {
	*bundle
	mu      sync.Mutex
	callers map[space.ClientID]space.Caller
	reg     *prometheus.Registry
	life    *sandbox.Lifecycle
}

func setupLifecycle(t *testing.T, lc space.Lifecycle) *lifecycleBundle {
	t.Helper()
	b := &lifecycleBundle{bundle: setup(t), callers: map[space.ClientID]space.Caller{}, reg: prometheus.NewRegistry()}
	c := acme()
	c.Tier, c.Lifecycle = "pro", lc
	b.callers[c.ID] = c
	b.life = b.lifecycle(t, b.svc, b.reg)
	return b
}

// lifecycle is a Lifecycle of svc resolving owners as b does.
func (b *lifecycleBundle) lifecycle(t *testing.T, svc *sandbox.Service, reg prometheus.Registerer) *sandbox.Lifecycle {
	t.Helper()
	l, err := sandbox.NewLifecycle(sandbox.LifecycleOptions{Service: svc, Interval: 50 * time.Millisecond, Registerer: reg,
		Resolve: func(_ context.Context, owner space.ClientID) space.Caller { return b.caller(owner) }})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func (b *lifecycleBundle) caller(id space.ClientID) space.Caller {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.callers[id]
}

// create makes a running sandbox of acme's.
func (b *lifecycleBundle) create(t *testing.T) *space.Sandbox {
	t.Helper()
	sb, err := create(b.svc, b.ctx, b.caller("acme"), sandbox.CreateRequest{Shape: python})
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

// roundsUntil runs lifecycle rounds until cond holds of sandbox id, within a bound.
func (b *lifecycleBundle) roundsUntil(t *testing.T, what, id string, cond func(*space.Sandbox) bool) *space.Sandbox {
	t.Helper()
	var sb *space.Sandbox
	testenv.Eventually(t, 20*time.Second, what, func() bool {
		if _, err := b.life.Round(b.ctx); err != nil {
			t.Fatal(err)
		}
		var err error
		if sb, err = b.svc.Get(b.ctx, "acme", id); err != nil {
			t.Fatal(err)
		}
		return cond(sb)
	})
	return sb
}

func is(state space.SandboxState, reason string) func(*space.Sandbox) bool {
	return func(sb *space.Sandbox) bool {
		r := sb.PauseReason
		if state == space.StateTerminated {
			r = sb.TerminationReason
		}
		return sb.State == state && r != nil && *r == reason
	}
}

func TestIdleAndOldSandboxes(t *testing.T) {
	t.Parallel()

	t.Run("an untouched sandbox is paused after its idle timeout and frees its live place; one kept alive is not", func(t *testing.T) {
		t.Parallel()
		b := setupLifecycle(t, space.Lifecycle{IdleTimeout: 300 * time.Millisecond})
		c := b.callers["acme"]
		c.LiveSandboxes = 2
		b.callers["acme"] = c
		idle, kept := b.create(t), b.create(t)
		if idle.IdleAt == nil || idle.ExpiresAt != nil {
			t.Fatalf("a new sandbox's deadlines: idle_at %v, expires_at %v; want an idle deadline and no expiry", idle.IdleAt, idle.ExpiresAt)
		}
		if _, err := b.svc.Keepalive(b.ctx, b.caller("acme"), kept.ID, time.Minute); err != nil {
			t.Fatal(err)
		}
		paused := b.roundsUntil(t, "the idle sandbox to be paused", idle.ID, is(space.StatePaused, space.ReasonIdle))
		if paused.IdleAt != nil {
			t.Errorf("a paused sandbox has idle_at %v, want none", paused.IdleAt)
		}
		if sb, _ := b.svc.Get(b.ctx, "acme", kept.ID); sb.State != space.StateRunning {
			t.Fatalf("the sandbox kept alive for a minute is %s", sb.State)
		}
		// The live cap of 2 has room again: the idle pause freed its place.
		b.create(t)
		// A restore of it is an activation, charged as one (and counted live: the cap
		// goes up to make room), and starts its idle clock again.
		b.mu.Lock()
		c = b.callers["acme"]
		c.LiveSandboxes = 3
		b.callers["acme"] = c
		b.mu.Unlock()
		before := b.charger.count("acme")
		restored, err := b.svc.Restore(b.ctx, b.caller("acme"), idle.ID)
		if err != nil {
			t.Fatal(err)
		}
		if b.charger.count("acme") != before+1 || restored.IdleAt == nil || restored.PauseReason != nil {
			t.Fatalf("restore: %d charges (was %d), idle_at %v, pause_reason %v; want one more charge, an idle deadline, no pause reason",
				b.charger.count("acme"), before, restored.IdleAt, restored.PauseReason)
		}
	})

	t.Run("an idle action of terminate ends the sandbox and says why", func(t *testing.T) {
		t.Parallel()
		b := setupLifecycle(t, space.Lifecycle{IdleTimeout: 200 * time.Millisecond, IdleAction: space.IdleTerminate})
		sb := b.create(t)
		b.roundsUntil(t, "the idle sandbox to be terminated", sb.ID, is(space.StateTerminated, space.ReasonIdle))
		testenv.Eventually(t, 10*time.Second, "what ran for it to be stopped", func() bool {
			found, err := b.sim.Find(b.ctx, sb.ID)
			return err == nil && len(found.Resources) == 0
		})
	})

	t.Run("a paused sandbox is deleted with its snapshot after its retention", func(t *testing.T) {
		t.Parallel()
		b := setupLifecycle(t, space.Lifecycle{PausedRetention: 300 * time.Millisecond})
		sb := b.create(t)
		paused, err := b.svc.Pause(b.ctx, b.caller("acme"), sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		if paused.ExpiresAt == nil || paused.PauseReason == nil || *paused.PauseReason != space.ReasonClient {
			t.Fatalf("a paused sandbox: expires_at %v, pause_reason %v; want its retention's end and client", paused.ExpiresAt, paused.PauseReason)
		}
		b.roundsUntil(t, "the paused sandbox to be deleted", sb.ID, is(space.StateTerminated, space.ReasonRetention))
		testenv.Eventually(t, 10*time.Second, "its snapshot to be deleted", func() bool {
			found, err := b.sim.Find(b.ctx, sb.ID)
			return err == nil && len(found.Storage) == 0 && found.Snapshot == ""
		})
	})

	t.Run("a sandbox kept alive throughout ends at its max lifetime", func(t *testing.T) {
		t.Parallel()
		b := setupLifecycle(t, space.Lifecycle{MaxLifetime: time.Second, IdleTimeout: 300 * time.Millisecond})
		sb := b.create(t)
		if sb.ExpiresAt == nil || sb.ExpiresAt.Sub(sb.CreatedAt) != time.Second {
			t.Fatalf("expires_at %v of a sandbox created at %v, want a second later", sb.ExpiresAt, sb.CreatedAt)
		}
		// A keepalive past the max lifetime is refused, naming the field.
		if _, err := b.svc.Keepalive(b.ctx, b.caller("acme"), sb.ID, time.Hour); space.ErrorCode(err) != space.EUNPROCESSABLE {
			t.Fatalf("a keepalive of an hour in a lifetime of a second = %v, want a 422", err)
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(50 * time.Millisecond):
					_, _ = b.svc.Keepalive(b.ctx, b.caller("acme"), sb.ID, 0)
				}
			}
		})
		ended := b.roundsUntil(t, "the sandbox to end at its max lifetime", sb.ID, func(sb *space.Sandbox) bool { return sb.State != space.StateRunning })
		close(stop)
		wg.Wait()
		if !is(space.StateTerminated, space.ReasonMaxLifetime)(ended) {
			t.Fatalf("the sandbox kept alive is %s (%v), want terminated by its max lifetime", ended.State, ended.TerminationReason)
		}
		if _, err := b.svc.Keepalive(b.ctx, b.caller("acme"), sb.ID, 0); space.ErrorCode(err) != space.ECONFLICT {
			t.Fatalf("a keepalive of an ended sandbox = %v, want a 409", err)
		}
	})

	t.Run("an idle sandbox the substrate can never snapshot is terminated rather than left running", func(t *testing.T) {
		t.Parallel()
		b := setupLifecycle(t, space.Lifecycle{IdleTimeout: 100 * time.Millisecond})
		b.setFail(func(c substrate.Call) error {
			if c.Op == substrate.OpSnapshot {
				return substrate.ErrUnsupported
			}
			return nil
		})
		sb := b.create(t)
		b.roundsUntil(t, "the unpausable idle sandbox to be terminated", sb.ID, is(space.StateTerminated, space.ReasonIdle))
	})

	t.Run("the paused cap refuses the third pause, and an idle action past it terminates instead, for sandboxes made before the idle timeout too", func(t *testing.T) {
		t.Parallel()
		b := setupLifecycle(t, space.Lifecycle{PausedSandboxes: 2})
		for range 2 {
			if _, err := b.svc.Pause(b.ctx, b.caller("acme"), b.create(t).ID); err != nil {
				t.Fatal(err)
			}
		}
		third := b.create(t)
		_, err := b.svc.Pause(b.ctx, b.caller("acme"), third.ID)
		if le, ok := err.(*space.LimitError); !ok || le.Bucket != space.BucketPausedSandboxCap || le.Cap != 2 {
			t.Fatalf("the third pause = %v, want a paused_sandbox_cap refusal", err)
		}
		if sb, _ := b.svc.Get(b.ctx, "acme", third.ID); sb.State != space.StateRunning {
			t.Fatalf("the refused pause left the sandbox %s", sb.State)
		}
		b.mu.Lock()
		c := b.callers["acme"]
		c.Lifecycle.IdleTimeout = 100 * time.Millisecond
		b.callers["acme"] = c
		b.mu.Unlock()
		idle := b.create(t)
		b.roundsUntil(t, "the idle sandbox past the cap to be terminated", idle.ID, is(space.StateTerminated, space.ReasonPausedSandboxCap))
		// The third, made before acme had an idle timeout, is given one by a round
		// (counted from then) and ends the same way.
		b.roundsUntil(t, "the sandbox made before the idle timeout to be terminated", third.ID, is(space.StateTerminated, space.ReasonPausedSandboxCap))
		if got := testMetric(t, b.reg, "space_sandbox_lifecycle_actions_total", "terminate", "paused_sandbox_cap", "pro"); got != 2 {
			t.Errorf("terminations for the paused cap counted %v, want 2", got)
		}
	})

	t.Run("two replicas running rounds at once take each due action once", func(t *testing.T) {
		t.Parallel()
		b := setupLifecycle(t, space.Lifecycle{IdleTimeout: 200 * time.Millisecond})
		other := b.lifecycle(t, sandbox.New(b.options()), b.reg)
		var ids []string
		for range 30 {
			ids = append(ids, b.create(t).ID)
		}
		paused := func() bool { return b.count(t, "state = 'paused' AND pause_reason = 'idle'") == len(ids) }
		testenv.Eventually(t, 30*time.Second, "every sandbox to be paused", func() bool {
			var wg sync.WaitGroup
			for _, l := range []*sandbox.Lifecycle{b.life, other} {
				wg.Go(func() {
					if _, err := l.Round(b.ctx); err != nil {
						t.Error(err)
					}
				})
			}
			wg.Wait()
			return paused()
		})
		if got := testMetric(t, b.reg, "space_sandbox_lifecycle_actions_total", "pause", "idle", "pro"); got != float64(len(ids)) {
			t.Fatalf("%v idle pauses counted by both replicas, want each of the %d once", got, len(ids))
		}
		snapshots := 0
		for _, e := range b.events.list() {
			if e == "snapshot" {
				snapshots++
			}
		}
		if snapshots != len(ids) {
			t.Fatalf("%d snapshots taken, want one for each of the %d sandboxes", snapshots, len(ids))
		}
	})
}

// A backlog longer than one batch of the due query is taken in one round: each full
// batch taken is read again, and the round ends on the short one.
func TestRoundTakesEveryBatch(t *testing.T) {
	t.Parallel()
	b := setupLifecycle(t, space.Lifecycle{IdleTimeout: time.Hour, IdleAction: space.IdleTerminate})
	_, args := sandbox.DueQuery()
	batch, ok := args[0].(int)
	if !ok || batch <= 0 {
		t.Fatalf("the due query's bound is %v, want a positive int", args[0])
	}
	// Due sandboxes written directly (a create per sandbox would take longer than the
	// round), their idle action terminate, which needs nothing of the substrate.
	n := batch + 1
	if _, err := b.db.Exec(b.ctx, `INSERT INTO sandboxes (id, client, budget_key, state, template, cpu_millis, memory_mib, disk_gib,
			idle_at, idle_action)
		SELECT gen_random_uuid(), 'acme', 'acme', 'running', $2, $3, $4, $5, now() - make_interval(secs => i), 'terminate'
		FROM generate_series(1, $1::int) i`, n, python.Template, python.CPUMillis, python.MemoryMiB, python.DiskGiB); err != nil {
		t.Fatal(err)
	}
	res, err := b.life.Round(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := res.Taken[[2]string{"terminate", space.ReasonIdle}]; got != n || res.Queries != 2 || res.Failed+res.Skipped != 0 {
		t.Fatalf("one round over %d due sandboxes: %d idle terminations in %d due queries (%d failed, %d skipped); want all of them in 2 (a full batch of %d, then the short one)",
			n, got, res.Queries, res.Failed, res.Skipped, batch)
	}
	if left := b.count(t, "state = 'running'"); left != 0 {
		t.Fatalf("%d sandboxes still running after the round", left)
	}
}

// testMetric reads the counter of name with the label values, in order, from reg.
func testMetric(t *testing.T, reg *prometheus.Registry, name string, values ...string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) != len(values) {
				continue
			}
			for i, l := range m.GetLabel() {
				if l.GetValue() != values[i] {
					continue metrics
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

func TestDeadlinesCaughtUp(t *testing.T) {
	t.Parallel()
	lc := space.Lifecycle{MaxLifetime: time.Hour, IdleTimeout: 10 * time.Minute, PausedRetention: 2 * time.Hour}
	b := setupLifecycle(t, lc)
	// Rows as a release before the lifecycle wrote them: no deadlines at all. One of
	// acme's running sandboxes already has a max lifetime, which stays as it is; an
	// owner without limits keeps sandboxes that live on.
	insert := func(client, state, extra string) string {
		t.Helper()
		var id string
		if err := b.db.QueryRow(b.ctx, `INSERT INTO sandboxes (id, client, budget_key, state, template, cpu_millis, memory_mib, disk_gib, snapshot_ref, expires_at)
			VALUES (gen_random_uuid(), $1, $1, $2, $3, $4, $5, $6, CASE WHEN $2 = 'paused' THEN 'snap' END, `+extra+`)
			RETURNING id`, client, state, python.Template, python.CPUMillis, python.MemoryMiB, python.DiskGiB).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	running := insert("acme", "running", "NULL")
	paused := insert("acme", "paused", "NULL")
	dated := insert("acme", "running", "now() + interval '1 day'")
	free := insert("plain", "running", "NULL")
	var before time.Time
	if err := b.db.QueryRow(b.ctx, `SELECT expires_at FROM sandboxes WHERE id = $1`, dated).Scan(&before); err != nil {
		t.Fatal(err)
	}

	res, err := b.life.Round(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.CaughtUp != 3 || len(res.Taken) != 0 {
		t.Fatalf("the round caught up %d sandboxes and took %v; want acme's 3 given deadlines from now, and nothing ended", res.CaughtUp, res.Taken)
	}
	if got := testMetric(t, b.reg, "space_sandbox_lifecycle_deadlines_caught_up_total"); got != 3 {
		t.Errorf("space_sandbox_lifecycle_deadlines_caught_up_total %v, want 3", got)
	}
	// Seconds from now to each deadline (-1: none).
	left := func(id string) (expires, idle, retain float64, action string) {
		t.Helper()
		if err := b.db.QueryRow(b.ctx, `SELECT
				coalesce(extract(epoch FROM expires_at - now()), -1)::float8,
				coalesce(extract(epoch FROM idle_at - now()), -1)::float8,
				coalesce(extract(epoch FROM retain_until - now()), -1)::float8,
				coalesce(idle_action, '')
			FROM sandboxes WHERE id = $1`, id).Scan(&expires, &idle, &retain, &action); err != nil {
			t.Fatal(err)
		}
		return
	}
	// Counted from the round, a minute of slack for a slow machine.
	near := func(got float64, want time.Duration) bool {
		return got <= want.Seconds() && got > want.Seconds()-60
	}
	t.Run("a running sandbox without deadlines gets its owner's lifetime and idle timeout from now", func(t *testing.T) {
		expires, idle, retain, action := left(running)
		if !near(expires, lc.MaxLifetime) || !near(idle, lc.IdleTimeout) || retain != -1 || action != string(space.IdlePause) {
			t.Fatalf("expires in %.0fs, idle in %.0fs (%q), retained %.0fs; want %v, %v (pause) and none", expires, idle, action, retain, lc.MaxLifetime, lc.IdleTimeout)
		}
	})
	t.Run("a paused sandbox without deadlines gets its lifetime and retention from now, and no idle timeout", func(t *testing.T) {
		expires, idle, retain, _ := left(paused)
		if !near(expires, lc.MaxLifetime) || idle != -1 || !near(retain, lc.PausedRetention) {
			t.Fatalf("expires in %.0fs, idle in %.0fs, retained %.0fs; want %v, none and %v", expires, idle, retain, lc.MaxLifetime, lc.PausedRetention)
		}
	})
	t.Run("a deadline already set is not moved, and the one it lacked is added", func(t *testing.T) {
		var after time.Time
		if err := b.db.QueryRow(b.ctx, `SELECT expires_at FROM sandboxes WHERE id = $1`, dated).Scan(&after); err != nil {
			t.Fatal(err)
		}
		if !after.Equal(before) {
			t.Errorf("its max lifetime moved from %v to %v", before, after)
		}
		if _, idle, _, _ := left(dated); !near(idle, lc.IdleTimeout) {
			t.Errorf("idle in %.0fs, want %v", idle, lc.IdleTimeout)
		}
	})
	t.Run("an owner without limits keeps sandboxes without deadlines", func(t *testing.T) {
		if expires, idle, retain, _ := left(free); expires != -1 || idle != -1 || retain != -1 {
			t.Fatalf("plain's sandbox expires in %.0fs, idle in %.0fs, retained %.0fs; want no deadline", expires, idle, retain)
		}
	})
}
