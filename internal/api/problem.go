package api

import (
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
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
	space.EOVERLOADED:    http.StatusServiceUnavailable,
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

// The header values of every problem, shared: a slice whose length is its capacity is
// never written through by net/http, and an append to it copies.
var (
	problemContentType = []string{"application/problem+json"}
	noStore            = []string{"no-store"}
)

// problemBuffers holds the buffers problems are rendered in: a refusal is the answer
// written most often, tens of thousands of times a second to one flooding client.
var problemBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

func writeProblem(w http.ResponseWriter, p Problem) {
	h := w.Header()
	h["Content-Type"] = problemContentType
	h["Cache-Control"] = noStore
	w.WriteHeader(p.Status)
	buf := problemBuffers.Get().(*[]byte)
	*buf = appendProblem((*buf)[:0], p)
	_, _ = w.Write(*buf)
	problemBuffers.Put(buf)
}

// appendProblem appends p as encoding/json's Encoder writes it (the same members in the
// same order, the same escapes, a newline after), without reflection: a refusal's body
// is written by hand in a fraction of the encoder's time and allocations
// (BenchmarkWriteLimitError). FuzzAppendProblem holds it to the encoder's bytes.
func appendProblem(b []byte, p Problem) []byte {
	b = append(b, `{"type":`...)
	b = appendJSONString(b, p.Type)
	b = append(b, `,"title":`...)
	b = appendJSONString(b, p.Title)
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(p.Status), 10)
	if p.Detail != "" {
		b = append(b, `,"detail":`...)
		b = appendJSONString(b, p.Detail)
	}
	if p.Instance != "" {
		b = append(b, `,"instance":`...)
		b = appendJSONString(b, p.Instance)
	}
	b = append(b, `,"code":`...)
	b = appendJSONString(b, p.Code)
	if p.Field != "" {
		b = append(b, `,"field":`...)
		b = appendJSONString(b, p.Field)
	}
	if p.Bucket != "" {
		b = append(b, `,"bucket":`...)
		b = appendJSONString(b, string(p.Bucket))
	}
	if p.Client != "" {
		b = append(b, `,"client":`...)
		b = appendJSONString(b, string(p.Client))
	}
	if p.RequestID != "" {
		b = append(b, `,"request_id":`...)
		b = appendJSONString(b, p.RequestID)
	}
	return append(b, "}\n"...)
}

// appendJSONString appends s as a JSON string the way encoding/json writes it. Printable
// ASCII, the text of nearly every problem, is copied with its quotes and backslashes
// escaped; a string with anything else (a control character, HTML's <, > and &, which
// the encoder escapes, or any non-ASCII byte) is handed to encoding/json itself.
func appendJSONString(b []byte, s string) []byte {
	begin := len(b)
	b = append(b, '"')
	from := 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case plainJSON[c]:
		case c == '"' || c == '\\':
			b = append(b, s[from:i]...)
			b = append(b, '\\', c)
			from = i + 1
		default:
			q, _ := json.Marshal(s)
			return append(b[:begin], q...)
		}
	}
	b = append(b, s[from:]...)
	return append(b, '"')
}

// plainJSON holds the bytes encoding/json writes as they are in a string: printable
// ASCII but the quote, the backslash and HTML's <, > and &.
var plainJSON = func() (t [256]bool) {
	for c := 0x20; c <= 0x7e; c++ {
		t[c] = c != '"' && c != '\\' && c != '<' && c != '>' && c != '&'
	}
	return t
}()

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
	retry, window, remaining := limitNumbers(le, rnd)
	// The three values are cut from one string, rendered in a buffer on the stack, and
	// their slices from one array: two allocations, where a string and a Set each made
	// five (BenchmarkSetLimitHeaders keeps the alternatives; fmt costs two more). Each
	// field's slice has its length for capacity: an append to one copies, never
	// writing over the next. The keys are canonical forms, set directly. The quoted
	// bucket name is rendered once, after Retry-After, and copied for RateLimit; with
	// no policy the copy lands where it already is.
	var buf [128]byte
	b := strconv.AppendInt(buf[:0], retry, 10)
	endRetry := len(b)
	b = space.AppendQuote(b, string(le.Bucket))
	name := b[endRetry:]
	switch {
	case le.Limit != nil:
		b = strconv.AppendInt(append(b, ";q="...), le.Limit.Burst, 10)
		b = strconv.AppendInt(append(b, ";w="...), window, 10)
	case le.Cap > 0:
		b = strconv.AppendInt(append(b, ";q="...), int64(le.Cap), 10)
	default:
		b = b[:endRetry] // no policy
	}
	endPolicy := len(b)
	b = append(b, name...)
	b = strconv.AppendInt(append(b, ";r="...), remaining, 10)
	b = strconv.AppendInt(append(b, ";t="...), retry, 10)
	all := string(b)
	values := make([]string, 3)
	values[0], values[1], values[2] = all[:endRetry], all[endRetry:endPolicy], all[endPolicy:]
	h["Retry-After"] = values[0:1:1]
	if endPolicy > endRetry {
		h[rateLimitPolicy] = values[1:2:2]
	}
	h[rateLimit] = values[2:3:3]
}

// limitNumbers are the numbers of a refusal's RateLimit fields: the seconds until a
// retry is useful (jittered by rnd: admission.RetryAfter), the window an empty bucket
// takes to refill, at least a second, and the whole tokens remaining.
func limitNumbers(le *space.LimitError, rnd func() float64) (retry, window, remaining int64) {
	// A bucket that never refills reports the longest Duration (see NeverRetryAfter).
	if le.RetryAfter == time.Duration(math.MaxInt64) {
		retry = int64(NeverRetryAfter / time.Second)
	} else {
		retry = int64(admission.RetryAfter(le.RetryAfter, rnd) / time.Second)
	}
	window = 1
	if le.Limit != nil && le.Limit.RefillRPS > 0 {
		window = int64(math.Max(1, math.Ceil(float64(le.Limit.Burst)/le.Limit.RefillRPS)))
	}
	return retry, window, int64(math.Max(0, math.Floor(le.Remaining)))
}

// The canonical forms (textproto.CanonicalMIMEHeaderKey) of the RateLimit header fields' names.
const (
	rateLimitPolicy = "Ratelimit-Policy"
	rateLimit       = "Ratelimit"
)
