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
	"time"

	"github.com/space-sandbox/space"
)

// Spec is what a substrate needs to run one sandbox.
type Spec struct {
	SandboxID string
	Client    space.ClientID
	Shape     space.Shape
	Template  Template
	// SoftBreach is true when the activation was admitted over its client's soft
	// limit: a substrate that can rank what it runs starts it to be degraded first
	// under pressure (the Kubernetes one labels it and may give it a lower
	// PriorityClass).
	SoftBreach bool
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

	// Find returns what the substrate holds for sandbox id: every resource labelled or
	// named with it (a cold-started sandbox, an adopted slot, one half made by an
	// attempt that died), and its newest snapshot when the substrate can tell. It is how
	// a sandbox left in a transitional state is settled (internal/sandbox's reconciler):
	// a resource is always found by the sandbox or slot id it was made for, never by a
	// reference only the process that made it knew.
	Find(ctx context.Context, sandboxID string) (Finding, error)

	// List returns every resource the substrate runs for space, sandboxes and slots,
	// for the reconciler to stop what no row accounts for.
	List(ctx context.Context) ([]Resource, error)

	// Timeout is the longest one call (StartCold, Warm, Adopt, Snapshot, Restore) takes
	// before it fails on its own. A sandbox asked for longer ago than that, and still
	// transitional, was abandoned by the replica that asked: the bounds of recovery
	// (the reconciler's, River's job timeout) are counted from it.
	Timeout() time.Duration
}

// Resource is one thing a substrate runs for space: a sandbox, or a warm pool slot,
// adopted or not.
type Resource struct {
	// Ref is what Stop takes.
	Ref string `json:"ref"`
	// SandboxID is the sandbox it runs (a cold start, a restore, or an adopted slot);
	// empty for a slot no sandbox adopted.
	SandboxID string `json:"sandbox_id,omitempty"`
	// SlotID is the pool slot it was warmed as; empty for a cold-started sandbox.
	SlotID string `json:"slot_id,omitempty"`
	// Ready is true when it serves (a Ready Pod, a running VM); false while it is still
	// starting, or failed, or stopping: half made.
	Ready   bool      `json:"ready"`
	Created time.Time `json:"created"`
	// SoftBreach is true for a sandbox started over its client's soft limit (see
	// Spec.SoftBreach), as the substrate recorded it.
	SoftBreach bool `json:"soft_breach,omitempty"`
	// Storage is true for what keeps a sandbox's state while it is paused (the
	// kubernetes substrate's volume claims and volume snapshots): it belongs to its
	// sandbox in every state but terminated and failed, not only to the one reference
	// a row records, and it is never a second start to stop.
	Storage bool `json:"storage,omitempty"`
}

// Finding is what a substrate holds for one sandbox id (Substrate.Find).
type Finding struct {
	// Resources are what runs (or was half made) for the sandbox.
	Resources []Resource
	// Storage is what keeps the sandbox's state (Resource.Storage): a settlement
	// leaves it alone, a delete stops it with the rest.
	Storage []Resource
	// Snapshot is the sandbox's newest snapshot (what Restore takes), when the
	// substrate can tell; empty otherwise.
	Snapshot string
}

// Ready returns the first resource that serves, if any.
func (f Finding) Ready() (Resource, bool) {
	for _, r := range f.Resources {
		if r.Ready {
			return r, true
		}
	}
	return Resource{}, false
}

// WarmRestorer is implemented by a substrate that can say it cannot restore into a warm
// slot: the kubernetes substrate keeps a sandbox's filesystem on a volume claim, and a
// running Pod cannot mount another volume. The flow then claims no slot for a restore
// (the restore is cold, and charged as one) rather than burn one per restore.
type WarmRestorer interface {
	RestoresWarm() bool
}

// RestoresWarm reports whether sub's Restore can use a warm slot: true unless sub says
// otherwise.
func RestoresWarm(sub Substrate) bool {
	w, ok := sub.(WarmRestorer)
	return !ok || w.RestoresWarm()
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
