package substrate_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/substrate"
)

func TestStartCold(t *testing.T) {
	t.Parallel()

	t.Run("a cold start runs the sandbox under a ref derived from its id", func(t *testing.T) {
		t.Parallel()
		inEachState(t, func(t *testing.T, b *bundle) {
			ref := b.startCold(t, "sbx-1")
			if ref != substrate.SandboxRef("sbx-1") {
				t.Fatalf("ref = %q, want %q", ref, substrate.SandboxRef("sbx-1"))
			}
			if !b.sim.IsRunning(ref) || b.sim.Running() != 1 {
				t.Fatalf("IsRunning = %v, Running = %d; want it the one running", b.sim.IsRunning(ref), b.sim.Running())
			}
			f := b.find(t, "sbx-1")
			if len(f.Resources) != 1 || f.Snapshot != "" {
				t.Fatalf("Find = %+v, want one resource and no snapshot", f)
			}
			r := f.Resources[0]
			if r.Ref != ref || r.SandboxID != "sbx-1" || r.SlotID != "" || !r.Ready || r.Created.IsZero() {
				t.Fatalf("resource = %+v, want ready, of sbx-1, no slot, with its creation time", r)
			}
			want := []substrate.Call{{Op: substrate.OpStartCold, SandboxID: "sbx-1", Client: "acme", Shape: shape}}
			if got := b.sim.Calls(); !slices.Equal(got, want) {
				t.Fatalf("Calls = %+v, want %+v", got, want)
			}
		})
	})

	t.Run("a second cold start of one sandbox reuses its resource", func(t *testing.T) {
		t.Parallel()
		inEachState(t, func(t *testing.T, b *bundle) {
			first := b.startCold(t, "sbx-1")
			created := b.find(t, "sbx-1").Resources[0].Created
			if again := b.startCold(t, "sbx-1"); again != first {
				t.Fatalf("second start ref = %q, want %q", again, first)
			}
			f := b.find(t, "sbx-1")
			if len(f.Resources) != 1 || !f.Resources[0].Created.Equal(created) {
				t.Fatalf("Find = %+v, want the one resource made first", f)
			}
		})
	})

	t.Run("a cold start that fails leaves nothing behind", func(t *testing.T) {
		t.Parallel()
		inEachState(t, func(t *testing.T, b *bundle) {
			b.failOn(substrate.OpStartCold)
			_, err := b.sim.StartCold(b.ctx, spec("sbx-1"))
			if !errors.Is(err, errInjected) || !strings.Contains(err.Error(), "simulated start_cold") {
				t.Fatalf("err = %v, want the injected failure, naming the call", err)
			}
			if n := b.sim.Running(); n != 0 {
				t.Fatalf("Running = %d after a failed start, want 0", n)
			}
			if f := b.find(t, "sbx-1"); len(f.Resources) != 0 {
				t.Fatalf("Find = %+v, want nothing", f)
			}
		})
	})

	t.Run("a cold start in flight exists, not ready, until it returns", func(t *testing.T) {
		t.Parallel()
		inEachState(t, func(t *testing.T, b *bundle) {
			entered, release := b.holdOn(t, substrate.OpStartCold)
			done := make(chan error, 1)
			go func() {
				_, err := b.sim.StartCold(b.ctx, spec("sbx-1"))
				done <- err
			}()
			wait(t, entered, "start in flight")
			f := b.find(t, "sbx-1")
			if len(f.Resources) != 1 || f.Resources[0].Ready {
				t.Fatalf("Find while starting = %+v, want one resource not ready", f)
			}
			if _, ok := f.Ready(); ok {
				t.Fatal("Finding.Ready found a ready resource while it starts")
			}
			if all := b.list(t); len(all) != 1 || all[0].Ready {
				t.Fatalf("List while starting = %+v, want the one not ready", all)
			}
			release()
			if err := wait(t, done, "start's return"); err != nil {
				t.Fatal(err)
			}
			if r, ok := b.find(t, "sbx-1").Ready(); !ok || r.Ref != substrate.SandboxRef("sbx-1") {
				t.Fatalf("Find after the start: ready = %v, %+v", ok, r)
			}
		})
	})

	t.Run("a stop while a cold start is in flight fails the start", func(t *testing.T) {
		t.Parallel()
		inEachState(t, func(t *testing.T, b *bundle) {
			entered, release := b.holdOn(t, substrate.OpStartCold)
			done := make(chan error, 1)
			go func() {
				_, err := b.sim.StartCold(b.ctx, spec("sbx-1"))
				done <- err
			}()
			wait(t, entered, "start in flight")
			if err := b.sim.Stop(b.ctx, substrate.SandboxRef("sbx-1")); err != nil {
				t.Fatal(err)
			}
			release()
			if err := wait(t, done, "start's return"); !errors.Is(err, substrate.ErrNotFound) {
				t.Fatalf("start stopped midway: err = %v, want ErrNotFound", err)
			}
			if n := b.sim.Running(); n != 0 {
				t.Fatalf("Running = %d, want 0", n)
			}
		})
	})
}

