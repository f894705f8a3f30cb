// Package peer is the reference servers of the bench's refusal-ceiling comparison:
// what a client over its rate costs a minimal Go server, so that
// space-api's refused creates/s read as a ratio to something measured on the same
// cores, by the same load generator, in the same run.
//
// Both peers are a chi router with one route, POST /v1/sandboxes, that does what
// space-api must do before it can refuse: read X-Client-ID (trusted_header identity),
// decode the create body (one JSON object, unknown fields refused) and answer
// problem+json. They differ in the decision:
//
//   - cmd/peer-chi-redis-rate asks go-redis/redis_rate v10 (one EVALSHA, Allow with
//     a per-client limit) and answers 429 when refused;
//   - cmd/peer-chi-bare asks nobody and answers 429 at once: the ceiling of the HTTP
//     part alone on this machine. With -space-answer its 429 is space-api's own answer
//     to the same client (SpaceAnswer): the same headers and the same body, byte for
//     byte but the request id's value, so that what the answer itself costs the
//     server and the load generator is told apart from what deciding it costs.
//
// Each runs in a process of its own, as space-api does, so that none shares the
// driver's process with the load generator.
package peer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/go-chi/chi/v5"
)

// maxBody bounds a create body, as space-api bounds its own (64 KiB by default).
const maxBody = 64 << 10

// createRequest is the create body space-api accepts; the peers decode it alike.
type createRequest struct {
	Template  string            `json:"template"`
	CPUMillis int               `json:"cpu_millis"`
	MemoryMiB int               `json:"memory_mib"`
	DiskGiB   int               `json:"disk_gib"`
	Metadata  map[string]string `json:"metadata,omitempty"`
}

// Decision is a peer's answer for one create of client: whether it is admitted and,
// when not, when to retry.
type Decision struct {
	Allowed    bool
	RetryAfter time.Duration
}

// Decider decides one create of client; an error is answered 503.
type Decider func(ctx context.Context, client string) (Decision, error)

// RefuseAll is the bare peer's decision: every create is refused, with no store asked.
func RefuseAll(context.Context, string) (Decision, error) {
	return Decision{RetryAfter: 24 * time.Hour}, nil
}

// Handler is a peer's router: GET /readyz, and POST /v1/sandboxes decided by decide,
// a refusal answered with a small problem+json and Retry-After.
func Handler(decide Decider) http.Handler {
	return handler(decide, func(w http.ResponseWriter, _ *http.Request, client string, d Decision) {
		w.Header().Set("Retry-After", strconv.FormatInt(int64(d.RetryAfter.Round(time.Second)/time.Second), 10))
		problem(w, http.StatusTooManyRequests, "rate_limited", "client "+client+" is over its rate")
	})
}

// SpaceAnswer is the bare peer answering every create with the 429 space-api gives an
// allowlisted client over its rate of 0 with a burst of 1 (the bench's refused client):
// RateLimit-Policy, RateLimit, Retry-After, Cache-Control and a fresh X-Request-Id, and
// the problem body with the same fields in the same order, written as the other
// answers here are (encoding/json). The bench checks the two answers alike before it
// measures them (runRefusals).
func SpaceAnswer() http.Handler {
	return handler(RefuseAll, func(w http.ResponseWriter, r *http.Request, client string, _ Decision) {
		id := requestID()
		h := w.Header()
		h.Set("Ratelimit-Policy", `"client_activation";q=1;w=1`)
		h.Set("Ratelimit", `"client_activation";r=0;t=86400`)
		h.Set("Retry-After", "86400")
		h.Set("X-Request-Id", id)
		h.Set("Content-Type", "application/problem+json")
		h.Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusTooManyRequests)
		enc := json.NewEncoder(w)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(spaceProblem{
			Type: "https://github.com/space-sandbox/space/blob/main/docs/problems.md#limited", Title: http.StatusText(http.StatusTooManyRequests),
			Status: http.StatusTooManyRequests, Detail: "client " + strconv.Quote(client) + " is over its sandbox activation rate; slow down and retry after the Retry-After delay",
			Instance: r.URL.Path, Code: "limited", Bucket: "client_activation", Client: client, RequestID: id,
		})
	})
}

// spaceProblem is space-api's problem body of a refusal, its fields in its order.
type spaceProblem struct {
	Type      string `json:"type"`
	Title     string `json:"title"`
	Status    int    `json:"status"`
	Detail    string `json:"detail"`
	Instance  string `json:"instance"`
	Code      string `json:"code"`
	Bucket    string `json:"bucket"`
	Client    string `json:"client"`
	RequestID string `json:"request_id"`
}

// requestID is 16 hex digits, as space-api's request ids are.
func requestID() string {
	return fmt.Sprintf("%016x", rand.Uint64())
}

// refuser writes a peer's answer to a create of client that decide refused.
type refuser func(w http.ResponseWriter, r *http.Request, client string, d Decision)

func handler(decide Decider, refuse refuser) http.Handler {
	r := chi.NewRouter()
	r.Get("/readyz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	r.Post("/v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		client := r.Header.Get("X-Client-ID")
		if client == "" {
			problem(w, http.StatusUnauthorized, "unauthorized", "send X-Client-ID")
			return
		}
		var req createRequest
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			problem(w, http.StatusBadRequest, "invalid", "body: "+err.Error())
			return
		}
		if req.Template == "" || req.CPUMillis <= 0 || req.MemoryMiB <= 0 || req.DiskGiB <= 0 {
			problem(w, http.StatusBadRequest, "invalid", "template, cpu_millis, memory_mib and disk_gib are required")
			return
		}
		d, err := decide(r.Context(), client)
		switch {
		case err != nil:
			problem(w, http.StatusServiceUnavailable, "unavailable", err.Error())
		case !d.Allowed:
			refuse(w, r, client, d)
		default:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_ = json.NewEncoder(w).Encode(map[string]any{"template": req.Template, "state": "running"})
		}
	})
	return r
}

// Constant is the machine's HTTP limit: the same router answering every create with
// one pre-rendered 429, its body never read.
func Constant() http.Handler {
	body := []byte(`{"type":"urn:space:problem:rate_limited","title":"Too Many Requests","status":429,"code":"rate_limited"}` + "\n")
	r := chi.NewRouter()
	r.Get("/readyz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	r.Post("/v1/sandboxes", func(w http.ResponseWriter, _ *http.Request) {
		h := w.Header()
		h["Content-Type"] = []string{"application/problem+json"}
		h["Retry-After"] = []string{"86400"}
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write(body)
	})
	return r
}

// problem writes a small problem+json answer, as space-api answers every refusal.
func problem(w http.ResponseWriter, status int, code, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"type": "urn:space:problem:" + code, "title": http.StatusText(status), "status": status,
		"detail": detail, "code": code,
	})
}

// Serve listens on addr until SIGTERM or SIGINT, then drains for up to 5 s. The
// server's timeouts are space-api's, so that slow clients cost the peers alike.
func Serve(addr string, h http.Handler) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	srv := &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 2 * time.Minute, IdleTimeout: 2 * time.Minute}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	select {
	case err := <-errc:
		return fmt.Errorf("listen on %s: %w", addr, err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("drain: %w", err)
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
