package api

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/metric"
)

// requestStateKey is the context key of a request's requestState.
type requestStateKey struct{}

// requestState is what the middleware learns of one request, in its context from the
// first step (requestContext): its id, and the caller identify resolved. Each handler
// step reads and fills it in place, so that a request is copied
// (http.Request.WithContext) once on its way in, not at every step; the request log
// written after the handler reads it from the outer context. Only the request's own
// goroutine touches it, but for seatHeld.
type requestState struct {
	id         string
	caller     space.Caller
	identified bool
	// answered is when the answer was flushed before the handler returned (see
	// keptUntilAnswered); zero when it ends with the handler.
	answered time.Time
	// seatOf is the overload gate whose seat the request holds (admitSeat), nil when
	// it holds none; seatHeld is true until giveSeat gives it back, once, from
	// whichever goroutine comes first (the handler's, or the one waiting on a start:
	// seatGoesOnIdle).
	seatOf   *gate
	seatHeld atomic.Bool
	// idHeader is the X-Request-Id header's value slice, kept here so that setting
	// the header costs no allocation of its own.
	idHeader [1]string
	// answer is the writer observe hands the handlers, which records the answer's
	// status and size for the request's metrics and log line.
	answer answerRecorder
}

// answerRecorder is a request's writer as observe hands it on: the status and the
// bytes of the answer, recorded as they are written. It lives in the request's state,
// in the allocation withRequestState makes; chi's WrapResponseWriter, which did the
// same, was two more allocations a request. http.ResponseController reaches the
// writer beneath through Unwrap (to flush it, or set its deadlines).
type answerRecorder struct {
	http.ResponseWriter
	status int // the answer's status; 0 until one is written
	bytes  int // the body's bytes written
}

// WriteHeader records the answer's status and writes it: the first final status
// only, as net/http does; an informational one (1xx but 101) passes through.
func (a *answerRecorder) WriteHeader(status int) {
	if status >= 100 && status <= 199 && status != http.StatusSwitchingProtocols {
		a.ResponseWriter.WriteHeader(status)
		return
	}
	if a.status == 0 {
		a.status = status
		a.ResponseWriter.WriteHeader(status)
	}
}

// Write writes the body, after a 200 when no status was written, as net/http does.
func (a *answerRecorder) Write(p []byte) (int, error) {
	if a.status == 0 {
		a.WriteHeader(http.StatusOK)
	}
	n, err := a.ResponseWriter.Write(p)
	a.bytes += n
	return n, err
}

// Unwrap is the writer beneath, for http.ResponseController.
func (a *answerRecorder) Unwrap() http.ResponseWriter { return a.ResponseWriter }

// giveSeatBack gives the request's seat of the overload gate back now, to the next
// request in turn, when the rest of its work is no work at all: a refusal from memory
// waiting out its pace. Once; nothing when the request holds no seat.
func giveSeatBack(ctx context.Context) {
	if st := stateFrom(ctx); st != nil {
		st.giveSeat()
	}
}

// holdSeat records the seat of g the request was given.
func (st *requestState) holdSeat(g *gate) {
	st.seatOf = g
	st.seatHeld.Store(true)
}

// giveSeat gives the request's seat back to its gate, once; nothing when it holds none.
func (st *requestState) giveSeat() {
	if st.seatHeld.CompareAndSwap(true, false) {
		st.seatOf.release()
	}
}

// seatGoesOnIdle returns ctx on which space.Idle gives the request's seat back, for
// the calls that may wait on the substrate (a create's or a restore's start): the
// seats bound the work a replica does at once, not the starts it waits on. ctx itself
// when the request holds no seat.
func seatGoesOnIdle(ctx context.Context) context.Context {
	if st := stateFrom(ctx); st != nil && st.seatHeld.Load() {
		return space.WithIdle(ctx, (*seatOnIdle)(st))
	}
	return ctx
}

// seatOnIdle is a request's state as the space.Idler of its create or restore: its
// Idle gives the seat back. The state's own pointer, so that the context holds it at
// no allocation of its own.
type seatOnIdle requestState

func (s *seatOnIdle) Idle() { (*requestState)(s).giveSeat() }

func stateFrom(ctx context.Context) *requestState {
	st, _ := ctx.Value(requestStateKey{}).(*requestState)
	return st
}

// RequestID returns the request's id: the caller's X-Request-ID when it is a sane
// token, otherwise one made here. It is echoed in the response and in every log line.
func RequestID(ctx context.Context) string {
	if st := stateFrom(ctx); st != nil {
		return st.id
	}
	return ""
}