func TestGate(t *testing.T) {
	t.Parallel()

	t.Run("a gated call waits, and a context that ends first fails it, leaving nothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "")
		release := b.sim.Gate(substrate.OpStartCold)
		ctx, cancel := context.WithCancel(b.ctx)
		cancel()
		_, err := b.sim.StartCold(ctx, spec("sbx-1"))
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("a gated start with an ended context: err = %v, want context.Canceled", err)
		}
		if n := b.sim.Running(); n != 0 {
			t.Fatalf("Running = %d, want 0", n)
		}
		// Other calls are not gated.
		if _, err := b.sim.Warm(ctx, "slot-1", shape, tmpl); err != nil {
			t.Fatalf("Warm under a gate of start_cold: %v", err)
		}
		release()
		release() // releasing twice is harmless
		// Released, a call does not wait, so an ended context no longer fails it.
		if _, err := b.sim.StartCold(ctx, spec("sbx-1")); err != nil {
			t.Fatalf("StartCold after the release: %v", err)
		}
	})

	t.Run("a held call goes on when the gate is released", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "")
		release := b.sim.Gate(substrate.OpWarm)
		done := make(chan error, 1)
		go func() {
			_, err := b.sim.Warm(b.ctx, "slot-1", shape, tmpl)
			done <- err
		}()
		// A call is recorded together with the gate it is to wait at, so once it is
		// recorded it is held; nothing signals that moment, hence the poll.
		deadline := time.Now().Add(waitTimeout)
		for len(b.sim.Calls()) == 0 {
			if time.Now().After(deadline) {
				t.Fatal("Warm was never called")
			}
			runtime.Gosched()
		}
		select {
		case err := <-done:
			t.Fatalf("Warm returned (%v) through a closed gate", err)
		default:
		}
		release()
		if err := wait(t, done, "warm's return"); err != nil {
			t.Fatal(err)
		}
	})
}

func TestLatencyAndTimeout(t *testing.T) {
	t.Parallel()

	t.Run("Timeout is the longest latency plus 5s unless it is set", func(t *testing.T) {
		t.Parallel()
		for _, c := range []struct {
			opts substrate.SimulatedOptions
			want time.Duration
		}{
			{substrate.SimulatedOptions{}, 5 * time.Second},
			{substrate.SimulatedOptions{Latency: map[substrate.Op]time.Duration{substrate.OpStartCold: 2 * time.Second, substrate.OpWarm: 3 * time.Second}}, 8 * time.Second},
			{substrate.SimulatedOptions{Latency: map[substrate.Op]time.Duration{substrate.OpWarm: time.Hour}, Timeout: time.Minute}, time.Minute},
		} {
			if got := substrate.NewSimulated(c.opts).Timeout(); got != c.want {
				t.Errorf("Timeout of %+v = %v, want %v", c.opts, got, c.want)
			}
		}
	})

	t.Run("a call takes its latency", func(t *testing.T) {
		t.Parallel()
		const latency = 20 * time.Millisecond
		sim := substrate.NewSimulated(substrate.SimulatedOptions{Latency: map[substrate.Op]time.Duration{substrate.OpStartCold: latency}})
		start := time.Now()
		if _, err := sim.StartCold(t.Context(), spec("sbx-1")); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took < latency {
			t.Fatalf("StartCold took %v, want at least its latency %v", took, latency)
		}
	})

	t.Run("a context that ends during the latency fails the call and leaves nothing", func(t *testing.T) {
		t.Parallel()
		sim := substrate.NewSimulated(substrate.SimulatedOptions{Latency: map[substrate.Op]time.Duration{substrate.OpStartCold: time.Hour}})
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if _, err := sim.StartCold(ctx, spec("sbx-1")); !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
		if n := sim.Running(); n != 0 {
			t.Fatalf("Running = %d, want 0", n)
		}
	})
}

