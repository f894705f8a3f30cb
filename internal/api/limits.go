package api

import (
	"net/http"

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
	// fail_open (Redis unreachable: admitted unbudgeted) or fail_closed (Redis
	// unreachable: refused). The buckets below carry the same status.
	Admission     admission.Enforcement `json:"admission"`
	Cluster       BucketBody            `json:"cluster_activation"`
	ClientRate    ClientBucketBody      `json:"client_activation"`
	Concurrency   *int                  `json:"concurrency"`    // null: no cap
	LiveSandboxes *int                  `json:"live_sandboxes"` // null: no cap
	// ActivationCosts is how many tokens one activation of each template takes from
	// both activation buckets.
	ActivationCosts map[string]int `json:"activation_costs"`
	Warnings        []string       `json:"warnings,omitempty"`
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
		ClientID:         l.ID,
		Client:           l.Key,
		Allowlisted:      l.Allowlisted,
		AdmissionEnabled: l.AdmissionEnabled,
		Cluster:          BucketBody{RefillRPS: l.Cluster.RefillRPS, Burst: l.Cluster.Burst},
		ClientRate:       ClientBucketBody{Status: "none", Source: l.RateSource},
		Concurrency:      capOrNull(l.Concurrency),
		LiveSandboxes:    capOrNull(l.LiveSandboxes),
		ActivationCosts:  s.sandboxes.Costs(),
	}
	// The same Admitter that enforces says how: a read of the very buckets Admit would
	// charge, taking no token.
	d, enforcement, err := s.budgets.Report(r.Context(), l.Key, l.ClientRate)
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
	if l.RateSource == space.SourceMalformedFallback {
		body.Warnings = append(body.Warnings, "this client's entry in the quota flag's rate object is malformed; the env rate applies until it is fixed")
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
		body.Warnings = append(body.Warnings, "the admission store is unreachable: activations are admitted without a budget until it is back")
	case admission.FailClosed:
		body.Warnings = append(body.Warnings, "the admission store is unreachable: activations are refused until it is back")
	}
	writeJSON(w, http.StatusOK, body)
}
