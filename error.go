package space

import (
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Error codes. Each maps to exactly one HTTP status in internal/api (one table); the
// rest of the program speaks only these codes.
const (
	EINVALID       = "invalid"                // the request is malformed (400)
	EUNAUTHORIZED  = "unauthorized"           // no valid credentials (401)
	ENOTFOUND      = "not_found"              // no such thing, or not the caller's (404)
	ECONFLICT      = "conflict"               // the thing's state does not allow it (409)
	EUNPROCESSABLE = "unprocessable"          // well formed but cannot be served, e.g. a shape over the caps (422)
	EUNSUPPORTED   = "unsupported_media_type" // a body that is not application/json (415)
	ETOOLARGE      = "headers_too_large"      // request headers over the server's limit (431)
	ELIMITED       = "limited"                // a limit turned it away: see *LimitError (429)
	EUNAVAILABLE   = "unavailable"            // a dependency is down (503)
	EOVERLOADED    = "overloaded"             // the replica is at its capacity: retry after Retry-After (503)
	EINTERNAL      = "internal"               // a bug or an unexpected failure (500)
)

// Error is a domain error: a code for the machine, a message for the caller, and, for
// a bad input, the field it is about.
type Error struct {
	Code    string
	Message string
	// Field is the JSON field or parameter the error is about, if any.
	Field string
	// Err is the underlying cause, for logs; it is never shown to callers.
	Err error
}

func (e *Error) Error() string {
	s := e.Code + ": " + e.Message
	if e.Field != "" {
		s = e.Code + ": " + e.Field + ": " + e.Message
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *Error) Unwrap() error { return e.Err }

// Errorf returns an *Error with the given code and a formatted message.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// FieldError returns an *Error about one input field.
func FieldError(code, field, format string, args ...any) *Error {
	return &Error{Code: code, Field: field, Message: fmt.Sprintf(format, args...)}
}

// Unavailable wraps a dependency failure as EUNAVAILABLE, naming the dependency.
func Unavailable(dependency string, err error) *Error {
	return &Error{Code: EUNAVAILABLE, Message: dependency + " is unavailable", Err: err}
}

// ErrorCode returns the code of err: the code of the first *Error or *LimitError in its
// chain, EINTERNAL for any other error, and "" for nil.
func ErrorCode(err error) string {
	if err == nil {
		return ""
	}
	// AsType, not As: no reflection and no allocation, on the path of every refusal.
	if _, ok := errors.AsType[*LimitError](err); ok {
		return ELIMITED
	}
	if e, ok := errors.AsType[*Error](err); ok {
		return e.Code
	}
	return EINTERNAL
}

// ErrorMessage returns the caller-facing message of err. Internal errors get a generic
// message so that no internal detail leaks.
func ErrorMessage(err error) string {
	if err == nil {
		return ""
	}
	if le, ok := errors.AsType[*LimitError](err); ok {
		return le.Message()
	}
	if e, ok := errors.AsType[*Error](err); ok {
		return e.Message
	}
	return "internal error"
}

// LimitError is a request turned away by one of the limits (ELIMITED, HTTP 429). It
// carries what a caller needs to back off: which bucket, whose, and when to retry.
type LimitError struct {
	Bucket Bucket
	Client ClientKey
	// RetryAfter is the earliest time at which a retry can succeed: the refill time of
	// whichever empty bucket refills last. It is not jittered; the API jitters it.
	RetryAfter time.Duration
	// Limit is the rate of the bucket that turned the request away, when it is a token
	// bucket; nil for concurrency and live caps.
	Limit *Rate
	// Cap is the limit for the concurrency and live caps; 0 for token buckets.
	Cap int
	// Remaining is what was left in the rejecting bucket (tokens, or places).
	Remaining float64
	// FromMemory is true for a refusal a replica made from what it last learnt of the
	// bucket, without asking Redis (Charger.CachedRefusal): the API paces those.
	FromMemory bool
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("%s: %s", ELIMITED, e.Message())
}

// IdentityMode is how callers prove who they are (SPACE_AUTH_MODE). It changes only
// what a caller off the allowlist is told about getting a rate of its own.
type IdentityMode string

const (
	// IdentityAPIKey: an API key issued for a client id.
	IdentityAPIKey IdentityMode = "api_key"
	// IdentityTrustedHeader: X-Client-ID set by an authenticating gateway.
	IdentityTrustedHeader IdentityMode = "trusted_header"
)

// Message is the caller-facing explanation, one per bucket (README.md, API), in words
// that fit no identity mode in particular (see MessageFor).
func (e *LimitError) Message() string { return e.MessageFor("") }

// MessageFor is Message in the words of the identity mode the caller used: a caller
// off the allowlist, refused by the rate it shares with every such caller, is told
// how it could get a rate of its own.
func (e *LimitError) MessageFor(mode IdentityMode) string {
	switch e.Bucket {
	case BucketClientActivation:
		// Written once into a buffer on the stack: the one message a client flooding
		// over its rate is told at each refusal.
		var buf [160]byte
		b := AppendQuote(append(buf[:0], "client "...), string(e.Client))
		b = append(b, " is over its sandbox activation rate; slow down and retry after the Retry-After delay"...)
		if e.Client == Unknown {
			switch mode {
			case IdentityAPIKey:
				b = append(b, "; your API key's client is not on the allowlist, so it shares this rate with every client off the allowlist: ask the operator to allowlist it for a rate of its own"...)
			case IdentityTrustedHeader:
				b = append(b, "; activations without an allowlisted X-Client-ID share this rate"...)
			default:
				b = append(b, "; every client off the allowlist shares this rate"...)
			}
		}
		return string(b)
	case BucketClusterActivation:
		return "the cluster is at its sandbox activation capacity; retry later"
	case BucketClientConcurrency:
		return fmt.Sprintf("client %q has too many requests in flight (cap %d); retry when one finishes", string(e.Client), e.Cap)
	case BucketAuthFailures:
		return "too many failed authentications from this address; retry after the Retry-After delay"
	case BucketLiveSandboxCap:
		return fmt.Sprintf("client %q has reached its cap of %d live sandboxes; pause or delete one first", string(e.Client), e.Cap)
	case BucketPausedSandboxCap:
		return fmt.Sprintf("client %q has reached its cap of %d paused sandboxes; delete one, or restore one, first", string(e.Client), e.Cap)
	}
	return "rate limited"
}

// AppendQuote appends s quoted as strconv.AppendQuote does. Printable ASCII but the
// quote and the backslash, the whole of every budget key, client id and bucket name,
// is copied between its quotes at once; strconv walks it rune by rune. The two a
// refusal quotes took 209 ns, now 28 (BenchmarkAppendQuote). Anything else is
// strconv's.
func AppendQuote(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' {
			return strconv.AppendQuote(b, s)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