func TestWarmAndAdopt(t *testing.T) {
	t.Parallel()

	t.Run("a warm slot belongs to no sandbox until one adopts it", func(t *testing.T) {
		t.Parallel()
		inEachState(t, func(t *testing.T, b *bundle) {
			slot := b.warm(t, "slot-1")
			if slot != substrate.SlotRef("slot-1") {
				t.Fatalf("ref = %q, want %q", slot, substrate.SlotRef("slot-1"))
			}
			if all := b.list(t); len(all) != 1 || all[0].SlotID != "slot-1" || all[0].SandboxID != "" || !all[0].Ready {
				t.Fatalf("List = %+v, want one ready slot of nobody", all)
			}
			if f := b.find(t, "sbx-1"); len(f.Resources) != 0 {
				t.Fatalf("Find before the adoption = %+v, want nothing", f)
			}
			ref, err := b.sim.Adopt(b.ctx, slot, spec("sbx-1"))
			if err != nil || ref != slot {
				t.Fatalf("Adopt = %q, %v; want %q", ref, err, slot)
			}
			r, ok := b.find(t, "sbx-1").Ready()
			if !ok || r.Ref != slot || r.SlotID != "slot-1" || r.SandboxID != "sbx-1" {
				t.Fatalf("Find after the adoption: %v, %+v; want the slot, ready, of sbx-1", ok, r)
			}
			want := []substrate.Call{
				{Op: substrate.OpWarm, Ref: "slot-1", Shape: shape},
				{Op: substrate.OpAdopt, Ref: slot, SandboxID: "sbx-1", Client: "acme", Shape: shape},
			}
			if got := b.sim.Calls(); !slices.Equal(got, want) {
				t.Fatalf("Calls = %+v, want %+v", got, want)
			}
		})
	})

	t.Run("a slot adopted by one sandbox is ErrSlotTaken for another, and adopted again by the first", func(t *testing.T) {
		t.Parallel()
		inEachState(t, func(t *testing.T, b *bundle) {
			slot := b.warm(t, "slot-1")
			if _, err := b.sim.Adopt(b.ctx, slot, spec("sbx-1")); err != nil {
				t.Fatal(err)
			}
			if _, err := b.sim.Adopt(b.ctx, slot, spec("sbx-2")); !errors.Is(err, substrate.ErrSlotTaken) {
				t.Fatalf("second adoption: err = %v, want ErrSlotTaken", err)
			}
			if _, err := b.sim.Adopt(b.ctx, slot, spec("sbx-1")); err != nil {
				t.Fatalf("a retried adoption by the same sandbox: %v", err)
			}
			if f := b.find(t, "sbx-2"); len(f.Resources) != 0 {
				t.Fatalf("the loser holds %+v", f)
			}
		})
	})

	t.Run("adopting a slot that does not exist or is not ready is ErrNotFound", func(t *testing.T) {
		t.Parallel()
		inEachState(t, func(t *testing.T, b *bundle) {
			if _, err := b.sim.Adopt(b.ctx, substrate.SlotRef("nope"), spec("sbx-1")); !errors.Is(err, substrate.ErrNotFound) {
				t.Fatalf("adopting a slot that does not exist: err = %v, want ErrNotFound", err)
			}
			entered, release := b.holdOn(t, substrate.OpWarm)
			done := make(chan error, 1)
			go func() {
				_, err := b.sim.Warm(b.ctx, "slot-1", shape, tmpl)
				done <- err
			}()
			wait(t, entered, "warm in flight")
			if _, err := b.sim.Adopt(b.ctx, substrate.SlotRef("slot-1"), spec("sbx-1")); !errors.Is(err, substrate.ErrNotFound) {
				t.Fatalf("adopting a slot still warming: err = %v, want ErrNotFound", err)
			}
			release()
			if err := wait(t, done, "warm's return"); err != nil {
				t.Fatal(err)
			}
			if _, err := b.sim.Adopt(b.ctx, substrate.SlotRef("slot-1"), spec("sbx-1")); err != nil {
				t.Fatalf("adopting the slot once warm: %v", err)
			}
		})
	})

	t.Run("a failed adoption leaves the slot free", func(t *testing.T) {
		t.Parallel()
		inEachState(t, func(t *testing.T, b *bundle) {
			slot := b.warm(t, "slot-1")
			b.failOn(substrate.OpAdopt)
			if _, err := b.sim.Adopt(b.ctx, slot, spec("sbx-1")); !errors.Is(err, errInjected) {
				t.Fatalf("err = %v, want the injected failure", err)
			}
			b.onCall(func(substrate.Call) error { return nil })
			if _, err := b.sim.Adopt(b.ctx, slot, spec("sbx-2")); err != nil {
				t.Fatalf("adopting the slot after a failed adoption: %v", err)
			}
		})
	})
}

