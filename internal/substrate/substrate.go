// Package substrate is where sandboxes actually run. The create/restore flow speaks to
// a Substrate; `simulated` runs in-process for `make run` and tests, and `kubernetes`
// (package substrate/kubernetes) runs sandboxes as Pods.
//
// Every call blocks until the sandbox is in the state it asked for, or fails: the flow
// moves a sandbox from starting to running when StartCold returns, so a substrate that
// starts things asynchronously (Kubernetes) waits for readiness itself, within a
// deadline of its own.
package substrate

import (
	"context"
	"errors"

	"github.com/space-sandbox/space"
)

// Spec is what a substrate needs to run one sandbox.
type Spec struct {
	SandboxID string
	Client    space.ClientID
	Shape     space.Shape
	Template  Template
}

// Substrate runs sandboxes and warm pool slots.
type Substrate interface {
	// Name is the SPACE_SUBSTRATE value of this substrate.
	Name() string

	// StartCold starts a sandbox from nothing and returns its reference once it runs.
	StartCold(ctx context.Context, spec Spec) (ref string, err error)

	// Warm starts an ownerless pool slot of the given shape and returns its reference
	// once it is ready to be adopted.
	Warm(ctx context.Context, slotID string, shape space.Shape, tmpl Template) (ref string, err error)

	// Adopt hands the ready warm slot slotRef to the sandbox of spec and returns the
	// sandbox's reference. ErrSlotTaken means another replica adopted it first.
	Adopt(ctx context.Context, slotRef string, spec Spec) (ref string, err error)

	// Snapshot saves a running sandbox's state, stops it, and returns the snapshot's
	// reference. ErrUnsupported when the substrate cannot snapshot.
	Snapshot(ctx context.Context, ref string) (snapshotRef string, err error)

	// Restore starts the sandbox of spec from a snapshot: into the adopted warm slot
	// slotRef when it is not empty (a warm restore), from nothing otherwise.
	Restore(ctx context.Context, snapshotRef, slotRef string, spec Spec) (ref string, err error)

	// Stop stops a sandbox or retires a slot. Stopping what is already gone is not an
	// error.
	Stop(ctx context.Context, ref string) error

	// Check reports whether the substrate can serve, for /readyz.
	Check(ctx context.Context) error

	// Describe is a one-line description shown in /readyz, honest about what the
	// substrate is (the simulated one says it starts nothing real).
	Describe() string
}

var (
	// ErrSlotTaken is returned by Adopt when the slot was adopted by someone else.
	ErrSlotTaken = errors.New("substrate: warm slot already adopted")
	// ErrUnsupported is returned for an operation this substrate cannot do, such as a
	// snapshot with no snapshotter configured.
	ErrUnsupported = errors.New("substrate: operation not supported")
	// ErrNotFound is returned when the referenced sandbox, slot or snapshot does not
	// exist on the substrate.
	ErrNotFound = errors.New("substrate: not found")
)
