package api

import (
	"net/http"
	"time"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/admission"
)

// LimitsBody is GET /v1/limits: the limits enforced on the caller, from the same
// resolution the admission path uses, and what its buckets hold right now.
type LimitsBody struct {
	// ClientID is the authenticated caller; Client is its budget key (the id when
	// allowlisted, "unknown" otherwise), which every limit below is for.
	ClientID    space.ClientID  `json:"client_id"`
	Client      space.ClientKey `json:"client"`
	Allowlisted bool            `json:"allowlisted"`
	// AdmissionEnabled is false when nothing is charged at all.
	AdmissionEnabled bool `json:"admission_enabled"`
	// Admission is how the activation buckets are applied to this caller now: enforced,
	// shadow (decided and recorded, not enforced), disabled (nothing charged),
	// fail_open (Redis unreachable: admitted within this replica's last view of the
	// buckets) or fail_closed (Redis
	// unreachable: refused). The buckets below carry the same status.
	Admission     admission.Enforcement `json:"admission"`
	Cluster       BucketBody            `json:"cluster_activation"`
	ClientRate    ClientBucketBody      `json:"client_activation"`
	Concurrency   *int                  `json:"concurrency"`    // null: no cap
	LiveSandboxes *int                  `json:"live_sandboxes"` // null: no cap
	// ActivationCosts is how many tokens one activation of each template takes from
	// both activation buckets.
	ActivationCosts map[string]int `json:"activation_costs"`
	// MaxActivationCost is the largest cost the caller may ask for; null: no cap.
	MaxActivationCost *int `json:"max_activation_cost"`
	// SoftLimit is the caller's soft limit: an activation admitted over it is marked
	// and signalled to the substrate, never refused; null: none.
	SoftLimit *RateBody `json:"soft_limit"`
	// QueueWeight is the caller's share of the dispatcher's queue against other
	// owners' (lanes per owner times it): 1 unless its tier or entry says more.
	QueueWeight int `json:"queue_weight"`
	// Lifecycle is how long the caller's sandboxes live, idle and stay paused, fixed
	// on each sandbox when it is created, paused or kept alive.
	Lifecycle LifecycleBody `json:"lifecycle"`
	// Tier is the tier the budget key is on, absent when no tier table is loaded;
	// TierSource says how it was resolved, and FallbackReason why the floor tier
	// applies when it does.
	Tier           string           `json:"tier,omitempty"`
	TierSource     space.TierSource `json:"tier_source,omitempty"`
	FallbackReason string           `json:"fallback_reason,omitempty"`
	// Reserve is the tier's reserved share of the cluster bucket, when it has one.
	Reserve *ReserveBody `json:"reserve,omitempty"`
	// Sources says where each value came from: env, default, tier, fallback, client
	// or flag (the quota flag's rate object).
	Sources  SourcesBody `json:"sources"`
	Warnings []string    `json:"warnings,omitempty"`
}

// RateBody is a token bucket's rate.
type RateBody struct {
	RefillRPS float64 `json:"refill_rps"`
	Burst     int64   `json:"burst"`
}

func rateBody(r *space.Rate) *RateBody {
	if r == nil {
		return nil
	}
	return &RateBody{RefillRPS: r.RefillRPS, Burst: r.Burst}
}

// ReserveBody is a tier's reserved share of the cluster bucket, and how much of it
// other tiers may borrow while it is idle.
type ReserveBody struct {
	RefillRPS float64 `json:"reserved_rps"`
	Burst     int64   `json:"reserved_burst"`
	Lendable  float64 `json:"lendable"`
}

func reserveBody(res *space.Reservations, tier string) *ReserveBody {
	r, ok := res.Of(tier)
	if !ok {
		return nil
	}
	return &ReserveBody{RefillRPS: r.Rate.RefillRPS, Burst: r.Rate.Burst, Lendable: r.Lendable}
}

// SourcesBody is where each of a caller's limits came from; the lifecycle's under the
// names of its fields.
type SourcesBody struct {
	ClientActivation       space.RateSource `json:"client_activation"`
	Concurrency            space.RateSource `json:"concurrency"`
	LiveSandboxes          space.RateSource `json:"live_sandboxes"`
	MaxActivationCost      space.RateSource `json:"max_activation_cost"`
	SoftLimit              space.RateSource `json:"soft_limit"`
	QueueWeight            space.RateSource `json:"queue_weight"`
	MaxLifetimeSeconds     space.RateSource `json:"max_lifetime_seconds"`
	IdleTimeoutSeconds     space.RateSource `json:"idle_timeout_seconds"`
	IdleAction             space.RateSource `json:"idle_action"`
	PausedRetentionSeconds space.RateSource `json:"paused_retention_seconds"`
	PausedSandboxes        space.RateSource `json:"paused_sandboxes"`
}

