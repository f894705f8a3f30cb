package space

import (
	"fmt"
	"regexp"
	"time"
)

// ClientID is who a request is from: the client its API key was issued for
// (SPACE_AUTH_MODE=api_key) or the X-Client-ID its trusted gateway set
// (trusted_header). It owns what the caller creates (sandboxes, operations,
// idempotency keys) and every read or change checks it.
//
// A ClientID is not a budget key: two callers off the allowlist share the budget key
// Unknown but never each other's sandboxes. See Caller.
type ClientID string

// MaxClientIDLen bounds a client id. Ids become database values and log fields, and
// allowlisted ones become Redis keys and metric labels.
const MaxClientIDLen = 128

// CheckClientID reports whether id can name a client: 1 to MaxClientIDLen ASCII
// letters, digits, '.', '_', '-', ':' or '@', starting with a letter or a digit, and
// not "unknown". The character set keeps ids safe in every place they travel (HTTP
// headers, Redis keys, label values, logs) without escaping; "unknown" is reserved for
// the shared budget key of every caller off the allowlist, so that no caller can own
// what was recorded under it before ownership and budget were told apart.
func CheckClientID(id string) error {
	switch {
	case id == "":
		return fmt.Errorf("a client id must not be empty")
	case len(id) > MaxClientIDLen:
		return fmt.Errorf("a client id is at most %d characters, got %d", MaxClientIDLen, len(id))
	case id == string(Unknown):
		return fmt.Errorf("%q is reserved for the callers off the allowlist and cannot be a client id", id)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || c != '.' && c != '_' && c != '-' && c != ':' && c != '@') {
			return fmt.Errorf("a client id is letters, digits, '.', '_', '-', ':' and '@', starting with a letter or digit; byte %d is not", i+1)
		}
	}
	return nil
}

// ClientIDRule is CheckClientID's rule in a sentence, for documentation and errors.
const ClientIDRule = "1 to 128 ASCII letters, digits, '.', '_', '-', ':' or '@', starting with a letter or digit, and not \"unknown\""

// RateSource says where a caller's activation rate (or its absence) came from, as
// GET /v1/limits reports it.
type RateSource string

const (
	// SourceEnv: the env client rate (SPACE_CLUSTER_ACTIVATION_ADMISSION_CLIENT_*), or
	// no client bucket when that is unset. Also every key while admission is disabled.
	SourceEnv RateSource = "env"
	// SourceFlag: the key's entry in the quota flag's "rate" object (a rate, or null:
	// exempt).
	SourceFlag RateSource = "flag"
	// SourceMalformedFallback: the key's entry is malformed, so the env rate applies.
	SourceMalformedFallback RateSource = "flag_malformed_fallback"
	// SourceClient: the field of the key's own entry in the quota flag's "clients".
	SourceClient RateSource = "client"
	// SourceTier: the field of the key's tier in the quota flag's "tiers".
	SourceTier RateSource = "tier"
	// SourceFallback: the field of the floor tier (SPACE_FALLBACK_TIER), which the key
	// is on because its own tier could not be resolved.
	SourceFallback RateSource = "fallback"
	// SourceDefault: the quota flag's "default" object.
	SourceDefault RateSource = "default"
)

// TierSource says how a caller's tier was resolved, as GET /v1/limits reports it.
type TierSource string

const (
	// TierFromClient: the "tier" of the key's entry in the quota flag's "clients".
	TierFromClient TierSource = "client"
	// TierFromFlag: the string flag space-api-client-tier, evaluated with the client
	// id as its targetingKey.
	TierFromFlag TierSource = "flag"
	// TierFallback: the floor tier, SPACE_FALLBACK_TIER; Caller.FallbackReason says why.
	TierFallback TierSource = "fallback"
)

// Why a caller is on the floor tier (Caller.FallbackReason, and the reason label of
// space_tier_fallback_total).
const (
	// FallbackUnassigned: nothing names a tier for the key; the floor is its tier by
	// design, not by a failure, and it is not counted as a fall.
	FallbackUnassigned = "unassigned"
	// FallbackUnknownTier: the key's tier names no entry of the table (a name left
	// behind by a rename).
	FallbackUnknownTier = "unknown_tier"
	// FallbackEvaluationError: the tier flag's evaluation failed.
	FallbackEvaluationError = "evaluation_error"
	// FallbackProviderNotReady: the flags provider was not ready to evaluate it.
	FallbackProviderNotReady = "provider_not_ready"
)

// Sources says where each of a caller's limits came from.
type Sources struct {
	ClientRate, Concurrency, LiveSandboxes, MaxActivationCost, SoftRate, QueueWeight RateSource
	// The lifecycle's fields (Caller.Lifecycle).
	MaxLifetime, IdleTimeout, IdleAction, PausedRetention, PausedSandboxes RateSource
}

// IdleAction is what the lifecycle does to a running sandbox idle for its idle
// timeout.
type IdleAction string

const (
	// IdlePause pauses it: it keeps its state and frees its live place (the
	// default).
	IdlePause IdleAction = "pause"
	// IdleTerminate ends it.
	IdleTerminate IdleAction = "terminate"
)

