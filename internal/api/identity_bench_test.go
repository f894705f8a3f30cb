package api

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/open-feature/go-sdk/openfeature"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/admission"
	"github.com/space-sandbox/space/internal/apikey"
	"github.com/space-sandbox/space/internal/flags"
	"github.com/space-sandbox/space/internal/testenv"
)

// BenchmarkIdentify is the first step of every request (docs/design.md, "The create
// path"): the identify
// middleware, from the request to its bounded client key and limits, through the
// flags-file Resolver holding a quota flag of 200 clients.
//
//   - trusted_header: X-Client-ID from a trusted peer; no I/O.
//   - api_key: Authorization: Bearer, the failed-auth limiter's peek in Redis and the
//     key's lookup in Postgres (the services'), as space-api does on each request.
func BenchmarkIdentify(b *testing.B) {
	resolver := benchResolver(b)
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if callerFrom(r.Context()).Key != "client-7" {
			panic("identify lost the client")
		}
	})
	run := func(b *testing.B, s *Server, req *http.Request) {
		h := s.identify(next)
		w := httptest.NewRecorder()
		b.ReportAllocs()
		for b.Loop() {
			h.ServeHTTP(w, req)
		}
		if w.Code != http.StatusOK {
			b.Fatalf("identify answered %d: %s", w.Code, w.Body)
		}
	}
	logger := slog.New(slog.DiscardHandler)

	b.Run("trusted_header", func(b *testing.B) {
		s := &Server{logger: logger, callers: resolver,
			auth: &TrustedHeader{Trusted: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}}}
		req := httptest.NewRequest(http.MethodPost, "/v1/sandboxes", nil)
		req.RemoteAddr = "127.0.0.1:40000"
		req.Header.Set(HeaderClientID, "client-7")
		run(b, s, req)
	})

	b.Run("api_key", func(b *testing.B) {
		ctx := testenv.Context(b)
		keys := apikey.NewStore(testenv.DB(b), logger)
		_, secret, err := keys.Create(ctx, "client-7", "bench")
		if err != nil {
			b.Fatal(err)
		}
		failures, err := admission.NewLimiter(admission.LimiterOptions{
			Redis: testenv.Redis(b), Prefix: testenv.Prefix(b) + ":auth_failures",
			Rate: space.Rate{RefillRPS: 0.2, Burst: 20}, Timeout: time.Second,
		})
		if err != nil {
			b.Fatal(err)
		}
		s := &Server{logger: logger, callers: resolver, auth: &APIKey{Keys: keys, Failures: failures}}
		req := httptest.NewRequest(http.MethodPost, "/v1/sandboxes", nil)
		req.RemoteAddr = "127.0.0.1:40000"
		req.Header.Set("Authorization", "Bearer "+secret)
		run(b, s, req)
	})
}

// benchResolver is a Resolver on a flags file of 200 allowlisted clients, half with a
// rate entry, through the file provider as space-api wires it.
func benchResolver(b *testing.B) *flags.Resolver {
	var clients, rates []string
	for i := range 200 {
		clients = append(clients, fmt.Sprintf(`"client-%d": {"concurrency": 20, "live_sandboxes": 200}`, i))
		if i%2 == 1 {
			rates = append(rates, fmt.Sprintf(`"client-%d": {"refill_rps": 10, "burst": 40}`, i))
		}
	}
	quota := `{"clients": {` + strings.Join(clients, ",") + `}, "default": {"concurrency": 10, "live_sandboxes": 50}, "rate": {` + strings.Join(rates, ",") + `}}`
	file := testenv.WriteFile(b, "flags.json", `{"flags": {"`+flags.QuotaFlag+`": {"state": "ENABLED", "variants": {"on": `+quota+`}, "defaultVariant": "on"}}}`)
	provider, err := flags.NewFileProvider(flags.FileProviderOptions{Path: file, PollInterval: time.Hour, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	domain := "bench-" + testenv.RandomID(4)
	if err := openfeature.SetNamedProviderWithContextAndWait(context.Background(), domain, provider); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(provider.Shutdown)
	return flags.NewResolver(flags.ResolverOptions{
		Client: openfeature.NewClient(domain),
		Env:    flags.Env{AdmissionEnabled: true, Cluster: space.Rate{RefillRPS: 100, Burst: 200}},
		Logger: slog.New(slog.DiscardHandler),
	})
}