// headerRequestID is X-Request-ID in its canonical form, which a Header map is indexed
// by: set directly, it is not canonicalised (an allocation) per request.
const headerRequestID = "X-Request-Id"

// requestContext is a request's context as the listeners' handlers see it: its
// parent's values, and two of its own in one object, the request's state and chi's
// routing context. withRequestState makes it once a request, before the router, which
// finds its routing context there and does not copy the request again: chi's
// context.WithValue and http.Request.WithContext, and ours beside them, were four of
// a refusal's allocations (docs/benchmarks.md, "One routing tree").
type requestContext struct {
	context.Context
	st   requestState
	rctx *chi.Context
}

// Value is the request's state, chi's routing context, or its parent's value of key.
func (c *requestContext) Value(key any) any {
	switch key {
	case requestStateKey{}:
		return &c.st
	case chi.RouteCtxKey:
		return c.rctx
	}
	return c.Context.Value(key)
}

// withRequestState serves mux with the request's state in its context (stateFrom)
// from the first step: its id, the caller's X-Request-ID when it is a sane token,
// otherwise one made here, echoed in the answer and written in every log line. The
// routing context is mux's to use until the request is served, then kept for the
// next, as chi keeps the ones it makes.
func withRequestState(mux *chi.Mux) http.Handler {
	routing := sync.Pool{New: func() any { return chi.NewRouteContext() }}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(headerRequestID)
		if !saneToken(id, 64) {
			id = newRequestID()
		}
		rctx := routing.Get().(*chi.Context)
		rctx.Reset()
		rctx.Routes = mux
		c := &requestContext{Context: r.Context(), rctx: rctx}
		c.st.id = id
		c.st.idHeader[0] = id
		w.Header()[headerRequestID] = c.st.idHeader[:]
		mux.ServeHTTP(w, r.WithContext(c))
		routing.Put(rctx)
	})
}

// newRequestID is 16 hex digits of the runtime's generator (math/rand/v2: ChaCha8,
// seeded from the kernel, per thread, no lock): an id must be unique among a
// replica's and its peers' requests, not secret, and crypto/rand's Read was 1% of a
// refusal's CPU (docs/benchmarks.md, "A refusal's chain").
func newRequestID() string {
	var raw [8]byte
	binary.BigEndian.PutUint64(raw[:], rand.Uint64())
	var b [16]byte
	hex.Encode(b[:], raw[:])
	return string(b[:])
}

// saneToken reports whether s is 1..max characters of [A-Za-z0-9._-], the only shape of
// caller-chosen id that may reach a log line or a database column.
func saneToken(s string, max int) bool {
	if len(s) == 0 || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// httpMetrics are the request series. The route label is chi's route pattern, never the
// raw path, and the method label one of the methods of RFC 9110 or "other", so the
// series are bounded by the router. Each series is looked up once and kept (bound):
// a label lookup would be two a request.
type httpMetrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	bound    *metric.Bound[seriesKey, *requestSeries]
}

type seriesKey struct {
	listener, route, method string
	status                  int
}

type requestSeries struct {
	requests prometheus.Counter
	duration prometheus.Observer
}

// of is the series of one listener, route, method and status.
func (m *httpMetrics) of(listener, route, method string, status int) *requestSeries {
	return m.bound.Of(seriesKey{listener, route, method, status})
}

// methodLabel is method as the request series label it: a method of RFC 9110, or
// "other" for anything a client made up, which must not become a series of its own.
func methodLabel(method string) string {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace:
		return method
	}
	return "other"
}

func newHTTPMetrics(reg prometheus.Registerer) *httpMetrics {
	m := &httpMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "space_http_requests_total",
			Help: "HTTP requests answered, by listener, route pattern, method and status code.",
		}, []string{"listener", "route", "method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "space_http_request_seconds",
			Help:    "HTTP request latency to the answer, by listener, route pattern and method.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10},
		}, []string{"listener", "route", "method"}),
	}
	m.bound = metric.NewBound(func(k seriesKey) *requestSeries {
		return &requestSeries{
			requests: m.requests.WithLabelValues(k.listener, k.route, k.method, strconv.Itoa(k.status)),
			duration: m.duration.WithLabelValues(k.listener, k.route, k.method),
		}
	})
	reg.MustRegister(m.requests, m.duration)
	return m
}