func TestSnapshotAndRestore(t *testing.T) {
	t.Parallel()

	t.Run("a snapshot saves the sandbox, then stops it", func(t *testing.T) {
		t.Parallel()
		inEachState(t, func(t *testing.T, b *bundle) {
			ref := b.startCold(t, "sbx-1")
			snap := b.snapshot(t, ref)
			if !strings.HasPrefix(snap, "snap-") {
				t.Fatalf("snapshot ref %q", snap)
			}
			if b.sim.IsRunning(ref) {
				t.Fatal("the sandbox still runs after its snapshot")
			}
			if f := b.find(t, "sbx-1"); len(f.Resources) != 0 || f.Snapshot != snap {
				t.Fatalf("Find = %+v, want no resource and the snapshot %s", f, snap)
			}
			want := substrate.Call{Op: substrate.OpSnapshot, Ref: ref, SandboxID: "sbx-1", Client: "acme", Shape: shape}
			if calls := b.sim.Calls(); calls[len(calls)-1] != want {
				t.Fatalf("last call = %+v, want %+v", calls[len(calls)-1], want)
			}
		})
	})

	t.Run("a snapshot that fails leaves the sandbox running and saves nothing", func(t *testing.T) {
		t.Parallel()
		inEachState(t, func(t *testing.T, b *bundle) {
			ref := b.startCold(t, "sbx-1")
			b.failOn(substrate.OpSnapshot)
			if _, err := b.sim.Snapshot(b.ctx, ref); !errors.Is(err, errInjected) {
				t.Fatalf("err = %v, want the injected failure", err)
			}
			if f := b.find(t, "sbx-1"); len(f.Resources) != 1 || f.Snapshot != "" {
				t.Fatalf("Find = %+v, want the sandbox running and no snapshot", f)
			}
		})
	})

	t.Run("a snapshot of what does not run is ErrNotFound", func(t *testing.T) {
		t.Parallel()
		inEachState(t, func(t *testing.T, b *bundle) {
			if _, err := b.sim.Snapshot(b.ctx, substrate.SandboxRef("nope")); !errors.Is(err, substrate.ErrNotFound) {
				t.Fatalf("err = %v, want ErrNotFound", err)
			}
		})
	})

	t.Run("a cold restore starts the sandbox again from its snapshot", func(t *testing.T) {
		t.Parallel()
		inEachState(t, func(t *testing.T, b *bundle) {
			snap := b.snapshot(t, b.startCold(t, "sbx-1"))
			ref, err := b.sim.Restore(b.ctx, snap, "", spec("sbx-1"))
			if err != nil || ref != substrate.SandboxRef("sbx-1") {
				t.Fatalf("Restore = %q, %v; want %q", ref, err, substrate.SandboxRef("sbx-1"))
			}
			r, ok := b.find(t, "sbx-1").Ready()
			if !ok || r.Ref != ref || r.SlotID != "" {
				t.Fatalf("Find after the restore: %v, %+v; want it ready, in no slot", ok, r)
			}
			want := substrate.Call{Op: substrate.OpRestore, Ref: snap, SandboxID: "sbx-1", Client: "acme", Shape: shape}
			if calls := b.sim.Calls(); calls[len(calls)-1] != want {
				t.Fatalf("last call = %+v, want %+v", calls[len(calls)-1], want)
			}
		})
	})

	t.Run("a cold restore that fails leaves nothing behind", func(t *testing.T) {
		t.Parallel()
		inEachState(t, func(t *testing.T, b *bundle) {
			snap := b.snapshot(t, b.startCold(t, "sbx-1"))
			b.failOn(substrate.OpRestore)
			if _, err := b.sim.Restore(b.ctx, snap, "", spec("sbx-1")); !errors.Is(err, errInjected) {
				t.Fatalf("err = %v, want the injected failure", err)
			}
			if f := b.find(t, "sbx-1"); len(f.Resources) != 0 || f.Snapshot != snap {
				t.Fatalf("Find = %+v, want no resource and the snapshot kept", f)
			}
		})
	})

	t.Run("a restore into a slot adopts the slot", func(t *testing.T) {
		t.Parallel()
		inEachState(t, func(t *testing.T, b *bundle) {
			snap := b.snapshot(t, b.startCold(t, "sbx-1"))
			slot := b.warm(t, "slot-1")
			ref, err := b.sim.Restore(b.ctx, snap, slot, spec("sbx-1"))
			if err != nil || ref != slot {
				t.Fatalf("Restore = %q, %v; want the slot %q", ref, err, slot)
			}
			r, ok := b.find(t, "sbx-1").Ready()
			if !ok || r.Ref != slot || r.SlotID != "slot-1" || r.SandboxID != "sbx-1" {
				t.Fatalf("Find after the restore: %v, %+v; want the slot of sbx-1", ok, r)
			}
			other := b.snapshot(t, b.startCold(t, "sbx-2"))
			if _, err := b.sim.Restore(b.ctx, other, slot, spec("sbx-2")); !errors.Is(err, substrate.ErrSlotTaken) {
				t.Fatalf("restoring another sandbox into the taken slot: err = %v, want ErrSlotTaken", err)
			}
		})
	})

	t.Run("a restore of a snapshot that does not exist is ErrNotFound", func(t *testing.T) {
		t.Parallel()
		inEachState(t, func(t *testing.T, b *bundle) {
			for _, slot := range []string{"", b.warm(t, "slot-1")} {
				if _, err := b.sim.Restore(b.ctx, "snap-nope", slot, spec("sbx-1")); !errors.Is(err, substrate.ErrNotFound) {
					t.Fatalf("slot %q: err = %v, want ErrNotFound", slot, err)
				}
			}
		})
	})

	t.Run("Find tells the newest of a sandbox's snapshots", func(t *testing.T) {
		t.Parallel()
		inEachState(t, func(t *testing.T, b *bundle) {
			first := b.snapshot(t, b.startCold(t, "sbx-1"))
			ref, err := b.sim.Restore(b.ctx, first, "", spec("sbx-1"))
			if err != nil {
				t.Fatal(err)
			}
			second := b.snapshot(t, ref)
			b.snapshot(t, b.startCold(t, "sbx-2"))
			if f := b.find(t, "sbx-1"); f.Snapshot != second {
				t.Fatalf("Find.Snapshot = %q, want the newer %q (the older is %q)", f.Snapshot, second, first)
			}
		})
	})
}

