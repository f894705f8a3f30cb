package substrate

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/space-sandbox/space"
)

// Op names a substrate call, for latency, failure injection and the call record.
type Op string

const (
	OpStartCold Op = "start_cold"
	OpWarm      Op = "warm"
	OpAdopt     Op = "adopt"
	OpSnapshot  Op = "snapshot"
	OpRestore   Op = "restore"
	OpStop      Op = "stop"
)

// Call is one recorded call of the simulated substrate.
type Call struct {
	Op        Op
	Ref       string // the ref the call acted on (slot, sandbox or snapshot), if any
	SandboxID string
	Client    space.ClientID
	Shape     space.Shape
	// SoftBreach is the start's Spec.SoftBreach, which the simulated substrate records
	// on what it starts.
	SoftBreach bool
}

// SimulatedOptions tune the simulated substrate.
type SimulatedOptions struct {
	// Latency is how long each kind of call takes (default: none). make run uses a few
	// hundred milliseconds for a cold start so that warm hits visibly win. A sandbox or
	// slot being started exists, not ready, for that long: a process that dies meanwhile
	// leaves it half made, as a real substrate would.
	Latency map[Op]time.Duration
	// Fail, when set, is asked before each call; a non-nil error fails the call. Tests
	// inject failures per call with it.
	Fail func(c Call) error
	// StateDir, when set, keeps what runs in a file in that directory instead of in
	// memory, so that several processes (replicas of a test, one killed mid-burst)
	// share one simulated substrate, as replicas share one cluster. Every change holds
	// an exclusive lock on the file (SPACE_SIMULATED_STATE_DIR).
	StateDir string
	// Timeout is what Timeout reports (default: the longest latency plus 5s).
	Timeout time.Duration
}

// Simulated is an in-process substrate: it starts nothing real. It keeps the
// sandboxes, slots and snapshots that "run" (in memory, or in StateDir), each under a
// name derived from its sandbox or slot id as a real substrate labels its resources,
// sleeps the configured latency, and records every call so tests can assert the exact
// calls the flow made. It is what `make run` and the tests use; /readyz says it is a
// simulation.
type Simulated struct {
	opts  SimulatedOptions
	state simState

	mu    sync.Mutex
	calls []Call
	gates map[Op]chan struct{}
}

// simResource is one resource as the simulated substrate keeps it.
type simResource struct {
	Resource
	Client space.ClientID `json:"client,omitempty"`
	Shape  space.Shape    `json:"shape"`
}

// simSnapshot is one saved snapshot.
type simSnapshot struct {
	SandboxID string      `json:"sandbox_id"`
	Shape     space.Shape `json:"shape"`
	Saved     time.Time   `json:"saved"`
}

// simData is everything the simulated substrate holds.
type simData struct {
	Resources map[string]*simResource `json:"resources"` // by ref
	Snapshots map[string]*simSnapshot `json:"snapshots"` // by ref
}

// simState holds simData for one process (memory) or several (a locked file).
type simState interface {
	// update runs f on the data under an exclusive lock and keeps what f left.
	update(f func(d *simData) error) error
}

// NewSimulated returns a simulated substrate. A StateDir that cannot be used is
// reported by the first call.
func NewSimulated(opts SimulatedOptions) *Simulated {
	s := &Simulated{opts: opts}
	if opts.StateDir != "" {
		s.state = &fileState{dir: opts.StateDir}
	} else {
		s.state = &memState{d: simData{Resources: map[string]*simResource{}, Snapshots: map[string]*simSnapshot{}}}
	}
	if s.opts.Timeout <= 0 {
		var longest time.Duration
		for _, d := range opts.Latency {
			longest = max(longest, d)
		}
		s.opts.Timeout = longest + 5*time.Second
	}
	return s
}

// Name implements Substrate.
func (s *Simulated) Name() string { return "simulated" }

// Describe implements Substrate.
func (s *Simulated) Describe() string {
	return "simulated substrate: in-process, starts no real sandboxes (set SPACE_SUBSTRATE=kubernetes for real ones)"
}

// Check implements Substrate; the simulation is always there.
func (s *Simulated) Check(context.Context) error { return nil }

// Timeout implements Substrate.
func (s *Simulated) Timeout() time.Duration { return s.opts.Timeout }

// Calls returns a copy of the calls this process made so far, in order.
func (s *Simulated) Calls() []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Call(nil), s.calls...)
}

// Running reports how many sandboxes and slots exist, ready or not.
func (s *Simulated) Running() int {
	n := 0
	_ = s.state.update(func(d *simData) error { n = len(d.Resources); return nil })
	return n
}

// IsRunning reports whether ref names a sandbox or slot that exists.
func (s *Simulated) IsRunning(ref string) bool {
	ok := false
	_ = s.state.update(func(d *simData) error { _, ok = d.Resources[ref]; return nil })
	return ok
}