// observe counts every request and logs it (the 429s of a budget key on a route
// sampled, see Options.RefusalLogEvery), and recovers a panicking handler into a 500
// problem: one bad request must not take the process down.
func (s *Server) observe(listener string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			start := time.Now()
			// withRequestState, before the router of both listeners, made the
			// request's state; without it the log line still has what observe saw.
			st := stateFrom(r.Context())
			if st == nil {
				st = &requestState{}
			}
			ww := &st.answer
			if ww.ResponseWriter != nil {
				ww = &answerRecorder{} // a request observed twice: a recorder of its own
			}
			ww.ResponseWriter = w
			defer func() {
				if rec := recover(); rec != nil {
					if rec == http.ErrAbortHandler { //nolint:errorlint // sentinel compared as net/http does
						panic(rec)
					}
					s.logger.ErrorContext(r.Context(), "handler panicked", "panic", rec, "stack", string(debug.Stack()), "request_id", RequestID(r.Context()))
					if ww.status == 0 {
						s.writeError(ww, r, &space.Error{Code: space.EINTERNAL, Message: "internal error", Err: errors.New("panic")})
					}
				}
				// chi sets the pattern on the request it routed, which is this one as long
				// as no middleware between here and the route copies it (none does); the
				// route context has it too, at the cost of building it again.
				route := r.Pattern
				if route == "" {
					route = chi.RouteContext(r.Context()).RoutePattern()
				}
				if route == "" {
					route = "unmatched"
				}
				status := ww.status
				if status == 0 {
					status = http.StatusOK
				}
				// The time to the answer, which is what its caller waited for.
				elapsed := time.Since(start)
				if !st.answered.IsZero() {
					elapsed = st.answered.Sub(start)
				}
				method := methodLabel(r.Method)
				series := s.metrics.of(listener, route, method, status)
				series.requests.Inc()
				series.duration.Observe(elapsed.Seconds())
				level := slog.LevelInfo
				if status >= 500 {
					level = slog.LevelWarn
				}
				client, key := string(st.caller.ID), string(st.caller.Key)
				if client == "" {
					client = "-"
				}
				if !s.logger.Enabled(r.Context(), level) {
					return
				}
				// A refusal's line is throttled (one a route and budget key per
				// RefusalLogEvery, with the count held back) before the line is built:
				// under a flood most are held back.
				held := int64(-1)
				if status == http.StatusTooManyRequests && !s.logger.Enabled(r.Context(), slog.LevelDebug) {
					var ok bool
					if ok, held = s.refusals.Allow(listener + " " + route + " " + key); !ok {
						return
					}
				}
				attrs := []slog.Attr{
					slog.String("listener", listener),
					slog.String("method", method),
					slog.String("route", route),
					slog.Int("status", status),
					slog.Int("bytes", ww.bytes),
					slog.Duration("duration", elapsed),
					slog.String("request_id", RequestID(r.Context())),
					slog.String("client", client),
					slog.String("budget_key", key),
				}
				if held >= 0 {
					attrs = append(attrs, slog.Int64("refusals_held_back", held))
				}
				s.logger.LogAttrs(r.Context(), level, "request", attrs...)
			}()
			next.ServeHTTP(ww, r)
		})
	}
}

// DefaultMaxHeaderBytes is the request header limit answered with a 431 problem. The
// http.Server's own MaxHeaderBytes must be larger, so that a request between the two
// reaches this check (net/http answers beyond its limit with a plain-text 431 that no
// handler sees).
const DefaultMaxHeaderBytes = 32 << 10

// limitHeaders answers a request whose headers are over the limit with a 431
// problem+json, before any other work.
func (s *Server) limitHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := len(r.Method) + len(r.RequestURI) + len(r.Host)
		for k, vs := range r.Header {
			for _, v := range vs {
				n += len(k) + len(v) + 4 // ": " and CRLF
			}
		}
		if n > DefaultMaxHeaderBytes {
			s.writeError(w, r, &space.Error{Code: space.ETOOLARGE, Field: "headers",
				Message: fmt.Sprintf("the request line and headers are %d bytes; at most %d are accepted", n, DefaultMaxHeaderBytes)})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// limitBody caps every request body: a body over the limit fails its JSON decode with
// a 400 naming the body, before any work is done.
func (s *Server) limitBody(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil {
			r.Body = http.MaxBytesReader(w, r.Body, s.maxBodyBytes)
		}
		next.ServeHTTP(w, r)
	})
}
