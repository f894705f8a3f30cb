// Package api is space-api's HTTP layer: the chi routers of the public and internal
// listeners, client identity, handlers, and the one place where domain errors become
// HTTP statuses and RFC 9457 problem+json bodies.
package api

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/space-sandbox/space"
	openapi "github.com/space-sandbox/space/api"
	"github.com/space-sandbox/space/internal/config"
	"github.com/space-sandbox/space/internal/logs"
	"github.com/space-sandbox/space/internal/metric"
)

// Check is one dependency that readiness depends on. Check returns nil when the
// dependency answers; Detail, when set, adds a note shown on the internal listener's
// /readyz whatever the result (the simulated substrate says that it is one).
type Check struct {
	Name   string
	Check  func(ctx context.Context) error
	Detail string
	// Degrades marks a dependency the replica can serve without: its failure leaves
	// the replica ready and is reported as degraded, not unavailable. Redis is one when
	// admission fails open: taking every replica out of the Service because the budget
	// store is down would turn a degraded budget into a full outage.
	Degrades bool
}

// Options are what a Server needs. Logger and Registry are required.
type Options struct {
	Logger *slog.Logger
	// Registry receives the HTTP metrics and is served on /metrics (internal listener).
	Registry *prometheus.Registry
	// Checks are run by /readyz, concurrently, each within CheckTimeout.
	Checks []Check
	// CheckTimeout bounds each readiness check (default 2s).
	CheckTimeout time.Duration
	// MaxBodyBytes caps request bodies (SPACE_MAX_BODY_BYTES); 0 is
	// config.DefaultMaxBodyBytes, its default.
	MaxBodyBytes int64

	// Identity is SPACE_AUTH_MODE: it words what a caller off the allowlist is told.
	Identity space.IdentityMode
	// RefusalLogEvery is how often the access log writes a line for the 429s of one
	// budget key on one route (default DefaultRefusalLogEvery); the line counts the
	// ones held back since the last (refusals_held_back). At debug level every
	// refusal is logged. Every request is counted in space_http_requests_total
	// either way.
	RefusalLogEvery time.Duration
	// RefusalPace is how long a create refused from memory waits before it is
	// answered while another budget key's request is at work on the replica (see
	// refusalPace); 0 answers every refusal at once. SPACE_REFUSAL_PACE; New takes a
	// negative value as 0.
	RefusalPace time.Duration
	// Gate bounds the public requests at work at once and queues the rest fairly
	// between budget keys (see gate); Seats < 0 turns it off.
	Gate GateOptions

	// The domain (domain.go): all required.
	Auth        Authenticator
	Callers     Callers
	Tiers       Tiers
	Concurrency Leases
	Budgets     Budgets
	Sandboxes   Sandboxes
	// Operations queues Prefer: respond-async requests and serves /v1/operations.
	Operations Operations
	// RiverUI, when set, is mounted at /riverui/ on the internal listener (it serves
	// its pages and API under that prefix).
	RiverUI http.Handler
}

// DefaultRefusalLogEvery is Options.RefusalLogEvery's default. A client flooding over
// its rate is refused tens of thousands of times a second; its operator needs the
// count (the metrics have it) and a sample with a request id to follow, not tens of
// thousands of lines a second for a log pipeline to carry.
const DefaultRefusalLogEvery = time.Second

// RiverUIPath is where River UI is mounted on the internal listener when enabled.
const RiverUIPath = "/riverui/"

// Server holds the handlers of both listeners.
type Server struct {
	logger       *slog.Logger
	registry     *prometheus.Registry
	metrics      *httpMetrics
	checks       []Check
	checkTimeout time.Duration
	maxBodyBytes int64
	draining     atomic.Bool
	identity     space.IdentityMode
	refusals     *logs.Throttle
	pace         *refusalPace
	places       *pacedPlaces // the concurrency cap as a create takes it (a pointer: as a sandbox.Places, a value would be copied to the heap at every create)
	gate         *gate

	auth        Authenticator
	callers     Callers
	tiers       Tiers
	concurrency Leases
	budgets     Budgets
	sandboxes   Sandboxes
	operations  Operations
	riverUI     http.Handler
}

