package substrate_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/substrate"
)

// waitTimeout bounds every wait on a signal; it is a failure bound, not a sleep.
const waitTimeout = 10 * time.Second

var (
	shape = space.Shape{Template: "python-3.12", CPUMillis: 1000, MemoryMiB: 2048, DiskGiB: 10}
	tmpl  = substrate.Template{Name: "python-3.12", Image: "python:3.12-slim"}
	// errInjected is what the tests' failure hook fails a call with.
	errInjected = errors.New("injected failure")
)

func spec(id string) substrate.Spec {
	return substrate.Spec{SandboxID: id, Client: "acme", Shape: shape, Template: tmpl}
}

// bundle is one test's simulated substrate, with a failure hook the test can set at
// any time.
type bundle struct {
	sim *substrate.Simulated
	ctx context.Context
	// dir is the StateDir, "" for a substrate in memory.
	dir  string
	hook atomic.Pointer[func(substrate.Call) error]
}

// setup returns a simulated substrate in memory, or in stateDir when it is not empty.
func setup(t *testing.T, stateDir string) *bundle {
	t.Helper()
	b := &bundle{ctx: t.Context(), dir: stateDir}
	b.sim = b.replica()
	return b
}

// replica is another Simulated on the bundle's StateDir, as another process of a test
// would be, sharing the bundle's failure hook.
func (b *bundle) replica() *substrate.Simulated {
	return substrate.NewSimulated(substrate.SimulatedOptions{StateDir: b.dir, Fail: func(c substrate.Call) error {
		if f := b.hook.Load(); f != nil {
			return (*f)(c)
		}
		return nil
	}})
}

// onCall makes f the failure hook: it is asked before every call from now on.
func (b *bundle) onCall(f func(substrate.Call) error) { b.hook.Store(&f) }

// failOn fails every call of op with errInjected.
func (b *bundle) failOn(op substrate.Op) {
	b.onCall(func(c substrate.Call) error {
		if c.Op == op {
			return errInjected
		}
		return nil
	})
}

// holdOn holds every call of op inside the substrate, after its resource is made and
// before it is ready, until release is called; entered receives each held call.
func (b *bundle) holdOn(t *testing.T, op substrate.Op) (entered <-chan substrate.Call, release func()) {
	in := make(chan substrate.Call, 16)
	proceed := make(chan struct{})
	b.onCall(func(c substrate.Call) error {
		if c.Op != op {
			return nil
		}
		in <- c
		<-proceed
		return nil
	})
	released := false
	release = func() {
		if !released {
			released = true
			close(proceed)
		}
	}
	t.Cleanup(release)
	return in, release
}

// inEachState runs test on a substrate in memory and on one in a state directory:
// every contract of the simulated substrate holds in both.
func inEachState(t *testing.T, test func(t *testing.T, b *bundle)) {
	t.Helper()
	for _, inDir := range []bool{false, true} {
		name := "in memory"
		if inDir {
			name = "in a state dir"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dir := ""
			if inDir {
				dir = t.TempDir()
			}
			test(t, setup(t, dir))
		})
	}
}

// wait receives one value of ch, failing the test after waitTimeout.
func wait[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitTimeout):
		t.Fatalf("no %s within %v", what, waitTimeout)
		var zero T
		return zero
	}
}

// find is Find, failing the test on an error.
func (b *bundle) find(t *testing.T, sandboxID string) substrate.Finding {
	t.Helper()
	f, err := b.sim.Find(b.ctx, sandboxID)
	if err != nil {
		t.Fatalf("Find %s: %v", sandboxID, err)
	}
	return f
}

// list is List, failing the test on an error.
func (b *bundle) list(t *testing.T) []substrate.Resource {
	t.Helper()
	all, err := b.sim.List(b.ctx)
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	return all
}

// refs are the refs of resources, in order.
func refs(rs []substrate.Resource) []string {
	out := []string{}
	for _, r := range rs {
		out = append(out, r.Ref)
	}
	return out
}

// startCold is StartCold, failing the test on an error.
func (b *bundle) startCold(t *testing.T, id string) string {
	t.Helper()
	ref, err := b.sim.StartCold(b.ctx, spec(id))
	if err != nil {
		t.Fatalf("StartCold %s: %v", id, err)
	}
	return ref
}

// warm is Warm, failing the test on an error.
func (b *bundle) warm(t *testing.T, slotID string) string {
	t.Helper()
	ref, err := b.sim.Warm(b.ctx, slotID, shape, tmpl)
	if err != nil {
		t.Fatalf("Warm %s: %v", slotID, err)
	}
	return ref
}

// snapshot is Snapshot, failing the test on an error.
func (b *bundle) snapshot(t *testing.T, ref string) string {
	t.Helper()
	snap, err := b.sim.Snapshot(b.ctx, ref)
	if err != nil {
		t.Fatalf("Snapshot %s: %v", ref, err)
	}
	return snap
}
