package api

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	openapi "github.com/space-sandbox/space/api"
)

func TestOpenAPIRoute(t *testing.T) {
	t.Parallel()
	s := New(Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Registry: prometheus.NewRegistry()})

	t.Run("the internal listener serves the built-in document as YAML", func(t *testing.T) {
		t.Parallel()
		w := httptest.NewRecorder()
		s.Internal().ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/openapi.yaml", nil))
		if w.Code != http.StatusOK || w.Header().Get("Content-Type") != "application/yaml" || !bytes.Equal(w.Body.Bytes(), openapi.Document()) {
			t.Fatalf("GET /openapi.yaml = %d %q, %d bytes", w.Code, w.Header().Get("Content-Type"), w.Body.Len())
		}
	})

	t.Run("the public listener does not serve it", func(t *testing.T) {
		t.Parallel()
		w := httptest.NewRecorder()
		s.Public().ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/openapi.yaml", nil))
		if w.Code != http.StatusNotFound {
			t.Fatalf("public GET /openapi.yaml = %d, want 404", w.Code)
		}
	})
}

func TestProfilerRoute(t *testing.T) {
	t.Parallel()
	s := New(Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Registry: prometheus.NewRegistry()})

	t.Run("the internal listener serves the profiler's index", func(t *testing.T) {
		t.Parallel()
		w := httptest.NewRecorder()
		s.Internal().ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/debug/pprof/", nil))
		if w.Code != http.StatusOK || !bytes.Contains(w.Body.Bytes(), []byte("goroutine")) {
			t.Fatalf("GET /debug/pprof/ = %d, %d bytes", w.Code, w.Body.Len())
		}
	})

	t.Run("the public listener does not", func(t *testing.T) {
		t.Parallel()
		w := httptest.NewRecorder()
		s.Public().ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/debug/pprof/", nil))
		if w.Code != http.StatusNotFound {
			t.Fatalf("public GET /debug/pprof/ = %d, want 404", w.Code)
		}
	})
}