// New returns a Server.
func New(opts Options) *Server {
	s := &Server{
		logger:       opts.Logger,
		registry:     opts.Registry,
		checks:       opts.Checks,
		checkTimeout: opts.CheckTimeout,
		maxBodyBytes: opts.MaxBodyBytes,
		identity:     opts.Identity,
		auth:         opts.Auth,
		callers:      opts.Callers,
		tiers:        opts.Tiers,
		concurrency:  opts.Concurrency,
		budgets:      opts.Budgets,
		sandboxes:    opts.Sandboxes,
		operations:   opts.Operations,
		riverUI:      opts.RiverUI,
	}
	if s.checkTimeout <= 0 {
		s.checkTimeout = 2 * time.Second
	}
	if s.maxBodyBytes <= 0 {
		s.maxBodyBytes = config.DefaultMaxBodyBytes
	}
	every := opts.RefusalLogEvery
	if every <= 0 {
		every = DefaultRefusalLogEvery
	}
	s.refusals = logs.NewThrottle(every, nil)
	s.pace = newRefusalPace(max(opts.RefusalPace, 0), opts.Registry)
	s.places = &pacedPlaces{leases: s.concurrency, pace: s.pace}
	if opts.Gate.Seats >= 0 {
		s.gate = newGate(opts.Gate, opts.Registry)
	}
	s.metrics = newHTTPMetrics(opts.Registry)
	if opts.Registry != nil {
		metric.Register(opts.Registry, prometheus.Collector(&readinessCollector{s: s}))
	}
	return s
}

// Drain makes /readyz answer 503 so that load balancers stop sending new requests
// while in-flight ones finish; called first on shutdown.
func (s *Server) Drain() { s.draining.Store(true) }

// Public is the handler of the public listener (SPACE_HTTP_ADDR).
func (s *Server) Public() http.Handler {
	r := chi.NewRouter()
	r.Use(s.observe("public"), s.limitHeaders, s.limitBody)
	// Under /v1 the caller is authenticated first, even on a path or with a method no
	// route serves: who is asking comes before what the API has.
	r.NotFound(s.identifiedUnderV1(s.notFound))
	r.MethodNotAllowed(s.identifiedUnderV1(s.methodNotAllowed(r)))
	r.Get("/healthz", s.healthz)
	r.Get("/readyz", s.readyz(false))
	// The /v1 routes sit on the one routing tree with their middleware chained
	// (chi's With), not on a router mounted at /v1: a mounted router routes every
	// request twice and gives it a path value and a route pattern more, with the
	// request copies a tenth of a refusal's time in process (docs/benchmarks.md, "One
	// routing tree").
	v1 := r.With(s.identify)
	// The caller's limits are a read of what is enforced, answerable when the
	// concurrency cap is full or its store is down: exactly when they matter.
	v1.Get("/v1/limits", s.getLimits)
	v1.Get("/v1/tiers", s.getTiers)
	// Every other route waits for a seat of the replica's (admitSeat) before its
	// body is read, or is shed: past its capacity the replica serves in turn
	// between budget keys rather than piling work up.
	seated := v1.With(s.admitSeat)
	// A create takes its concurrency place itself, after it has checked whether
	// its refusal is already known (createSandbox).
	seated.Post("/v1/sandboxes", s.createSandbox)
	placed := seated.With(s.limitConcurrency)
	placed.Get("/v1/sandboxes", s.listSandboxes)
	placed.Get("/v1/sandboxes/{id}", s.getSandbox)
	placed.Delete("/v1/sandboxes/{id}", s.deleteSandbox)
	placed.Post("/v1/sandboxes/{id}/pause", s.pauseSandbox)
	placed.Post("/v1/sandboxes/{id}/keepalive", s.keepaliveSandbox)
	placed.Post("/v1/sandboxes/{id}/restore", s.restoreSandbox)
	placed.Get("/v1/operations/{id}", s.getOperation)
	return withRequestState(r)
}

// identifiedUnderV1 is h, after the caller's identity (identify) when the path is
// /v1 or under it.
func (s *Server) identifiedUnderV1(h http.HandlerFunc) http.HandlerFunc {
	identified := s.identify(h)
	return func(w http.ResponseWriter, r *http.Request) {
		if p := r.URL.Path; p == "/v1" || strings.HasPrefix(p, "/v1/") {
			identified.ServeHTTP(w, r)
			return
		}
		h(w, r)
	}
}