// Gate holds every call of op, from now until release is called, as a substrate that
// takes its time would: a test holds cold starts in flight for as long as it needs
// them there, instead of guessing a latency long enough on a loaded machine.
func (s *Simulated) Gate(op Op) (release func()) {
	gate := make(chan struct{})
	s.mu.Lock()
	if s.gates == nil {
		s.gates = map[Op]chan struct{}{}
	}
	s.gates[op] = gate
	s.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			if s.gates[op] == gate {
				delete(s.gates, op)
			}
			s.mu.Unlock()
			close(gate)
		})
	}
}

// begin records c, waits at its gate and its latency, and asks the failure hook.
func (s *Simulated) begin(ctx context.Context, c Call) error {
	s.mu.Lock()
	s.calls = append(s.calls, c)
	gate := s.gates[c.Op]
	s.mu.Unlock()
	if gate != nil {
		select {
		case <-ctx.Done():
			return fmt.Errorf("simulated %s: %w", c.Op, ctx.Err())
		case <-gate:
		}
	}
	if d := s.opts.Latency[c.Op]; d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return fmt.Errorf("simulated %s: %w", c.Op, ctx.Err())
		case <-t.C:
		}
	}
	if s.opts.Fail != nil {
		if err := s.opts.Fail(c); err != nil {
			return fmt.Errorf("simulated %s: %w", c.Op, err)
		}
	}
	return nil
}

// start creates the resource ref (not ready), runs the call, and makes it ready; a
// failed call deletes what it made, as a real substrate's does. A resource already
// there for the same sandbox (left by an earlier attempt) is reused, not doubled.
func (s *Simulated) start(ctx context.Context, c Call, r simResource) (string, error) {
	ref := r.Ref
	err := s.state.update(func(d *simData) error {
		if cur, ok := d.Resources[ref]; ok && cur.SandboxID == r.SandboxID && cur.SlotID == r.SlotID {
			return nil
		}
		r.Created = time.Now()
		d.Resources[ref] = &r
		return nil
	})
	if err != nil {
		return "", err
	}
	if err := s.begin(ctx, c); err != nil {
		s.remove(ref)
		return "", err
	}
	err = s.state.update(func(d *simData) error {
		cur, ok := d.Resources[ref]
		if !ok {
			return fmt.Errorf("simulated %s: %s was stopped while starting: %w", c.Op, ref, ErrNotFound)
		}
		cur.Ready = true
		return nil
	})
	return ref, err
}

func (s *Simulated) remove(ref string) {
	_ = s.state.update(func(d *simData) error {
		delete(d.Resources, ref)
		delete(d.Snapshots, ref) // a snapshot is stopped (deleted) with its sandbox
		return nil
	})
}

// storageOf is a snapshot as what keeps a sandbox's state (Resource.Storage), as
// Find and List report it: a delete stops it with the rest, a settlement leaves it.
func storageOf(ref string, snap *simSnapshot) Resource {
	return Resource{Ref: ref, SandboxID: snap.SandboxID, Created: snap.Saved, Storage: true}
}

// SandboxRef is the name the simulated substrate gives sandbox id's cold-started
// resource; SlotRef that of pool slot id. Derived, never random: a replica that knows
// only the id finds what an earlier one started.
func SandboxRef(id string) string { return "sim-" + id }

// SlotRef: see SandboxRef.
func SlotRef(id string) string { return "slot-" + id }

// StartCold implements Substrate.
func (s *Simulated) StartCold(ctx context.Context, spec Spec) (string, error) {
	c := Call{Op: OpStartCold, SandboxID: spec.SandboxID, Client: spec.Client, Shape: spec.Shape, SoftBreach: spec.SoftBreach}
	return s.start(ctx, c, simResource{
		Resource: Resource{Ref: SandboxRef(spec.SandboxID), SandboxID: spec.SandboxID, SoftBreach: spec.SoftBreach},
		Client:   spec.Client, Shape: spec.Shape,
	})
}

// Warm implements Substrate.
func (s *Simulated) Warm(ctx context.Context, slotID string, shape space.Shape, _ Template) (string, error) {
	c := Call{Op: OpWarm, Ref: slotID, Shape: shape}
	return s.start(ctx, c, simResource{Resource: Resource{Ref: SlotRef(slotID), SlotID: slotID}, Shape: shape})
}

// Adopt implements Substrate.
func (s *Simulated) Adopt(ctx context.Context, slotRef string, spec Spec) (string, error) {
	c := Call{Op: OpAdopt, Ref: slotRef, SandboxID: spec.SandboxID, Client: spec.Client, Shape: spec.Shape}
	if err := s.begin(ctx, c); err != nil {
		return "", err
	}
	err := s.state.update(func(d *simData) error { return adopt(d, slotRef, spec) })
	if err != nil {
		return "", err
	}
	return slotRef, nil
}

