package api

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/logs"
	"github.com/space-sandbox/space/internal/testenv"
)

// logLines are the access log's request lines, decoded.
func logLines(t *testing.T, log *testenv.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(log.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		if m["msg"] == "request" {
			out = append(out, m)
		}
	}
	return out
}

func TestAccessLog(t *testing.T) {
	t.Parallel()

	type bundle struct {
		log    *testenv.Buffer
		leases *fakeLeases
		public http.Handler
		srv    *Server
		clock  func(time.Duration) // moves the refusal sampler's clock on
	}
	setup := func(t *testing.T, level slog.Level) *bundle {
		t.Helper()
		b := &bundle{log: &testenv.Buffer{}, leases: &fakeLeases{}}
		s := New(Options{
			Logger:      slog.New(slog.NewJSONHandler(b.log, &slog.HandlerOptions{Level: level})),
			Registry:    prometheus.NewRegistry(),
			Identity:    space.IdentityTrustedHeader,
			Auth:        &TrustedHeader{Trusted: []netip.Prefix{netip.MustParsePrefix("192.0.2.1/32")}},
			Callers:     &fakeCallers{},
			Concurrency: b.leases,
			Budgets:     fakeBudgets{},
			Sandboxes:   &fakeSandboxes{owner: "acme"},
			Operations:  &fakeOperations{},
		})
		var mu sync.Mutex
		now := time.Unix(1_000, 0)
		s.refusals = logs.NewThrottle(time.Second, func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
		b.clock = func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
		b.public, b.srv = s.Public(), s
		return b
	}
	create := func(b *bundle, client string) int {
		r := httptest.NewRequest("POST", "/v1/sandboxes", strings.NewReader(pythonCreate))
		r.RemoteAddr = "192.0.2.1:40000"
		r.Header.Set(HeaderClientID, client)
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		b.public.ServeHTTP(w, r)
		return w.Code
	}
	flood := func(t *testing.T, b *bundle, client string, n int) {
		t.Helper()
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				if code := create(b, client); code != http.StatusTooManyRequests {
					t.Errorf("create = %d, want 429", code)
				}
			})
		}
		wg.Wait()
	}

	t.Run("a flood of refusals is one line per second, the next one counting those held back", func(t *testing.T) {
		t.Parallel()
		b := setup(t, slog.LevelInfo)
		b.leases.full = true
		flood(t, b, "acme", 50)
		if got := len(logLines(t, b.log)); got != 1 {
			t.Fatalf("%d lines for 50 refusals within a second, want 1", got)
		}
		b.clock(time.Second)
		flood(t, b, "acme", 10)
		lines := logLines(t, b.log)
		if len(lines) != 2 {
			t.Fatalf("%d lines after a second more, want 2", len(lines))
		}
		if held := lines[1]["refusals_held_back"]; held != float64(49) {
			t.Fatalf("refusals_held_back = %v, want the 49 not written", held)
		}
		if lines[1]["status"] != float64(429) || lines[1]["budget_key"] != "acme" || lines[1]["request_id"] == "" {
			t.Fatalf("sampled line %v lacks its status, key or request id", lines[1])
		}
	})

	t.Run("each budget key has its own sample", func(t *testing.T) {
		t.Parallel()
		b := setup(t, slog.LevelInfo)
		b.leases.full = true
		flood(t, b, "acme", 20)
		flood(t, b, "globex", 20)
		if got := len(logLines(t, b.log)); got != 2 {
			t.Fatalf("%d lines for two flooding keys, want 2", got)
		}
	})

	t.Run("answers that are not refusals are all logged", func(t *testing.T) {
		t.Parallel()
		b := setup(t, slog.LevelInfo)
		for range 5 {
			if code := create(b, "acme"); code != http.StatusCreated {
				t.Fatalf("create = %d, want 201", code)
			}
		}
		if got := len(logLines(t, b.log)); got != 5 {
			t.Fatalf("%d lines for 5 creates, want 5", got)
		}
	})

	t.Run("a line has the answer's status and the bytes of its body", func(t *testing.T) {
		t.Parallel()
		b := setup(t, slog.LevelInfo)
		r := httptest.NewRequest("POST", "/v1/sandboxes", strings.NewReader(pythonCreate))
		r.RemoteAddr = "192.0.2.1:40000"
		r.Header.Set(HeaderClientID, "acme")
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		b.public.ServeHTTP(w, r)
		lines := logLines(t, b.log)
		if len(lines) != 1 || w.Body.Len() == 0 {
			t.Fatalf("%d lines and a body of %d bytes for one create, want 1 and some", len(lines), w.Body.Len())
		}
		if lines[0]["status"] != float64(w.Code) || lines[0]["bytes"] != float64(w.Body.Len()) {
			t.Fatalf("line says status %v and %v bytes; the answer was %d and %d bytes", lines[0]["status"], lines[0]["bytes"], w.Code, w.Body.Len())
		}
	})

	t.Run("a request observed twice is recorded by each, neither recorder wrapping itself", func(t *testing.T) {
		t.Parallel()
		b := setup(t, slog.LevelInfo)
		mux := chi.NewMux()
		mux.Use(b.srv.observe("outer"), b.srv.observe("inner"))
		mux.Get("/twice", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
		w := httptest.NewRecorder()
		withRequestState(mux).ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/twice", nil))
		lines := logLines(t, b.log)
		if w.Code != http.StatusNoContent || len(lines) != 2 {
			t.Fatalf("answered %d with %d lines, want 204 and a line from each", w.Code, len(lines))
		}
		for _, l := range lines {
			if l["status"] != float64(http.StatusNoContent) {
				t.Fatalf("line %v does not record the 204", l)
			}
		}
	})

	t.Run("at debug level every refusal is logged", func(t *testing.T) {
		t.Parallel()
		b := setup(t, slog.LevelDebug)
		b.leases.full = true
		flood(t, b, "acme", 20)
		if got := len(logLines(t, b.log)); got != 20 {
			t.Fatalf("%d lines for 20 refusals at debug level, want 20", got)
		}
	})
}