// Internal is the handler of the internal listener (SPACE_INTERNAL_HTTP_ADDR): the
// /internal/v1 API, /metrics and the profiler (/debug/pprof/), which must never be reachable by clients.
func (s *Server) Internal() http.Handler {
	r := chi.NewRouter()
	r.Use(s.observe("internal"), s.limitHeaders, s.limitBody)
	r.NotFound(s.notFound)
	r.MethodNotAllowed(s.methodNotAllowed(r))
	r.Get("/healthz", s.healthz)
	r.Get("/readyz", s.readyz(true))
	// A collector that fails (Postgres down, for the series read from it at scrape
	// time) leaves the rest of the scrape served, and is counted in
	// promhttp_metric_handler_errors_total: the breaker and the error counters matter
	// most exactly then.
	r.Method(http.MethodGet, "/metrics", promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{
		Registry: s.registry, ErrorHandling: promhttp.ContinueOnError, ErrorLog: promLogger{s.logger},
	}))
	r.Post("/internal/v1/sandboxes/{id}/wake", s.wakeSandbox)
	r.Post("/internal/v1/sandboxes/{id}/keepalive", s.keepaliveSandboxInternal)
	r.Get("/internal/v1/operations/{id}", s.getOperationInternal)
	if s.riverUI != nil {
		r.Handle(RiverUIPath+"*", s.riverUI)
		r.Get(strings.TrimSuffix(RiverUIPath, "/"), func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, RiverUIPath, http.StatusMovedPermanently)
		})
	}
	r.Get("/openapi.yaml", serveOpenAPI)
	// The Go profiler, for where a replica's CPU goes under load
	// (go tool pprof http://<internal>/debug/pprof/profile?seconds=10): on the
	// internal listener only, like /metrics.
	r.Mount("/debug", middleware.Profiler())
	return withRequestState(r)
}

// serveOpenAPI answers GET /openapi.yaml (internal listener) with the OpenAPI document
// built into the binary: the description of exactly this build's two listeners. It is
// internal because it describes the internal API too; the file is in the repository
// for anyone else.
func serveOpenAPI(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/yaml")
	_, _ = w.Write(openapi.Document())
}

func (s *Server) notFound(w http.ResponseWriter, r *http.Request) {
	writeProblem(w, Problem{
		Type: ProblemType("not_found"), Title: http.StatusText(http.StatusNotFound), Status: http.StatusNotFound,
		Detail: "no such route", Instance: r.URL.Path, Code: "not_found", RequestID: RequestID(r.Context()),
	})
}

// methodNotAllowed answers a path that routes serves with a method it does not: a 405
// problem with the Allow field RFC 9110 requires, listing the methods that path is
// served with.
func (s *Server) methodNotAllowed(routes chi.Routes) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var allowed []string
		for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
			if routes.Match(chi.NewRouteContext(), m, r.URL.Path) {
				allowed = append(allowed, m)
			}
		}
		if len(allowed) > 0 {
			w.Header().Set("Allow", strings.Join(allowed, ", "))
		}
		writeProblem(w, Problem{
			Type: ProblemType("method_not_allowed"), Title: http.StatusText(http.StatusMethodNotAllowed), Status: http.StatusMethodNotAllowed,
			Detail: r.Method + " is not allowed here", Instance: r.URL.Path, Code: "method_not_allowed", RequestID: RequestID(r.Context()),
		})
	}
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// Check statuses, and the states of the whole /readyz body.
const (
	statusOK          = "ok"
	statusDegraded    = "degraded"
	statusUnavailable = "unavailable"
	statusDraining    = "draining"
)

// CheckResult is one dependency's line in /readyz.
type CheckResult struct {
	Status string `json:"status"` // ok, degraded or unavailable
	// Error and Detail are shown on the internal listener only: the public answer
	// names what is down, never how (no addresses, no driver errors).
	Error  string `json:"error,omitempty"`
	Detail string `json:"detail,omitempty"`
}

// Readiness is the /readyz body. Status is ok or degraded with 200, unavailable or
// draining with 503.
type Readiness struct {
	Status   string                 `json:"status"`
	Down     []string               `json:"down,omitempty"`
	Degraded []string               `json:"degraded,omitempty"`
	Checks   map[string]CheckResult `json:"checks"`
}

// readyz answers /readyz: 503 when a dependency the replica cannot serve without is
// down or the replica is draining, otherwise 200 (degraded when a dependency it can
// serve without is down). internal adds each failure's text and each check's detail.
func (s *Server) readyz(internal bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		res, status := s.readiness(r.Context(), internal)
		writeJSON(w, status, res)
	}
}
