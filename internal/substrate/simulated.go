package substrate

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
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
}

// SimulatedOptions tune the simulated substrate.
type SimulatedOptions struct {
	// Latency is how long each kind of call takes (default: none). make run uses a few
	// hundred milliseconds for a cold start so that warm hits visibly win.
	Latency map[Op]time.Duration
	// Fail, when set, is asked before each call; a non-nil error fails the call. Tests
	// inject failures per call with it.
	Fail func(c Call) error
}

// Simulated is an in-process substrate: it starts nothing real. It keeps the set of
// "running" sandboxes, slots and snapshots in memory, sleeps the configured latency, and
// records every call so tests can assert the exact calls the flow made. It is what
// `make run` and the tests use; /readyz says it is a simulation.
type Simulated struct {
	opts SimulatedOptions

	mu        sync.Mutex
	running   map[string]Call // ref -> what runs there (slots have no SandboxID)
	snapshots map[string]Call // snapshot ref -> what was saved
	calls     []Call
}

// NewSimulated returns a simulated substrate.
func NewSimulated(opts SimulatedOptions) *Simulated {
	return &Simulated{opts: opts, running: map[string]Call{}, snapshots: map[string]Call{}}
}

// Name implements Substrate.
func (s *Simulated) Name() string { return "simulated" }

// Describe implements Substrate.
func (s *Simulated) Describe() string {
	return "simulated substrate: in-process, starts no real sandboxes (set SPACE_SUBSTRATE=kubernetes for real ones)"
}

// Check implements Substrate; the simulation is always there.
func (s *Simulated) Check(context.Context) error { return nil }

// Calls returns a copy of the calls made so far, in order.
func (s *Simulated) Calls() []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Call(nil), s.calls...)
}

// Running reports how many sandboxes and slots are running.
func (s *Simulated) Running() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.running)
}

// IsRunning reports whether ref names a running sandbox or slot.
func (s *Simulated) IsRunning(ref string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.running[ref]
	return ok
}

// begin records c, waits its latency and asks the failure hook.
func (s *Simulated) begin(ctx context.Context, c Call) error {
	s.mu.Lock()
	s.calls = append(s.calls, c)
	s.mu.Unlock()
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

func newRef(kind string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return kind + "-" + hex.EncodeToString(b[:])
}

// StartCold implements Substrate.
func (s *Simulated) StartCold(ctx context.Context, spec Spec) (string, error) {
	c := Call{Op: OpStartCold, SandboxID: spec.SandboxID, Client: spec.Client, Shape: spec.Shape}
	if err := s.begin(ctx, c); err != nil {
		return "", err
	}
	ref := newRef("sim")
	c.Ref = ref
	s.mu.Lock()
	s.running[ref] = c
	s.mu.Unlock()
	return ref, nil
}

// Warm implements Substrate.
func (s *Simulated) Warm(ctx context.Context, slotID string, shape space.Shape, _ Template) (string, error) {
	c := Call{Op: OpWarm, Ref: slotID, Shape: shape}
	if err := s.begin(ctx, c); err != nil {
		return "", err
	}
	ref := newRef("slot")
	s.mu.Lock()
	s.running[ref] = Call{Op: OpWarm, Ref: ref, Shape: shape}
	s.mu.Unlock()
	return ref, nil
}

// Adopt implements Substrate.
func (s *Simulated) Adopt(ctx context.Context, slotRef string, spec Spec) (string, error) {
	c := Call{Op: OpAdopt, Ref: slotRef, SandboxID: spec.SandboxID, Client: spec.Client, Shape: spec.Shape}
	if err := s.begin(ctx, c); err != nil {
		return "", err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	slot, ok := s.running[slotRef]
	if !ok {
		return "", fmt.Errorf("simulated adopt %s: %w", slotRef, ErrNotFound)
	}
	if slot.SandboxID != "" {
		return "", fmt.Errorf("simulated adopt %s: %w", slotRef, ErrSlotTaken)
	}
	c.Ref = slotRef
	s.running[slotRef] = c
	return slotRef, nil
}

// Snapshot implements Substrate.
func (s *Simulated) Snapshot(ctx context.Context, ref string) (string, error) {
	s.mu.Lock()
	cur, ok := s.running[ref]
	s.mu.Unlock()
	c := Call{Op: OpSnapshot, Ref: ref, SandboxID: cur.SandboxID, Client: cur.Client, Shape: cur.Shape}
	if err := s.begin(ctx, c); err != nil {
		return "", err
	}
	if !ok {
		return "", fmt.Errorf("simulated snapshot %s: %w", ref, ErrNotFound)
	}
	snap := newRef("snap")
	s.mu.Lock()
	delete(s.running, ref)
	s.snapshots[snap] = cur
	s.mu.Unlock()
	return snap, nil
}

// Restore implements Substrate.
func (s *Simulated) Restore(ctx context.Context, snapshotRef, slotRef string, spec Spec) (string, error) {
	c := Call{Op: OpRestore, Ref: snapshotRef, SandboxID: spec.SandboxID, Client: spec.Client, Shape: spec.Shape}
	if err := s.begin(ctx, c); err != nil {
		return "", err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.snapshots[snapshotRef]; !ok {
		return "", fmt.Errorf("simulated restore %s: %w", snapshotRef, ErrNotFound)
	}
	ref := slotRef
	if ref == "" {
		ref = newRef("sim")
	}
	c.Ref = ref
	s.running[ref] = c
	return ref, nil
}

// Stop implements Substrate.
func (s *Simulated) Stop(ctx context.Context, ref string) error {
	if err := s.begin(ctx, Call{Op: OpStop, Ref: ref}); err != nil {
		return err
	}
	s.mu.Lock()
	delete(s.running, ref)
	s.mu.Unlock()
	return nil
}

var _ Substrate = (*Simulated)(nil)
