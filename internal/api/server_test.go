package api

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/textproto"
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

func TestRequestSeries(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	s := New(Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Registry: reg})
	public := s.Public()
	send := func(method, path string) {
		w := httptest.NewRecorder()
		public.ServeHTTP(w, httptest.NewRequest(method, path, nil))
	}
	for range 3 {
		send(http.MethodGet, "/healthz")
	}
	for _, m := range []string{"BREW", "PROPFIND", "X-ANYTHING"} {
		send(m, "/healthz")
	}
	counts := map[string]float64{}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "space_http_requests_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			counts[labels["method"]+" "+labels["route"]+" "+labels["code"]] += m.GetCounter().GetValue()
		}
	}

	t.Run("each request is counted once in its series, however often the series is used", func(t *testing.T) {
		if got := counts["GET /healthz 200"]; got != 3 {
			t.Fatalf("GET /healthz 200 counted %v times, want 3 (all: %v)", got, counts)
		}
	})

	t.Run("a method a client made up is counted as other, never as a series of its own", func(t *testing.T) {
		var other float64
		for k, v := range counts {
			if bytes.HasPrefix([]byte(k), []byte("other ")) {
				other += v
			}
			for _, m := range []string{"BREW", "PROPFIND", "X-ANYTHING"} {
				if bytes.HasPrefix([]byte(k), []byte(m+" ")) {
					t.Fatalf("a series for method %s: %v", m, counts)
				}
			}
		}
		if other != 3 {
			t.Fatalf("%v requests counted as other, want 3 (all: %v)", other, counts)
		}
	})
}

func TestHeaderKeysAreCanonical(t *testing.T) {
	t.Parallel()
	// Header maps are indexed by canonical keys: a key looked up or set directly that
	// is not canonical would never match what net/http parsed.
	for given, key := range map[string]string{HeaderClientID: headerClientIDKey, "X-Request-ID": headerRequestID} {
		if c := textproto.CanonicalMIMEHeaderKey(given); c != key {
			t.Errorf("%s is looked up as %q, its canonical form is %q", given, key, c)
		}
	}
}
