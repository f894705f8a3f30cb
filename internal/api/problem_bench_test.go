package api

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/testenv"
)

// benchRefusals are the two kinds of 429 the headers describe: a rate bucket (policy
// with a window) and a cap (policy without one).
var benchRefusals = []struct {
	name string
	le   *space.LimitError
}{
	{"rate bucket", &space.LimitError{Bucket: space.BucketClientActivation, Client: "client-7", RetryAfter: 3 * time.Second,
		Limit: &space.Rate{RefillRPS: 10, Burst: 40}, Remaining: 0.4}},
	{"cap", &space.LimitError{Bucket: space.BucketLiveSandboxCap, Client: "client-7", Cap: 50, RetryAfter: time.Second}},
}

// BenchmarkSetLimitHeaders compares setLimitHeaders (strconv and concatenation) with
// the same fields appended into a fixed buffer, and written by fmt: the header part of
// every refusal's answer.
func BenchmarkSetLimitHeaders(b *testing.B) {
	impls := []struct {
		name string
		set  func(http.Header, *space.LimitError, func() float64)
	}{
		{"setLimitHeaders", setLimitHeaders},
		{"a string each", setLimitHeadersEach},
		{"fixed buffer", setLimitHeadersBuffer},
		{"fmt", setLimitHeadersFmt},
	}
	rnd := func() float64 { return 0.5 }
	for _, r := range benchRefusals {
		for _, impl := range impls {
			b.Run(r.name+"/"+impl.name, func(b *testing.B) {
				want, h := http.Header{}, http.Header{}
				setLimitHeaders(want, r.le, rnd)
				impl.set(h, r.le, rnd)
				if fmt.Sprint(h) != fmt.Sprint(want) {
					b.Fatalf("%s wrote %v, setLimitHeaders %v", impl.name, h, want)
				}
				b.ReportAllocs()
				for b.Loop() {
					clear(h)
					impl.set(h, r.le, rnd)
				}
			})
		}
	}
}

// BenchmarkWriteLimitError is a whole 429 answer as writeError gives it (problem body,
// headers, message), to put the header writing in proportion.
func BenchmarkWriteLimitError(b *testing.B) {
	s := &Server{logger: slog.New(slog.DiscardHandler), identity: space.IdentityTrustedHeader}
	req := httptest.NewRequest(http.MethodPost, "/v1/sandboxes", nil)
	for _, r := range benchRefusals {
		b.Run(r.name, func(b *testing.B) {
			w := &testenv.StatusWriter{}
			b.ReportAllocs()
			for b.Loop() {
				clear(w.Header())
				s.writeError(w, req, r.le)
			}
		})
	}
}

// limitNumbers are the numbers every variant writes, computed as setLimitHeaders does,
// so that the variants differ only in how they write them.
// setLimitHeadersEach is the alternative before it: a string made and Set for each field.
func setLimitHeadersEach(h http.Header, le *space.LimitError, rnd func() float64) {
	retry, window, remaining := limitNumbers(le, rnd)
	h.Set("Retry-After", strconv.FormatInt(retry, 10))
	name := strconv.Quote(string(le.Bucket))
	switch {
	case le.Limit != nil:
		h.Set(rateLimitPolicy, name+";q="+strconv.FormatInt(le.Limit.Burst, 10)+";w="+strconv.FormatInt(window, 10))
	case le.Cap > 0:
		h.Set(rateLimitPolicy, name+";q="+strconv.Itoa(le.Cap))
	}
	h.Set(rateLimit, name+";r="+strconv.FormatInt(remaining, 10)+";t="+strconv.FormatInt(retry, 10))
}

// setLimitHeadersBuffer is the rejected alternative: each field appended into one
// fixed buffer after the quoted bucket name, and copied out by string().
func setLimitHeadersBuffer(h http.Header, le *space.LimitError, rnd func() float64) {
	retry, window, remaining := limitNumbers(le, rnd)
	h["Retry-After"] = []string{strconv.FormatInt(retry, 10)}
	var buf [96]byte
	name := strconv.AppendQuote(buf[:0], string(le.Bucket))
	switch {
	case le.Limit != nil:
		h[rateLimitPolicy] = []string{string(appendParam(appendParam(name, ";q=", le.Limit.Burst), ";w=", window))}
	case le.Cap > 0:
		h[rateLimitPolicy] = []string{string(appendParam(name, ";q=", int64(le.Cap)))}
	}
	h[rateLimit] = []string{string(appendParam(appendParam(name, ";r=", remaining), ";t=", retry))}
}

func appendParam(b []byte, param string, v int64) []byte {
	return strconv.AppendInt(append(b, param...), v, 10)
}

func setLimitHeadersFmt(h http.Header, le *space.LimitError, rnd func() float64) {
	retry, window, remaining := limitNumbers(le, rnd)
	h.Set("Retry-After", strconv.FormatInt(retry, 10))
	switch {
	case le.Limit != nil:
		h.Set(rateLimitPolicy, fmt.Sprintf("%q;q=%d;w=%d", le.Bucket, le.Limit.Burst, window))
	case le.Cap > 0:
		h.Set(rateLimitPolicy, fmt.Sprintf("%q;q=%d", le.Bucket, le.Cap))
	}
	h.Set(rateLimit, fmt.Sprintf("%q;r=%d;t=%d", le.Bucket, remaining, retry))
}
