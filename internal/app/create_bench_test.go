package app

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/config"
	"github.com/space-sandbox/space/internal/testenv"
)

// BenchmarkCreate is the whole create path of one in-process server, over loopback
// HTTP, the client in the same process: what bench/ (make bench) measures from outside,
// here so that a CPU profile covers the server's every layer:
//
//	go test -run '^$' -bench Create -benchtime 5s -cpuprofile cpu.out ./internal/app/
//	go tool pprof -top cpu.out
//
// rejected: every create is a 429 client_activation (an empty client bucket);
// rejected_tiered: the same for a client on a tier of a tier table (its numbers from
// the tier, the floor tier configured), which must cost no more than an untiered
// refusal; cold: a cold admit (simulated substrate, no delay) with admission on;
// cold_admission_off: the same with SPACE_CLUSTER_ACTIVATION_ADMISSION_ENABLED=false.
func BenchmarkCreate(b *testing.B) {
	const quota = `{"clients": {"bench": {"concurrency": 1000, "live_sandboxes": 1000}, "bulk": {"concurrency": 1000, "live_sandboxes": 0}},
		"default": {"concurrency": 10, "live_sandboxes": 50},
		"rate": {"bench": {"refill_rps": 0, "burst": 1}, "bulk": {"refill_rps": 1000000, "burst": 1000000}}}`
	const tiered = `{"tiers": {
			"free": {"refill_rps": 0.000001, "burst": 1, "concurrency": 10, "live_sandboxes": 50},
			"pro":  {"refill_rps": 0.000001, "burst": 1, "concurrency": 1000, "live_sandboxes": 1000}},
		"clients": {"bench": {"tier": "pro"}}}`
	cases := []struct {
		name, client, quota string
		admission           bool
		want                int
	}{
		{"rejected", "bench", quota, true, http.StatusTooManyRequests},
		{"rejected_tiered", "bench", tiered, true, http.StatusTooManyRequests},
		{"cold", "bulk", quota, true, http.StatusCreated},
		{"cold_admission_off", "bulk", quota, false, http.StatusCreated},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			m := benchMain(b, c.quota, c.admission)
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 30 * time.Second}
			create := func() (int, error) {
				req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, m.PublicURL()+"/v1/sandboxes", strings.NewReader(`{"template":"python-3.12","cpu_millis":500,"memory_mib":1024,"disk_gib":5}`))
				if err != nil {
					return 0, err
				}
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("X-Client-ID", c.client)
				resp, err := client.Do(req)
				if err != nil {
					return 0, err
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				return resp.StatusCode, nil
			}
			if _, err := create(); err != nil { // the rejected client's one token
				b.Fatal(err)
			}
			b.SetParallelism(8)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					code, err := create()
					if err == nil && code != c.want {
						err = fmt.Errorf("status %d, want %d", code, c.want)
					}
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "creates/s")
		})
	}
}

// BenchmarkRefusalHandler is one refusal from memory through the public handler alone,
// no socket and no net/http server: the CPU and allocations of the chain itself
// (request id, metrics, identity, seat, body, the known refusal, the 429's headers and
// body), which BenchmarkCreate/rejected's figures spread among loopback and the client.
// untiered: a client with a rate of its own; tiered: the same refusal for a client on
// a tier of a tier table, which must cost no more.
//
//	go test -run '^$' -bench RefusalHandler -benchmem -cpuprofile cpu.out ./internal/app/
func BenchmarkRefusalHandler(b *testing.B) {
	cases := []struct{ name, quota string }{
		{"untiered", `{"clients": {"bench": {"concurrency": 0, "live_sandboxes": 0}}, "rate": {"bench": {"refill_rps": 0, "burst": 1}}}`},
		{"tiered", `{"tiers": {
			"free": {"refill_rps": 0, "burst": 1, "concurrency": 10, "live_sandboxes": 50},
			"pro":  {"refill_rps": 0, "burst": 1, "concurrency": 0, "live_sandboxes": 0}},
		"clients": {"bench": {"tier": "pro"}}}`},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			h := benchMain(b, c.quota, true).API.Public()
			create := func() int {
				w := &testenv.StatusWriter{}
				h.ServeHTTP(w, testenv.CreateRequest("bench"))
				return w.Status
			}
			create() // the client's one token
			b.ReportAllocs()
			for b.Loop() {
				if status := create(); status != http.StatusTooManyRequests {
					b.Fatalf("status %d, want 429", status)
				}
			}
		})
	}
}

// benchMain starts a Main for the create benchmarks: trusted_header identity from
// loopback, the quota flag given, the floor tier "free", a cluster bucket no run
// empties, admission on or off.
func benchMain(b *testing.B, quota string, admission bool) *Main {
	cfg := config.Default()
	cfg.HTTPAddr, cfg.InternalHTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.DatabaseURL = testenv.DatabaseURL(b)
	cfg.Redis.Addrs = []string{testenv.RedisAddr(b)}
	cfg.Sandbox.TemplatesFile = testenv.WriteFile(b, "templates.json", testTemplates)
	cfg.Auth.Mode = config.AuthTrustedHeader
	cfg.Auth.TrustedProxyCIDRs = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
	cfg.Flags.File = testenv.WriteFile(b, "flags.json", quotaFlags(quota, ""))
	cfg.Flags.FallbackTier = "free"
	cfg.Admission.Enabled = admission
	cfg.Admission.Cluster = space.Rate{RefillRPS: 1e6, Burst: 1e6}
	m := NewMain(cfg, NewLogger(io.Discard, "info"))
	m.RedisPrefix = testenv.Prefix(b)
	if err := m.Run(testenv.Context(b)); err != nil {
		m.Close()
		b.Fatal(err)
	}
	b.Cleanup(func() { m.Close() })
	return m
}
