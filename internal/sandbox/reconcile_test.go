package sandbox_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/config"
	"github.com/space-sandbox/space/internal/sandbox"
	"github.com/space-sandbox/space/internal/substrate"
)

// reconciler is a Reconciler on b's service that sweeps every round, taking a
// resource older than grace and without a row, twice in a row, for an orphan.
func (b *bundle) reconciler(grace time.Duration) *sandbox.Reconciler {
	r, err := sandbox.NewReconciler(sandbox.ReconcilerOptions{Service: b.svc, Grace: grace, SweepEvery: 1,
		Interval: config.Default().Reconcile.Interval})
	if err != nil {
		panic(err) // the options are the test's own
	}
	return r
}

// round runs one reconciling round and fails t unless it led it.
func (b *bundle) round(t *testing.T, r *sandbox.Reconciler) sandbox.ReconcileResult {
	t.Helper()
	res, err := r.Round(b.ctx)
	if err != nil || !res.Leader {
		t.Fatalf("round: %+v, %v", res, err)
	}
	return res
}

// abandon makes sandbox id look left by a replica that died a day ago in state.
func (b *bundle) abandon(t *testing.T, id string, state space.SandboxState) {
	t.Helper()
	if _, err := b.db.Exec(b.ctx, "UPDATE sandboxes SET state = $2, updated_at = now() - interval '1 day' WHERE id = $1", id, string(state)); err != nil {
		t.Fatal(err)
	}
}

// insertStarting inserts a sandbox row of acme in starting, as a create's booking
// leaves it before its cold start.
func (b *bundle) insertStarting(t *testing.T) string {
	t.Helper()
	id := uuid.NewString()
	if _, err := b.db.Exec(b.ctx, `INSERT INTO sandboxes (id, client, budget_key, state, template, cpu_millis, memory_mib, disk_gib)
		VALUES ($1, 'acme', 'acme', 'starting', $2, $3, $4, $5)`, id, python.Template, python.CPUMillis, python.MemoryMiB, python.DiskGiB); err != nil {
		t.Fatal(err)
	}
	b.abandon(t, id, space.StateStarting)
	return id
}

