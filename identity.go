package space

import "fmt"

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
)

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
}
