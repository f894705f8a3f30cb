// Package space holds the domain of the sandbox admission controller: the types every
// other package speaks (sandboxes, shapes, client keys, rates, operations) and its
// errors. It depends on nothing but the standard library; the packages under internal/
// implement it against one dependency each (Redis, Postgres, River, OpenFeature, a
// substrate).
package space

import (
	"context"
	"fmt"
	"time"
)

// ClientKey is a caller's budget key: its client id when that is on the allowlist, or
// Unknown. Only values of this type reach Redis keys and metric labels, so the set of
// keys is bounded by the allowlist however many ids callers send. It names budgets,
// never owners (see ClientID).
type ClientKey string

// Unknown is the budget key of every caller whose id is not on the allowlist. They
// share its buckets and caps, while each still owns only what it created.
const Unknown ClientKey = "unknown"

// Rate is a token bucket: it holds at most Burst tokens and refills RefillRPS tokens a
// second, continuously. A new bucket starts full.
type Rate struct {
	RefillRPS float64 `json:"refill_rps"`
	Burst     int64   `json:"burst"`
}

// Validate reports whether the rate can drive a bucket: a rate of zero is allowed (the
// bucket never refills), a negative one is not, and a bucket must hold at least one
// token.
func (r Rate) Validate() error {
	if r.RefillRPS < 0 || r.RefillRPS != r.RefillRPS { // the second is NaN
		return fmt.Errorf("refill_rps must be a number >= 0, got %v", r.RefillRPS)
	}
	if r.Burst < 1 {
		return fmt.Errorf("burst must be an integer >= 1, got %d", r.Burst)
	}
	return nil
}

// Shape is what a sandbox is made of. Warm pool slots are keyed by the whole shape: a
// slot serves only a request of exactly its shape.
type Shape struct {
	Template  string `json:"template"`
	CPUMillis int    `json:"cpu_millis"`
	MemoryMiB int    `json:"memory_mib"`
	DiskGiB   int    `json:"disk_gib"`
}

// String renders the shape as one label value, e.g. "python-3.12/1000m/2048Mi/10Gi".
func (s Shape) String() string {
	return fmt.Sprintf("%s/%dm/%dMi/%dGi", s.Template, s.CPUMillis, s.MemoryMiB, s.DiskGiB)
}

// SandboxState is where a sandbox is in its life.
type SandboxState string

const (
	StateStarting   SandboxState = "starting"
	StateRunning    SandboxState = "running"
	StatePausing    SandboxState = "pausing"
	StatePaused     SandboxState = "paused"
	StateRestoring  SandboxState = "restoring"
	StateFailed     SandboxState = "failed"
	StateTerminated SandboxState = "terminated"
)

// Live reports whether a sandbox in this state holds one of its client's live-sandbox
// places: it is running or on its way in or out, not paused, failed or gone.
func (s SandboxState) Live() bool {
	switch s {
	case StateStarting, StateRunning, StatePausing, StateRestoring:
		return true
	}
	return false
}

// LiveStates lists the states that hold a live-sandbox place (see Live).
var LiveStates = []SandboxState{StateStarting, StateRunning, StatePausing, StateRestoring}

// Sandbox is one isolated machine (pod, microVM) owned by one client.
type Sandbox struct {
	ID string `json:"id"`
	// Client owns the sandbox: the authenticated client id that created it.
	Client ClientID     `json:"client"`
	State  SandboxState `json:"state"`
	Shape
	// TemplateVersion is the version (a content hash) of the template the sandbox's
	// last activation ran, warm or cold.
	TemplateVersion string `json:"template_version"`
	// Warm is true when the sandbox was adopted from a warm pool slot on its last
	// activation rather than cold started.
	Warm bool `json:"warm"`
	// SoftBreach is true when the sandbox's last activation was admitted while its
	// client was over its soft limit, at SoftBreachAt: the substrate was told, so that
	// it degrades this sandbox first under pressure. Absent otherwise.
	SoftBreach   bool              `json:"soft_breach,omitempty"`
	SoftBreachAt *time.Time        `json:"soft_breach_at,omitempty"`
	Metadata     map[string]string `json:"metadata,omitempty"`
	CreatedAt    time.Time         `json:"created_at"`
	UpdatedAt    time.Time         `json:"updated_at"`

	// BudgetKey is the budget key its last activation was charged and capped under:
	// the live-sandbox cap counts the sandbox against it while it is live. Not shown.
	BudgetKey ClientKey `json:"-"`
	// SubstrateRef names the running sandbox on its substrate (a pod name, a VM id);
	// SnapshotRef names its last snapshot. Neither is shown to clients.
	SubstrateRef string `json:"-"`
	SnapshotRef  string `json:"-"`
	// Answered is true once a client has been told of the sandbox: the 201 of its
	// create (or of a retry under the create's Idempotency-Key), or the 202 of a queued
	// create, which names the sandbox before it exists. An unanswered sandbox that no
	// key can claim is ended by the reconciler (docs/design.md, "Unanswered creates").
	// Not shown.
	Answered bool `json:"-"`
	// LastError says why a failed sandbox failed.
	LastError string `json:"last_error,omitempty"`

	// ExpiresAt is when its max lifetime ends it (Lifecycle.MaxLifetime from its
	// creation), nil when unbounded. IdleAt is when its idle action is due (the
	// idle timeout after its last activity: creation, restore, wake, keepalive), nil
	// while paused or when unbounded. A sandbox paused by the lifecycle says so in
	// PauseReason; an ended one why in TerminationReason (docs/lifecycle.md).
	ExpiresAt         *time.Time `json:"expires_at"`
	IdleAt            *time.Time `json:"idle_at"`
	PauseReason       *string    `json:"pause_reason"`
	TerminationReason *string    `json:"termination_reason"`
	// RetainUntil is when a paused sandbox is deleted with its snapshot
	// (Lifecycle.PausedRetention after its pause); nil when kept. Not shown: its
	// expires_at says when it ends.
	RetainUntil *time.Time `json:"-"`
}