func TestStop(t *testing.T) {
	t.Parallel()

	t.Run("a stop is idempotent, and stopping what never ran is not an error", func(t *testing.T) {
		t.Parallel()
		inEachState(t, func(t *testing.T, b *bundle) {
			ref := b.startCold(t, "sbx-1")
			slot := b.warm(t, "slot-1")
			for range 2 {
				for _, r := range []string{ref, slot, substrate.SandboxRef("never")} {
					if err := b.sim.Stop(b.ctx, r); err != nil {
						t.Fatalf("Stop %s: %v", r, err)
					}
				}
			}
			if n := b.sim.Running(); n != 0 {
				t.Fatalf("Running = %d, want 0", n)
			}
		})
	})

	t.Run("a stop that fails leaves the resource running", func(t *testing.T) {
		t.Parallel()
		inEachState(t, func(t *testing.T, b *bundle) {
			ref := b.startCold(t, "sbx-1")
			b.failOn(substrate.OpStop)
			if err := b.sim.Stop(b.ctx, ref); !errors.Is(err, errInjected) {
				t.Fatalf("err = %v, want the injected failure", err)
			}
			if !b.sim.IsRunning(ref) {
				t.Fatal("a failed stop stopped the sandbox")
			}
		})
	})
}

func TestFindAndList(t *testing.T) {
	t.Parallel()

	t.Run("Find returns only the sandbox's own resources, oldest first", func(t *testing.T) {
		t.Parallel()
		inEachState(t, func(t *testing.T, b *bundle) {
			// sbx-1 started twice: cold, then through a slot, as two attempts might.
			cold := b.startCold(t, "sbx-1")
			slot := b.warm(t, "slot-1")
			if _, err := b.sim.Adopt(b.ctx, slot, spec("sbx-1")); err != nil {
				t.Fatal(err)
			}
			b.startCold(t, "sbx-2")
			if got := refs(b.find(t, "sbx-1").Resources); !slices.Equal(got, []string{cold, slot}) {
				t.Fatalf("Find sbx-1 = %v, want %v", got, []string{cold, slot})
			}
			if f := b.find(t, "sbx-3"); len(f.Resources) != 0 || f.Snapshot != "" {
				t.Fatalf("Find of a sandbox with nothing = %+v, want empty", f)
			}
		})
	})

	t.Run("List returns every sandbox and slot, oldest first", func(t *testing.T) {
		t.Parallel()
		inEachState(t, func(t *testing.T, b *bundle) {
			if all := b.list(t); len(all) != 0 {
				t.Fatalf("List of an empty substrate = %+v", all)
			}
			want := []string{b.startCold(t, "sbx-1"), b.warm(t, "slot-1"), b.startCold(t, "sbx-2"), b.warm(t, "slot-2")}
			if got := refs(b.list(t)); !slices.Equal(got, want) {
				t.Fatalf("List = %v, want %v", got, want)
			}
		})
	})
}