func sourcesBody(s space.Sources) SourcesBody {
	return SourcesBody{ClientActivation: s.ClientRate, Concurrency: s.Concurrency, LiveSandboxes: s.LiveSandboxes,
		MaxActivationCost: s.MaxActivationCost, SoftLimit: s.SoftRate, QueueWeight: s.QueueWeight,
		MaxLifetimeSeconds: s.MaxLifetime, IdleTimeoutSeconds: s.IdleTimeout, IdleAction: s.IdleAction,
		PausedRetentionSeconds: s.PausedRetention, PausedSandboxes: s.PausedSandboxes}
}

// LifecycleBody is a space.Lifecycle as GET /v1/limits and GET /v1/tiers report it,
// under the quota flag's names: null where nothing is bounded.
type LifecycleBody struct {
	MaxLifetimeSeconds *int64 `json:"max_lifetime_seconds"`
	IdleTimeoutSeconds *int64 `json:"idle_timeout_seconds"`
	// IdleAction is null without an idle timeout: no sandbox is ever idle then.
	IdleAction             *space.IdleAction `json:"idle_action"`
	PausedRetentionSeconds *int64            `json:"paused_retention_seconds"`
	PausedSandboxes        *int              `json:"paused_sandboxes"`
}

func lifecycleBody(lc space.Lifecycle) LifecycleBody {
	b := LifecycleBody{
		MaxLifetimeSeconds:     secondsOrNull(lc.MaxLifetime),
		IdleTimeoutSeconds:     secondsOrNull(lc.IdleTimeout),
		PausedRetentionSeconds: secondsOrNull(lc.PausedRetention),
		PausedSandboxes:        capOrNull(lc.PausedSandboxes),
	}
	if b.IdleTimeoutSeconds != nil {
		a := lc.IdleAction
		if a == "" {
			a = space.IdlePause // space.Lifecycle's default
		}
		b.IdleAction = &a
	}
	return b
}

// secondsOrNull is d in whole seconds, rounded up so that a bound is never reported as
// none; null when d bounds nothing.
func secondsOrNull(d time.Duration) *int64 {
	if d <= 0 {
		return nil
	}
	n := int64((d + time.Second - 1) / time.Second)
	return &n
}

// BucketBody is one token bucket as enforced.
type BucketBody struct {
	// Status is the Admission the bucket is under (on the client bucket it is exempt
	// or none when the caller has no client bucket).
	Status    string  `json:"status"`
	RefillRPS float64 `json:"refill_rps"`
	Burst     int64   `json:"burst"`
	// Remaining is the tokens in the bucket now; null when Redis could not be read.
	Remaining *float64 `json:"remaining"`
}

// ClientBucketBody is the caller's own bucket, with its rate when it has one, or
// status exempt (the flag says null) or none (no client rate configured); and where
// that came from.
type ClientBucketBody struct {
	Status string           `json:"status"` // an Admission, "exempt" or "none"
	Source space.RateSource `json:"source"`
	*BucketBody
}

func capOrNull(n int) *int {
	if n <= 0 {
		return nil
	}
	return &n
}

