package api

import (
	"net/http"

	"github.com/space-sandbox/space"
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
	AdmissionEnabled bool             `json:"admission_enabled"`
	Cluster          BucketBody       `json:"cluster_activation"`
	ClientRate       ClientBucketBody `json:"client_activation"`
	Concurrency      *int             `json:"concurrency"`    // null: no cap
	LiveSandboxes    *int             `json:"live_sandboxes"` // null: no cap
	Warnings         []string         `json:"warnings,omitempty"`
}

// BucketBody is one token bucket as enforced.
type BucketBody struct {
	RefillRPS float64 `json:"refill_rps"`
	Burst     int64   `json:"burst"`
	// Remaining is the tokens in the bucket now; null when Redis could not be read.
	Remaining *float64 `json:"remaining"`
}

// ClientBucketBody is the caller's own bucket: enforced (with its rate), exempt (the
// flag says null) or none (no client rate configured), and where that came from.
type ClientBucketBody struct {
	Status string           `json:"status"` // "enforced", "exempt" or "none"
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
	}
	switch {
	case l.ClientRate != nil:
		body.ClientRate.Status = "enforced"
		body.ClientRate.BucketBody = &BucketBody{RefillRPS: l.ClientRate.RefillRPS, Burst: l.ClientRate.Burst}
	case l.ClientExempt:
		body.ClientRate.Status = "exempt"
	}
	if l.RateSource == space.SourceMalformedFallback {
		body.Warnings = append(body.Warnings, "this client's entry in the quota flag's rate object is malformed; the env rate applies until it is fixed")
	}
	if l.AdmissionEnabled {
		// A read that takes no token, of the very buckets Admit would charge.
		d, err := s.admitter.Peek(r.Context(), l.Key, l.ClientRate)
		if err == nil && !d.FailedOpen {
			body.Cluster.Remaining = &d.Cluster.Remaining
			if d.Client != nil && body.ClientRate.BucketBody != nil {
				body.ClientRate.Remaining = &d.Client.Remaining
			}
		} else {
			body.Warnings = append(body.Warnings, "the activation buckets could not be read; remaining is unknown")
		}
	}
	writeJSON(w, http.StatusOK, body)
}