func TestSimulatedDescribesItself(t *testing.T) {
	t.Parallel()
	sim := substrate.NewSimulated(substrate.SimulatedOptions{})
	if sim.Name() != "simulated" {
		t.Errorf("Name = %q, want simulated", sim.Name())
	}
	if d := sim.Describe(); !strings.Contains(d, "simulated") || !strings.Contains(d, "starts no real sandboxes") {
		t.Errorf("Describe = %q, want it to say it is a simulation", d)
	}
	if err := sim.Check(t.Context()); err != nil {
		t.Errorf("Check = %v, want nil", err)
	}
	if _, err := sim.StartCold(t.Context(), spec("sbx-1")); err != nil {
		t.Fatal(err)
	}
	calls := sim.Calls()
	calls[0].SandboxID = "changed"
	if sim.Calls()[0].SandboxID != "sbx-1" {
		t.Error("Calls handed out its own slice")
	}
}

// Replicas of a test (several processes) point their simulated substrates at one
// state dir, as replicas share one cluster.
func TestReplicasOnOneStateDirShareOneSubstrate(t *testing.T) {
	t.Parallel()

	t.Run("each sees what the other runs, and can stop it", func(t *testing.T) {
		t.Parallel()
		a := setup(t, t.TempDir())
		other := a.replica()
		ref := a.startCold(t, "sbx-1")
		if !other.IsRunning(ref) || other.Running() != 1 {
			t.Fatal("the other replica does not see the sandbox")
		}
		if f, err := other.Find(a.ctx, "sbx-1"); err != nil || len(f.Resources) != 1 || !f.Resources[0].Ready {
			t.Fatalf("Find on the other replica = %+v, %v", f, err)
		}
		if err := other.Stop(a.ctx, ref); err != nil {
			t.Fatal(err)
		}
		if a.sim.IsRunning(ref) {
			t.Fatal("stopped by the other replica, the sandbox still runs for the first")
		}
		if n := len(other.Calls()); n != 1 {
			t.Fatalf("the other replica recorded %d calls, want its own stop only", n)
		}
	})

	t.Run("a slot warmed by one is adopted through another, and taken for a third", func(t *testing.T) {
		t.Parallel()
		a := setup(t, t.TempDir())
		second, third := a.replica(), a.replica()
		slot := a.warm(t, "slot-1")
		if _, err := second.Adopt(a.ctx, slot, spec("sbx-1")); err != nil {
			t.Fatal(err)
		}
		if _, err := third.Adopt(a.ctx, slot, spec("sbx-2")); !errors.Is(err, substrate.ErrSlotTaken) {
			t.Fatalf("err = %v, want ErrSlotTaken", err)
		}
	})

	t.Run("a snapshot taken by one is restored by another", func(t *testing.T) {
		t.Parallel()
		a := setup(t, t.TempDir())
		other := a.replica()
		snap := a.snapshot(t, a.startCold(t, "sbx-1"))
		if f, err := other.Find(a.ctx, "sbx-1"); err != nil || f.Snapshot != snap {
			t.Fatalf("Find on the other replica = %+v, %v; want the snapshot %s", f, err, snap)
		}
		if _, err := other.Restore(a.ctx, snap, "", spec("sbx-1")); err != nil {
			t.Fatal(err)
		}
		if !a.sim.IsRunning(substrate.SandboxRef("sbx-1")) {
			t.Fatal("restored by the other replica, the sandbox does not run for the first")
		}
	})

	t.Run("a start in flight on one is seen half made by another", func(t *testing.T) {
		t.Parallel()
		a := setup(t, t.TempDir())
		other := a.replica()
		entered, release := a.holdOn(t, substrate.OpStartCold)
		done := make(chan error, 1)
		go func() {
			_, err := a.sim.StartCold(a.ctx, spec("sbx-1"))
			done <- err
		}()
		wait(t, entered, "start in flight")
		f, err := other.Find(a.ctx, "sbx-1")
		if err != nil || len(f.Resources) != 1 || f.Resources[0].Ready {
			t.Fatalf("Find on the other replica = %+v, %v; want one resource not ready", f, err)
		}
		release()
		if err := wait(t, done, "start's return"); err != nil {
			t.Fatal(err)
		}
		if f, _ := other.Find(a.ctx, "sbx-1"); len(f.Resources) != 1 || !f.Resources[0].Ready {
			t.Fatalf("Find on the other replica after the start = %+v, want it ready", f)
		}
	})

	t.Run("of many replicas adopting one slot at once exactly one wins", func(t *testing.T) {
		t.Parallel()
		a := setup(t, t.TempDir())
		const slots, replicas = 10, 8
		sims := make([]*substrate.Simulated, replicas)
		for i := range sims {
			sims[i] = a.replica()
		}
		for s := range slots {
			slot := a.warm(t, fmt.Sprintf("slot-%d", s))
			errs := make(chan error, replicas)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i, sim := range sims {
				wg.Go(func() {
					<-start
					_, err := sim.Adopt(a.ctx, slot, spec(fmt.Sprintf("sbx-%d-%d", s, i)))
					errs <- err
				})
			}
			close(start)
			wg.Wait()
			close(errs)
			won := 0
			for err := range errs {
				switch {
				case err == nil:
					won++
				case !errors.Is(err, substrate.ErrSlotTaken):
					t.Errorf("%s: a loser got %v, want ErrSlotTaken", slot, err)
				}
			}
			if won != 1 {
				t.Fatalf("%d replicas adopted %s, want 1", won, slot)
			}
		}
	})
}