func (s *Server) getLimits(w http.ResponseWriter, r *http.Request) {
	l := callerFrom(r.Context())
	body := LimitsBody{
		ClientID:          l.ID,
		Client:            l.Key,
		Allowlisted:       l.Allowlisted,
		AdmissionEnabled:  l.AdmissionEnabled,
		Cluster:           BucketBody{RefillRPS: l.Cluster.RefillRPS, Burst: l.Cluster.Burst},
		ClientRate:        ClientBucketBody{Status: "none", Source: l.RateSource},
		Concurrency:       capOrNull(l.Concurrency),
		LiveSandboxes:     capOrNull(l.LiveSandboxes),
		ActivationCosts:   s.sandboxes.Costs(),
		MaxActivationCost: capOrNull(l.MaxActivationCost),
		SoftLimit:         rateBody(l.SoftRate),
		QueueWeight:       max(l.QueueWeight, 1),
		Lifecycle:         lifecycleBody(l.Lifecycle),
		Tier:              l.Tier,
		TierSource:        l.TierSource,
		FallbackReason:    l.FallbackReason,
		Reserve:           reserveBody(l.Reservations, l.Tier),
		Sources:           sourcesBody(l.Sources),
		Warnings:          append([]string(nil), l.Warnings...),
	}
	// The same Admitter that enforces says how: a read of the very buckets a create's
	// Charge would take from, taking no token.
	d, enforcement, err := s.budgets.Report(r.Context(), l.Charge(1))
	body.Admission = enforcement
	body.Cluster.Status = string(enforcement)
	switch {
	case l.ClientRate != nil:
		body.ClientRate.Status = string(enforcement)
		body.ClientRate.BucketBody = &BucketBody{Status: string(enforcement), RefillRPS: l.ClientRate.RefillRPS, Burst: l.ClientRate.Burst}
	case enforcement == admission.Disabled:
		body.ClientRate.Status = string(enforcement) // no rate applies while disabled
	case l.ClientExempt:
		body.ClientRate.Status = "exempt"
	}
	if err == nil {
		body.Cluster.Remaining = &d.Cluster.Remaining
		if d.Client != nil && body.ClientRate.BucketBody != nil {
			body.ClientRate.Remaining = &d.Client.Remaining
		}
	} else {
		body.Warnings = append(body.Warnings, "the activation buckets could not be read; remaining is unknown")
	}
	switch enforcement {
	case admission.Shadow:
		body.Warnings = append(body.Warnings, "shadow mode: decisions are recorded but not enforced; every activation is admitted")
	case admission.Disabled:
		body.Warnings = append(body.Warnings, "admission is disabled: activations are neither charged nor limited by rate")
	case admission.FailOpen:
		body.Warnings = append(body.Warnings, "the admission store is unreachable: until it is back, each replica admits within what it last knew of the buckets, and refuses a client it knew empty")
	case admission.FailClosed:
		body.Warnings = append(body.Warnings, "the admission store is unreachable: activations are refused until it is back")
	}
	writeJSON(w, http.StatusOK, body)
}

// TiersBody is GET /v1/tiers: every tier's enforced values, from the tier table in
// force, as a client on the tier with no entry of its own is served them.
type TiersBody struct {
	// FallbackTier is the floor tier (SPACE_FALLBACK_TIER); absent without tiers.
	FallbackTier string     `json:"fallback_tier,omitempty"`
	Tiers        []TierBody `json:"tiers"`
	// SharedRemainder is the cluster bucket left to every activation once the reserves
	// are set aside; absent when no tier reserves anything.
	SharedRemainder *RateBody `json:"shared_remainder,omitempty"`
}

// TierBody is one tier's enforced values.
type TierBody struct {
	Name string `json:"name"`
	// ClientActivation is the rate of each client's own bucket on the tier; null: no
	// client bucket.
	ClientActivation  *RateBody    `json:"client_activation"`
	Concurrency       *int         `json:"concurrency"`
	LiveSandboxes     *int         `json:"live_sandboxes"`
	MaxActivationCost *int         `json:"max_activation_cost"`
	SoftLimit         *RateBody    `json:"soft_limit"`
	QueueWeight       int          `json:"queue_weight"`
	Reserve           *ReserveBody `json:"reserve"`
	// Lifecycle is the tier's, as a client on it with no entry of its own gets it.
	Lifecycle LifecycleBody `json:"lifecycle"`
	Sources   SourcesBody   `json:"sources"`
}

func (s *Server) getTiers(w http.ResponseWriter, r *http.Request) {
	table := s.tiers.Tiers(r.Context())
	body := TiersBody{FallbackTier: table.Fallback, Tiers: []TierBody{}}
	if table.Reservations != nil {
		body.SharedRemainder = rateBody(&table.Reservations.Shared)
	}
	for _, t := range table.Tiers {
		body.Tiers = append(body.Tiers, TierBody{
			Name:              t.Tier,
			ClientActivation:  rateBody(t.ClientRate),
			Concurrency:       capOrNull(t.Concurrency),
			LiveSandboxes:     capOrNull(t.LiveSandboxes),
			MaxActivationCost: capOrNull(t.MaxActivationCost),
			SoftLimit:         rateBody(t.SoftRate),
			QueueWeight:       max(t.QueueWeight, 1),
			Reserve:           reserveBody(table.Reservations, t.Tier),
			Lifecycle:         lifecycleBody(t.Lifecycle),
			Sources:           sourcesBody(t.Sources),
		})
	}
	writeJSON(w, http.StatusOK, body)
}