func (b *bundle) get(t *testing.T, id string) *space.Sandbox {
	t.Helper()
	sb, err := b.svc.Get(b.ctx, "acme", id)
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

func (b *bundle) found(t *testing.T, id string) substrate.Finding {
	t.Helper()
	f, err := b.sim.Find(b.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestReconcile(t *testing.T) {
	t.Parallel()

	t.Run("a sandbox left starting with nothing on the substrate fails with the reason and frees its live place", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := b.insertStarting(t)
		capped := acme()
		capped.LiveSandboxes = 1
		if _, err := create(b.svc, b.ctx, capped, sandbox.CreateRequest{Shape: python}); space.ErrorCode(err) != space.ELIMITED {
			t.Fatalf("create beside the stuck sandbox = %v, want its live-cap place taken", err)
		}
		res := b.round(t, b.reconciler(time.Hour))
		sb := b.get(t, id)
		if res.Settled[space.StateFailed] != 1 || sb.State != space.StateFailed || !strings.Contains(sb.LastError, "settled by the reconciler") {
			t.Fatalf("after a round: %+v, sandbox %+v", res, sb)
		}
		if _, err := create(b.svc, b.ctx, capped, sandbox.CreateRequest{Shape: python}); err != nil {
			t.Fatalf("create after the settlement = %v, want the place free", err)
		}
	})

	t.Run("a sandbox left starting whose resource is ready is running with it", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := b.insertStarting(t)
		ref, err := b.sim.StartCold(b.ctx, substrate.Spec{SandboxID: id, Client: "acme", Shape: python})
		if err != nil {
			t.Fatal(err)
		}
		b.round(t, b.reconciler(time.Hour))
		if sb := b.get(t, id); sb.State != space.StateRunning || sb.SubstrateRef != ref || sb.Warm {
			t.Fatalf("sandbox %+v, want running cold on %s", sb, ref)
		}
	})

	t.Run("a sandbox settled running takes its soft-breach mark from what runs, set or cleared", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for _, breach := range []bool{true, false} {
			id := b.insertStarting(t)
			// A mark a previous activation left, which this one must not inherit.
			if _, err := b.db.Exec(b.ctx, "UPDATE sandboxes SET soft_breach_at = now() - interval '1 hour' WHERE id = $1", id); err != nil {
				t.Fatal(err)
			}
			if _, err := b.sim.StartCold(b.ctx, substrate.Spec{SandboxID: id, Client: "acme", Shape: python, SoftBreach: breach}); err != nil {
				t.Fatal(err)
			}
			b.round(t, b.reconciler(time.Hour))
			sb := b.get(t, id)
			if sb.State != space.StateRunning || sb.SoftBreach != breach || (breach && time.Since(*sb.SoftBreachAt) > time.Minute) {
				t.Fatalf("a sandbox whose resource says soft breach %v settled %s with soft_breach %v at %v", breach, sb.State, sb.SoftBreach, sb.SoftBreachAt)
			}
		}
	})

	t.Run("a create settled failed takes what kept its state with it", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := b.insertStarting(t)
		ref, err := b.sim.StartCold(b.ctx, substrate.Spec{SandboxID: id, Client: "acme", Shape: python})
		if err != nil {
			t.Fatal(err)
		}
		// Its volume outlives its resource: a snapshot, as a claim does on Kubernetes.
		if _, err := b.sim.Snapshot(b.ctx, ref); err != nil {
			t.Fatal(err)
		}
		if f := b.found(t, id); len(f.Storage) != 1 || len(f.Resources) != 0 {
			t.Fatalf("the substrate holds %+v, want storage and nothing running", f)
		}
		b.round(t, b.reconciler(time.Hour))
		if sb := b.get(t, id); sb.State != space.StateFailed {
			t.Fatalf("sandbox %+v, want failed", sb)
		}
		if f := b.found(t, id); len(f.Storage) != 0 {
			t.Fatalf("a failed create still holds %+v: it has nothing to restore", f.Storage)
		}
	})

	t.Run("a resource half made when its replica died is stopped and the sandbox fails", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := b.insertStarting(t)
		release := b.holdColdStarts()
		started := make(chan error, 1)
		go func() {
			_, err := b.sim.StartCold(b.ctx, substrate.Spec{SandboxID: id, Client: "acme", Shape: python})
			started <- err
		}()
		waitFor(t, "the half-made resource", func() bool { return len(b.found(t, id).Resources) == 1 })
		if r := b.found(t, id).Resources[0]; r.Ready {
			t.Fatalf("resource %+v is ready before its start returned", r)
		}
		b.round(t, b.reconciler(time.Hour))
		close(release)
		if err := <-started; !errors.Is(err, substrate.ErrNotFound) {
			t.Fatalf("the interrupted start = %v, want its resource gone", err)
		}
		if sb := b.get(t, id); sb.State != space.StateFailed {
			t.Fatalf("sandbox %+v, want failed", sb)
		}
		if f := b.found(t, id); len(f.Resources) != 0 {
			t.Fatalf("the substrate still holds %+v", f.Resources)
		}
	})

	t.Run("a restore left unfinished is paused again with its snapshot", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		sb, err := create(b.svc, b.ctx, acme(), sandbox.CreateRequest{Shape: python})
		if err != nil {
			t.Fatal(err)
		}
		paused, err := b.svc.Pause(b.ctx, space.Caller{ID: "acme", Key: "acme"}, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		b.abandon(t, sb.ID, space.StateRestoring)
		b.round(t, b.reconciler(time.Hour))
		got := b.get(t, sb.ID)
		if got.State != space.StatePaused || got.SnapshotRef != paused.SnapshotRef || got.LastError == "" {
			t.Fatalf("sandbox %+v, want paused with snapshot %s and a reason", got, paused.SnapshotRef)
		}
		if _, err := b.svc.Restore(b.ctx, acme(), sb.ID); err != nil {
			t.Fatalf("restore after the settlement: %v", err)
		}
	})

	t.Run("a pause left unfinished is running when the sandbox still runs and paused when its snapshot was saved", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		running, err := create(b.svc, b.ctx, acme(), sandbox.CreateRequest{Shape: python})
		if err != nil {
			t.Fatal(err)
		}
		saved, err := create(b.svc, b.ctx, acme(), sandbox.CreateRequest{Shape: python})
		if err != nil {
			t.Fatal(err)
		}
		snap, err := b.sim.Snapshot(b.ctx, saved.SubstrateRef) // the snapshot was saved, then the replica died
		if err != nil {
			t.Fatal(err)
		}
		b.abandon(t, running.ID, space.StatePausing)
		b.abandon(t, saved.ID, space.StatePausing)
		b.round(t, b.reconciler(time.Hour))
		if got := b.get(t, running.ID); got.State != space.StateRunning || got.SubstrateRef != running.SubstrateRef || !strings.Contains(got.LastError, "was not paused") {
			t.Fatalf("still-running sandbox %+v, want running on %s", got, running.SubstrateRef)
		}
		if got := b.get(t, saved.ID); got.State != space.StatePaused || got.SnapshotRef != snap || got.SubstrateRef != "" {
			t.Fatalf("snapshotted sandbox %+v, want paused with %s", got, snap)
		}
	})

	t.Run("a sandbox changed since it was read is left to whoever changed it", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := b.insertStarting(t)
		r := b.reconciler(time.Hour)
		// Settled by another replica first: the round finds nothing left to do.
		if _, err := b.db.Exec(b.ctx, "UPDATE sandboxes SET state = 'failed' WHERE id = $1", id); err != nil {
			t.Fatal(err)
		}
		if res := b.round(t, r); len(res.Settled) != 0 {
			t.Fatalf("round settled %+v", res.Settled)
		}
	})

	t.Run("the sweep stops what no row accounts for and keeps the rest", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		kept, err := create(b.svc, b.ctx, acme(), sandbox.CreateRequest{Shape: python})
		if err != nil {
			t.Fatal(err)
		}
		gone, err := create(b.svc, b.ctx, acme(), sandbox.CreateRequest{Shape: python})
		if err != nil {
			t.Fatal(err)
		}
		// A terminated sandbox whose stop was lost, and a slot whose row is gone.
		if _, err := b.db.Exec(b.ctx, "UPDATE sandboxes SET state = 'terminated' WHERE id = $1", gone.ID); err != nil {
			t.Fatal(err)
		}
		slotRef, err := b.sim.Warm(b.ctx, uuid.NewString(), python, substrate.Template{})
		if err != nil {
			t.Fatal(err)
		}
		b.addReadySlots(t, node, 1)
		if res := b.round(t, b.reconciler(time.Hour)); res.Orphans != 0 {
			t.Fatalf("a sweep with an hour's grace stopped %d young resources", res.Orphans)
		}
		time.Sleep(10 * time.Millisecond) // every resource is older than the grace below
		r := b.reconciler(5 * time.Millisecond)
		if res := b.round(t, r); res.Orphans != 0 {
			t.Fatalf("the first sweep stopped %d: an orphan is stopped when a second sweep finds it so", res.Orphans)
		}
		res := b.round(t, r)
		if !res.Swept || res.Orphans != 2 {
			t.Fatalf("round %+v, want the terminated sandbox's and the rowless slot's resources stopped", res)
		}
		if b.sim.IsRunning(gone.SubstrateRef) || b.sim.IsRunning(slotRef) {
			t.Fatal("an orphan still runs")
		}
		if !b.sim.IsRunning(kept.SubstrateRef) || b.readySlots(t) != 1 || b.sim.Running() != 2 {
			t.Fatalf("the sweep stopped an owned resource: running %d", b.sim.Running())
		}
	})

	t.Run("a slot adopted between two sweeps is not taken for an orphan", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		slotID := uuid.NewString()
		ref, err := b.sim.Warm(b.ctx, slotID, python, substrate.Template{})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
		r := b.reconciler(5 * time.Millisecond)
		b.round(t, r) // the slot's row is gone (consumed): a suspect
		// ... because a sandbox adopted it meanwhile.
		id := b.insertStarting(t)
		if _, err := b.sim.Adopt(b.ctx, ref, substrate.Spec{SandboxID: id, Client: "acme", Shape: python}); err != nil {
			t.Fatal(err)
		}
		if _, err := b.db.Exec(b.ctx, "UPDATE sandboxes SET state = 'running', substrate_ref = $2 WHERE id = $1", id, ref); err != nil {
			t.Fatal(err)
		}
		if res := b.round(t, r); res.Orphans != 0 || !b.sim.IsRunning(ref) {
			t.Fatalf("round %+v: the adopted slot was stopped", res)
		}
	})

	t.Run("a slot stuck warming is forgotten and its resource stopped", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		slotID := uuid.NewString()
		if _, err := b.db.Exec(b.ctx, `INSERT INTO pool_slots (id, template, cpu_millis, memory_mib, disk_gib, state, updated_at)
			VALUES ($1, $2, $3, $4, $5, 'warming', now() - interval '1 day')`, slotID, python.Template, python.CPUMillis, python.MemoryMiB, python.DiskGiB); err != nil {
			t.Fatal(err)
		}
		ref, err := b.sim.Warm(b.ctx, slotID, python, substrate.Template{})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
		r := b.reconciler(5 * time.Millisecond)
		first := b.round(t, r)
		res := b.round(t, r)
		if first.SlotsReaped != 1 || res.Orphans != 1 || b.sim.IsRunning(ref) {
			t.Fatalf("round %+v; the slot's resource runs: %v", res, b.sim.IsRunning(ref))
		}
	})
}