// Why a sandbox was paused (Sandbox.PauseReason) or ended (TerminationReason).
const (
	// ReasonClient: its owner asked (POST .../pause, DELETE).
	ReasonClient = "client"
	// ReasonIdle: no activity for its idle timeout.
	ReasonIdle = "idle"
	// ReasonMaxLifetime: its max lifetime ended it, however active.
	ReasonMaxLifetime = "max_lifetime"
	// ReasonRetention: paused for its paused retention, deleted with its snapshot.
	ReasonRetention = "retention"
	// ReasonPausedSandboxCap: idle, to be paused, but its client was at its cap of
	// paused sandboxes: terminated instead.
	ReasonPausedSandboxCap = "paused_sandbox_cap"
)

// Bucket names a limit that can turn a request away. The names appear in 429 problem
// bodies and metric labels.
type Bucket string

const (
	BucketClientActivation  Bucket = "client_activation"
	BucketClusterActivation Bucket = "cluster_activation"
	BucketClientConcurrency Bucket = "client_concurrency"
	BucketLiveSandboxCap    Bucket = "live_sandbox_cap"
	// BucketPausedSandboxCap caps a client's paused sandboxes (they hold storage).
	BucketPausedSandboxCap Bucket = "paused_sandbox_cap"
	// BucketAuthFailures limits failed authentications per source address.
	BucketAuthFailures Bucket = "auth_failures"
)

// Charge is one activation's charge: whose buckets it is taken from, how much, and
// under which limits. Built by Caller.Charge.
type Charge struct {
	// Key is the budget key charged; "" for a warm-up, which no client asked for.
	Key ClientKey
	// Rate is Key's client activation bucket; nil charges the cluster alone (an exempt
	// client, a warm-up).
	Rate *Rate
	// Soft is Key's soft limit, within Rate: an activation admitted while the client is
	// over it is a soft breach (Charged.SoftBreach); nil is none.
	Soft *Rate
	// Tier is the tier Key is on ("" without tiers): a label of the decision's series,
	// and the reserve the cluster token is taken from first.
	Tier string
	// Reservations is how the cluster bucket is shared out between tiers, from the same
	// tier table as Tier; nil: one cluster bucket for everyone.
	Reservations *Reservations
	// Cost is the tokens taken from every bucket charged, at least 1.
	Cost int
	// Floor, for a warm-up, is the tokens the take must leave in the cluster bucket (the
	// shared remainder, when tiers reserve shares of it): a warm-up takes only what
	// users are not about to ask for, and never from a reserve. 0 for an activation a
	// client asked for.
	Floor int64
}

// Charge is the charge of one activation of cost by the caller.
func (c Caller) Charge(cost int) Charge {
	return Charge{Key: c.Key, Rate: c.ClientRate, Soft: c.SoftRate, Tier: c.Tier, Reservations: c.Reservations, Cost: cost}
}

// Charged is what an admitted charge found.
type Charged struct {
	// SoftBreach is true when the client was over its soft limit: the activation is
	// admitted as usual, and the substrate told so that it can degrade it first.
	SoftBreach bool
}

// Charger charges activations to the activation buckets (internal/admission's
// Admitter): the one seam between the activation flow (and the warm pool's
// replenisher) and the budget.
type Charger interface {
	// Charge takes c.Cost tokens from the cluster bucket and, when c.Rate is not nil,
	// from c.Key's bucket: all or none. A bucket too empty is a *LimitError and nothing
	// is taken.
	Charge(ctx context.Context, c Charge) (Charged, error)
	// CachedRefusal returns the refusal a Charge now would meet when this replica
	// knows it without asking the budget store (its refusal cache), or nil, in which
	// case only a Charge can tell. It takes nothing from the store; it lets a create be
	// turned away before any other work. A create it lets through holds its cost
	// against what the replica knows of the buckets until its Charge is decided, so
	// that no more go on to the store than the buckets could serve: the Hold, given
	// back by Release once the charge is decided or the create ends without one.
	CachedRefusal(c Charge) (Hold, *LimitError)
}

// A Lease is one of a budget key's places under its concurrency cap, held from its
// Acquire (internal/admission's ConcurrencyLimiter) until Release.
type Lease struct {
	release func()
	// Roomy is true when the place was taken with at most half of the cap in use, this
	// place counted: a place given back a moment late then costs the key nothing, since
	// its next request still finds at least half the cap free. The API answers a
	// request that holds a roomy lease before giving the place back, one round trip to
	// Redis off what its caller waits for; a key nearer its cap gets its place back
	// before it is answered, so that its next request never finds the last one still
	// counted. False for a lease of no cap, or taken while Redis did not answer (both
	// give back nothing).
	Roomy bool
}

// NewLease returns the Lease that release gives back; release must be safe to call
// more than once.
func NewLease(release func(), roomy bool) Lease { return Lease{release: release, Roomy: roomy} }

// Release gives the place back. It is safe to call more than once; the zero Lease
// holds nothing.
func (l Lease) Release() {
	if l.release != nil {
		l.release()
	}
}

// A Hold is what a create let through by Charger.CachedRefusal holds of the buckets
// it was judged by. Release gives it back; it is safe to call more than once, and
// after the charge it was held for. A nil Hold holds nothing.
type Hold interface{ Release() }
