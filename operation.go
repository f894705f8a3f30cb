package space

import "time"

// OperationKind is what a queued operation does.
type OperationKind string

const (
	// OperationCreate makes a new sandbox (POST /v1/sandboxes, Prefer: respond-async).
	OperationCreate OperationKind = "create"
	// OperationRestore restores a paused sandbox for its client.
	OperationRestore OperationKind = "restore"
	// OperationWake is an implicit restore charged to the sandbox's owner.
	OperationWake OperationKind = "wake"
)

// OperationKinds lists every kind, e.g. to pre-create metric series.
var OperationKinds = []OperationKind{OperationCreate, OperationRestore, OperationWake}

// OperationState is where a queued operation is.
type OperationState string

const (
	// OperationQueued: accepted and waiting for a worker, for admission (a snooze) or
	// for a retry after a failed attempt.
	OperationQueued OperationState = "queued"
	// OperationRunning: a worker is running it now.
	OperationRunning OperationState = "running"
	// OperationSucceeded: done; the operation shows the sandbox.
	OperationSucceeded OperationState = "succeeded"
	// OperationFailed: done without success; ErrorCode and LastError say why.
	OperationFailed OperationState = "failed"
)

// Done reports whether the state is final.
func (s OperationState) Done() bool { return s == OperationSucceeded || s == OperationFailed }

// CodeAdmissionTimeout is the ErrorCode of an operation that was still not admitted
// (every try met an empty activation bucket or a full live-sandbox cap) when its
// admission deadline passed. The other codes of a failed operation are the domain
// error codes (EUNAVAILABLE, ECONFLICT, ...).
const CodeAdmissionTimeout = "admission_timeout"

// Operation is one queued create, restore or wake (docs/dispatcher.md): accepted with 202 and
// run by the dispatcher under its client's own limits.
type Operation struct {
	ID    string         `json:"id"`
	Kind  OperationKind  `json:"kind"`
	State OperationState `json:"state"`
	// Client owns the operation and is who it runs as: the caller's client id, or the
	// sandbox owner's for a wake. Its budget key is resolved when the operation runs.
	Client ClientID `json:"client"`
	// SandboxID is fixed when the operation is accepted, for a create too: a client
	// knows the id of the sandbox it will get, and a retried create reuses it.
	SandboxID string `json:"sandbox_id"`
	// Attempts counts real attempts: runs that were admitted (or refused for a reason
	// other than a limit). Snoozes are not attempts.
	Attempts int `json:"attempts"`
	// Snoozes counts the times a limit turned the operation away and it was put back
	// in the queue to wait (backpressure).
	Snoozes int `json:"snoozes"`
	// Bucket is the limit that turned the operation away last, if any.
	Bucket Bucket `json:"bucket,omitempty"`
	// LastError is the caller-facing message of the last failure or rejection; cleared
	// on success.
	LastError string `json:"last_error,omitempty"`
	// ErrorCode says why a failed operation failed: CodeAdmissionTimeout or a domain
	// error code.
	ErrorCode string `json:"error_code,omitempty"`
	// AdmissionDeadline is when a still unadmitted operation gives up.
	AdmissionDeadline time.Time `json:"admission_deadline"`
	CreatedAt         time.Time `json:"created_at"`
	UpdatedAt         time.Time `json:"updated_at"`
	// Sandbox is the sandbox as it is now, once the operation has succeeded.
	Sandbox *Sandbox `json:"sandbox,omitempty"`
}