func TestDeleteMidTransition(t *testing.T) {
	t.Parallel()

	t.Run("a sandbox deleted while starting ends terminated and what its start made is stopped", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		release := b.holdColdStarts()
		type result struct {
			sb  *space.Sandbox
			err error
		}
		created := make(chan result, 1)
		go func() {
			sb, err := create(b.svc, b.ctx, acme(), sandbox.CreateRequest{Shape: python})
			created <- result{sb, err}
		}()
		var id string
		waitFor(t, "the create to be starting", func() bool {
			return b.db.QueryRow(b.ctx, "SELECT id::text FROM sandboxes WHERE state = 'starting'").Scan(&id) == nil
		})
		teardown, err := b.svc.Delete(b.ctx, "acme", id)
		if err != nil || !teardown {
			t.Fatalf("delete of a starting sandbox = %v, %v; want accepted with a teardown", teardown, err)
		}
		if sb := b.get(t, id); sb.State != space.StateTerminated {
			t.Fatalf("after the delete: %s, want terminated", sb.State)
		}
		close(release)
		res := <-created
		if space.ErrorCode(res.err) != space.ECONFLICT || res.sb != nil {
			t.Fatalf("the create that lost its sandbox = %+v, %v; want a conflict", res.sb, res.err)
		}
		if sb := b.get(t, id); sb.State != space.StateTerminated {
			t.Fatalf("the finished start wrote over the delete: %s", sb.State)
		}
		if f := b.found(t, id); len(f.Resources) != 0 {
			t.Fatalf("the substrate still holds %+v for the deleted sandbox", f.Resources)
		}
	})

	t.Run("a create repeated on a sandbox left starting waits for it to settle", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := b.insertStarting(t)
		_, err := create(b.svc, b.ctx, acme(), sandbox.CreateRequest{ID: id, Shape: python})
		if !errors.Is(err, sandbox.ErrSettling) {
			t.Fatalf("create = %v, want ErrSettling", err)
		}
		b.round(t, b.reconciler(time.Hour)) // nothing on the substrate: failed
		sb, err := create(b.svc, b.ctx, acme(), sandbox.CreateRequest{ID: id, Shape: python})
		if err != nil || sb.State != space.StateRunning || sb.ID != id {
			t.Fatalf("create after the settlement = %+v, %v; want the same sandbox running", sb, err)
		}
	})
}

// waitFor polls cond until it holds, for the few places a test waits on another
// goroutine's progress through the substrate.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestNewReconcilerRefusesAMissingGraceOrInterval(t *testing.T) {
	t.Parallel()
	defaults := config.Default().Reconcile
	for field, opts := range map[string]sandbox.ReconcilerOptions{
		"Grace":    {Interval: defaults.Interval},
		"Interval": {Grace: defaults.Grace},
	} {
		if _, err := sandbox.NewReconciler(opts); err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("NewReconciler without %s = %v, want an error naming it", field, err)
		}
	}
	if _, err := sandbox.NewReconciler(sandbox.ReconcilerOptions{Grace: defaults.Grace, Interval: defaults.Interval}); err != nil {
		t.Errorf("NewReconciler with the defaults of config = %v", err)
	}
}