// Lifecycle bounds how long a client's sandboxes live and idle (docs/lifecycle.md):
// its tier's, each field overridable by its client entry. A zero field bounds
// nothing. The deadlines are fixed when a sandbox is created, paused or kept alive,
// from the lifecycle in force then.
type Lifecycle struct {
	// MaxLifetime ends a sandbox this long after its creation, however active, paused
	// or not (max_lifetime_seconds).
	MaxLifetime time.Duration
	// IdleTimeout is how long a running sandbox may go without activity before
	// IdleAction is taken (idle_timeout_seconds).
	IdleTimeout time.Duration
	// IdleAction is taken on an idle sandbox (idle_action): IdlePause when empty.
	IdleAction IdleAction
	// PausedRetention deletes a paused sandbox with its snapshot this long after its
	// pause (paused_retention_seconds).
	PausedRetention time.Duration
	// PausedSandboxes caps the client's paused sandboxes, which hold storage
	// (paused_sandboxes): a pause past it is refused, an idle action past it
	// terminates instead.
	PausedSandboxes int
}

// Reserve is a tier's reserved share of the cluster activation bucket: its own bucket
// of Rate, which its activations take from first, and which other tiers may borrow
// from while the tier is idle, down to what Lendable (0 to 1) leaves of its burst.
type Reserve struct {
	Rate     Rate
	Lendable float64
}

// TierReserve is one tier's reserve.
type TierReserve struct {
	Tier string
	Reserve
}

// Reservations is how the cluster activation bucket is shared out between tiers, as
// one loaded tier table sets it: the reserves, by tier name in order, and the shared
// remainder every activation may take from (the cluster rate and burst minus every
// reserve). Never modified once built; nil when no tier reserves anything.
type Reservations struct {
	Shared   Rate
	Reserves []TierReserve
}

// Of returns tier's reserve, and whether it has one.
func (r *Reservations) Of(tier string) (Reserve, bool) {
	if r != nil {
		for _, t := range r.Reserves {
			if t.Tier == tier {
				return t.Reserve, true
			}
		}
	}
	return Reserve{}, false
}

// Caller is who a request or a queued operation acts for and every limit it runs
// under: resolved once (internal/flags) per request or per run of a job, carried in
// the context (NewContext), taken as is by the sandbox flow, and reported by
// GET /v1/limits, so that what is reported is what is enforced.
//
// It holds two identities with two jobs. ID owns what the caller creates. Key, the
// bounded budget key, names the Redis keys, metric labels and the rate, concurrency
// and live caps: ID when it is on the allowlist, Unknown otherwise.
type Caller struct {
	ID  ClientID
	Key ClientKey
	// Allowlisted is true when Key is the caller's own id (never for Unknown).
	Allowlisted bool
	// Concurrency caps Key's in-flight requests; 0 is no cap.
	Concurrency int
	// LiveSandboxes caps Key's live sandboxes; 0 is no cap.
	LiveSandboxes int
	// AdmissionEnabled is SPACE_CLUSTER_ACTIVATION_ADMISSION_ENABLED: false charges
	// nothing.
	AdmissionEnabled bool
	// Cluster is the shared cluster activation rate.
	Cluster Rate
	// ClientRate is Key's activation bucket; nil charges the cluster bucket alone. It
	// is the caller's own copy.
	ClientRate *Rate
	// ClientExempt is true when ClientRate is nil because the quota flag's entry for
	// Key is null, as opposed to there being no client rate at all.
	ClientExempt bool
	// RateSource is where ClientRate (or its absence) came from.
	RateSource RateSource

	// Tier is the tier Key is on; "" when no tier table is loaded.
	Tier string
	// TierSource says how Tier was resolved, and FallbackReason, for a TierFallback,
	// why (one of the Fallback* reasons).
	TierSource     TierSource
	FallbackReason string
	// MaxActivationCost is the largest activation cost Key may ask for (a template
	// costing more is refused, 422); 0 is no cap.
	MaxActivationCost int
	// QueueWeight is the caller's share of the queue, against other owners', when its
	// queued operations wait (internal/dispatcher's lanes): its tier's queue_weight, 1
	// by default.
	QueueWeight int
	// SoftRate is Key's soft limit: an activation admitted while the client is over it
	// is a soft breach, signalled to the substrate; nil is none.
	SoftRate *Rate
	// Reservations is how the cluster bucket is shared out between tiers, from the
	// same tier table as Tier; nil when nothing is reserved.
	Reservations *Reservations
	// Lifecycle bounds how long the caller's sandboxes live and idle.
	Lifecycle Lifecycle
	// Sources says where each limit came from.
	Sources Sources
	// Warnings are what the resolution found wrong with the caller's entry or tier
	// (a malformed rate entry, a tier that is not in the table, ...), as GET
	// /v1/limits reports them.
	Warnings []string
}

// TierNameRule is what a tier may be named: it becomes a Redis key's suffix and a
// metric label.
const TierNameRule = "1 to 63 lowercase letters, digits, '.', '_' or '-', starting with a letter or digit"

var tierName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// CheckTierName reports whether name can name a tier (TierNameRule).
func CheckTierName(name string) error {
	if !tierName.MatchString(name) {
		return fmt.Errorf("a tier name is %s", TierNameRule)
	}
	return nil
}