func adopt(d *simData, slotRef string, spec Spec) error {
	slot, ok := d.Resources[slotRef]
	switch {
	case !ok || !slot.Ready:
		return fmt.Errorf("simulated adopt %s: %w", slotRef, ErrNotFound)
	case slot.SandboxID == spec.SandboxID:
		return nil // a retried adoption
	case slot.SandboxID != "":
		return fmt.Errorf("simulated adopt %s: %w", slotRef, ErrSlotTaken)
	}
	slot.SandboxID, slot.Client = spec.SandboxID, spec.Client
	return nil
}

// Snapshot implements Substrate: the snapshot is saved before the sandbox stops, so
// a snapshot interrupted half way leaves the sandbox running, and one interrupted
// after the save leaves the snapshot to be found.
func (s *Simulated) Snapshot(ctx context.Context, ref string) (string, error) {
	var cur simResource
	_ = s.state.update(func(d *simData) error {
		if r, ok := d.Resources[ref]; ok {
			cur = *r
		}
		return nil
	})
	c := Call{Op: OpSnapshot, Ref: ref, SandboxID: cur.SandboxID, Client: cur.Client, Shape: cur.Shape}
	if err := s.begin(ctx, c); err != nil {
		return "", err
	}
	snap := newRef("snap")
	err := s.state.update(func(d *simData) error {
		r, ok := d.Resources[ref]
		if !ok {
			return fmt.Errorf("simulated snapshot %s: %w", ref, ErrNotFound)
		}
		d.Snapshots[snap] = &simSnapshot{SandboxID: r.SandboxID, Shape: r.Shape, Saved: time.Now()}
		return nil
	})
	if err != nil {
		return "", err
	}
	s.remove(ref)
	return snap, nil
}

// Restore implements Substrate.
func (s *Simulated) Restore(ctx context.Context, snapshotRef, slotRef string, spec Spec) (string, error) {
	var found bool
	_ = s.state.update(func(d *simData) error { _, found = d.Snapshots[snapshotRef]; return nil })
	if !found {
		return "", fmt.Errorf("simulated restore %s: %w", snapshotRef, ErrNotFound)
	}
	c := Call{Op: OpRestore, Ref: snapshotRef, SandboxID: spec.SandboxID, Client: spec.Client, Shape: spec.Shape, SoftBreach: spec.SoftBreach}
	if slotRef == "" {
		return s.start(ctx, c, simResource{
			Resource: Resource{Ref: SandboxRef(spec.SandboxID), SandboxID: spec.SandboxID, SoftBreach: spec.SoftBreach},
			Client:   spec.Client, Shape: spec.Shape,
		})
	}
	if err := s.begin(ctx, c); err != nil {
		return "", err
	}
	if err := s.state.update(func(d *simData) error { return adopt(d, slotRef, spec) }); err != nil {
		return "", err
	}
	return slotRef, nil
}

// Stop implements Substrate.
func (s *Simulated) Stop(ctx context.Context, ref string) error {
	if err := s.begin(ctx, Call{Op: OpStop, Ref: ref}); err != nil {
		return err
	}
	s.remove(ref)
	return nil
}

// Find implements Substrate.
func (s *Simulated) Find(_ context.Context, sandboxID string) (Finding, error) {
	var f Finding
	err := s.state.update(func(d *simData) error {
		for _, r := range d.Resources {
			if r.SandboxID == sandboxID {
				f.Resources = append(f.Resources, r.Resource)
			}
		}
		var newest time.Time
		for ref, snap := range d.Snapshots {
			if snap.SandboxID == sandboxID {
				f.Storage = append(f.Storage, storageOf(ref, snap))
				if snap.Saved.After(newest) {
					f.Snapshot, newest = ref, snap.Saved
				}
			}
		}
		return nil
	})
	slices.SortFunc(f.Resources, func(a, b Resource) int { return a.Created.Compare(b.Created) })
	slices.SortFunc(f.Storage, func(a, b Resource) int { return a.Created.Compare(b.Created) })
	return f, err
}

// List implements Substrate.
func (s *Simulated) List(context.Context) ([]Resource, error) {
	var out []Resource
	err := s.state.update(func(d *simData) error {
		for _, r := range d.Resources {
			out = append(out, r.Resource)
		}
		for ref, snap := range d.Snapshots {
			out = append(out, storageOf(ref, snap))
		}
		return nil
	})
	slices.SortFunc(out, func(a, b Resource) int { return a.Created.Compare(b.Created) })
	return out, err
}

func newRef(kind string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return kind + "-" + hex.EncodeToString(b[:])
}

// memState keeps the data of one process.
type memState struct {
	mu sync.Mutex
	d  simData
}

func (m *memState) update(f func(d *simData) error) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return f(&m.d)
}

var _ Substrate = (*Simulated)(nil)
