package api

import (
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/admission"
)

// statusByCode is the one table from domain error codes to HTTP status.
var statusByCode = map[string]int{
	space.EINVALID:       http.StatusBadRequest,
	space.EUNAUTHORIZED:  http.StatusUnauthorized,
	space.ENOTFOUND:      http.StatusNotFound,
	space.ECONFLICT:      http.StatusConflict,
	space.EUNPROCESSABLE: http.StatusUnprocessableEntity,
	space.EUNSUPPORTED:   http.StatusUnsupportedMediaType,
	space.ETOOLARGE:      http.StatusRequestHeaderFieldsTooLarge,
	space.ELIMITED:       http.StatusTooManyRequests,
	space.EUNAVAILABLE:   http.StatusServiceUnavailable,
	space.EINTERNAL:      http.StatusInternalServerError,
}

// Status returns the HTTP status of a domain error.
func Status(err error) int { return statusOf(space.ErrorCode(err)) }

// statusOf is the HTTP status of a domain error code.
func statusOf(code string) int {
	if s, ok := statusByCode[code]; ok {
		return s
	}
	return http.StatusInternalServerError
}

// Problem is an RFC 9457 problem details body, with the extension members space adds:
// the error code, the field a bad input is about, and for limits the bucket and client.
type Problem struct {
	Type      string          `json:"type"`
	Title     string          `json:"title"`
	Status    int             `json:"status"`
	Detail    string          `json:"detail,omitempty"`
	Instance  string          `json:"instance,omitempty"`
	Code      string          `json:"code"`
	Field     string          `json:"field,omitempty"`
	Bucket    space.Bucket    `json:"bucket,omitempty"`
	Client    space.ClientKey `json:"client,omitempty"`
	RequestID string          `json:"request_id,omitempty"`
}

// problemTypeBase is the page that documents every problem type, one section per code.
// A type URI is first an identifier, compared by clients, so it is one absolute URI
// whatever the deployment (RFC 9457 §3.1.1 warns against relative ones), and second a
// locator: followed, it shows the code's section of docs/problems.md.
const problemTypeBase = "https://github.com/space-sandbox/space/blob/main/docs/problems.md#"

// problemTypes holds the type URI of every code in statusByCode, made once rather than
// on each answer.
var problemTypes = func() map[string]string {
	types := make(map[string]string, len(statusByCode))
	for code := range statusByCode {
		types[code] = problemTypeBase + code
	}
	return types
}()

// ProblemType is the type URI of a problem with the given code: its section of
// docs/problems.md.
func ProblemType(code string) string {
	if t, ok := problemTypes[code]; ok {
		return t
	}
	return problemTypeBase + code
}

// writeError renders err as problem+json with the status of its code. Internal errors
// are logged with the request id and shown to the caller as a bare "internal error".
// A refusal is explained in the words of the server's identity mode.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	code := space.ErrorCode(err)
	status := statusOf(code)
	p := Problem{
		Type:      ProblemType(code),
		Title:     http.StatusText(status),
		Status:    status,
		Instance:  r.URL.Path,
		Code:      code,
		RequestID: RequestID(r.Context()),
	}
	if le, ok := errors.AsType[*space.LimitError](err); ok {
		p.Bucket, p.Client = le.Bucket, le.Client
		p.Detail = le.MessageFor(s.identity)
		setLimitHeaders(w.Header(), le, rand.Float64)
	} else {
		p.Detail = space.ErrorMessage(err)
	}
	if de, ok := errors.AsType[*space.Error](err); ok {
		p.Field = de.Field
	}
	switch {
	case status >= 500:
		s.logger.ErrorContext(r.Context(), "request failed", "code", code, "err", err, "request_id", p.RequestID)
	case code == space.EUNAUTHORIZED:
		w.Header().Set("WWW-Authenticate", `Bearer realm="space"`)
	}
	writeProblem(w, p)
}

func writeProblem(w http.ResponseWriter, p Problem) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}

// NeverRetryAfter is the Retry-After of a bucket that never refills (rate 0): its
// true answer is "never", and a day keeps clients' arithmetic sane. Every finite
// refill is told as it is, however long: a Retry-After is never earlier than the
// refill.
const NeverRetryAfter = 24 * time.Hour

// setLimitHeaders sets Retry-After and the RateLimit-Policy / RateLimit fields of
// draft-ietf-httpapi-ratelimit-headers for a turned-away request. For a token bucket the
// quota q is the burst and the window w the time an empty bucket takes to refill; r is
// what remains and t the seconds until it is useful again.
func setLimitHeaders(h http.Header, le *space.LimitError, rnd func() float64) {
	// A bucket that never refills reports the longest Duration (see NeverRetryAfter).
	var retry int64
	if le.RetryAfter == time.Duration(math.MaxInt64) {
		retry = int64(NeverRetryAfter / time.Second)
	} else {
		retry = int64(admission.RetryAfter(le.RetryAfter, rnd) / time.Second)
	}
	// Written with strconv and concatenation: appending into a fixed buffer saves no
	// allocation and about 0.1 µs of the ~2 µs a 429 takes to write, and fmt costs two
	// allocations more (BenchmarkSetLimitHeaders, BenchmarkWriteLimitError). The keys
	// are canonical forms, which Set keeps as they are rather than making a new string.
	h.Set("Retry-After", strconv.FormatInt(retry, 10))
	name := strconv.Quote(string(le.Bucket))
	switch {
	case le.Limit != nil:
		window := int64(1)
		if le.Limit.RefillRPS > 0 {
			window = int64(math.Max(1, math.Ceil(float64(le.Limit.Burst)/le.Limit.RefillRPS)))
		}
		h.Set(rateLimitPolicy, name+";q="+strconv.FormatInt(le.Limit.Burst, 10)+";w="+strconv.FormatInt(window, 10))
	case le.Cap > 0:
		h.Set(rateLimitPolicy, name+";q="+strconv.Itoa(le.Cap))
	}
	remaining := int64(math.Max(0, math.Floor(le.Remaining)))
	h.Set(rateLimit, name+";r="+strconv.FormatInt(remaining, 10)+";t="+strconv.FormatInt(retry, 10))
}

// The canonical forms (textproto.CanonicalMIMEHeaderKey) of the RateLimit header fields' names.
const (
	rateLimitPolicy = "Ratelimit-Policy"
	rateLimit       = "Ratelimit"
)