func TestAStateDirThatCannotBeUsedFailsTheCalls(t *testing.T) {
	t.Parallel()

	t.Run("a state dir under a regular file", func(t *testing.T) {
		t.Parallel()
		file := filepath.Join(t.TempDir(), "file")
		if err := os.WriteFile(file, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		sim := substrate.NewSimulated(substrate.SimulatedOptions{StateDir: filepath.Join(file, "state")})
		if _, err := sim.StartCold(t.Context(), spec("sbx-1")); err == nil || !strings.Contains(err.Error(), "simulated substrate state") {
			t.Fatalf("StartCold: err = %v, want the state's error", err)
		}
		if _, err := sim.List(t.Context()); err == nil {
			t.Fatal("List succeeded on an unusable state dir")
		}
		if _, err := sim.Find(t.Context(), "sbx-1"); err == nil {
			t.Fatal("Find succeeded on an unusable state dir")
		}
	})

	t.Run("a state file that is not JSON is an error naming it", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		path := filepath.Join(dir, "state.json")
		if err := os.WriteFile(path, []byte("{not json"), 0o644); err != nil {
			t.Fatal(err)
		}
		sim := substrate.NewSimulated(substrate.SimulatedOptions{StateDir: dir})
		if _, err := sim.List(t.Context()); err == nil || !strings.Contains(err.Error(), path) {
			t.Fatalf("List: err = %v, want an error naming %s", err, path)
		}
	})
}