func TestAnswerRecorder(t *testing.T) {
	t.Parallel()

	t.Run("the first final status is the answer's; an informational one passes through", func(t *testing.T) {
		t.Parallel()
		w := &statusesWriter{ResponseWriter: httptest.NewRecorder()}
		a := &answerRecorder{ResponseWriter: w}
		a.WriteHeader(http.StatusEarlyHints)
		if a.status != 0 {
			t.Fatalf("status %d after a 103, want none yet", a.status)
		}
		a.WriteHeader(http.StatusTooManyRequests)
		a.WriteHeader(http.StatusInternalServerError)
		if _, err := a.Write([]byte("slow down")); err != nil {
			t.Fatal(err)
		}
		if a.status != http.StatusTooManyRequests || a.bytes != len("slow down") {
			t.Fatalf("recorded %d and %d bytes; want 429 and 9 bytes", a.status, a.bytes)
		}
		if fmt.Sprint(w.statuses) != "[103 429]" {
			t.Fatalf("wrote statuses %v, want [103 429]", w.statuses)
		}
	})

	t.Run("a body written first is a 200", func(t *testing.T) {
		t.Parallel()
		w := httptest.NewRecorder()
		a := &answerRecorder{ResponseWriter: w}
		if _, err := a.Write([]byte("ok")); err != nil {
			t.Fatal(err)
		}
		if a.status != http.StatusOK || w.Code != http.StatusOK || a.bytes != 2 {
			t.Fatalf("recorded %d and %d bytes, wrote %d; want 200, 2 bytes, 200", a.status, a.bytes, w.Code)
		}
	})

	t.Run("a response controller flushes the writer beneath", func(t *testing.T) {
		t.Parallel()
		w := httptest.NewRecorder()
		a := &answerRecorder{ResponseWriter: w}
		if err := http.NewResponseController(a).Flush(); err != nil || !w.Flushed {
			t.Fatalf("Flush = %v, flushed %v; want the recorder beneath flushed", err, w.Flushed)
		}
	})
}

// statusesWriter keeps every status written through it.
type statusesWriter struct {
	http.ResponseWriter
	statuses []int
}

func (w *statusesWriter) WriteHeader(status int) { w.statuses = append(w.statuses, status) }
