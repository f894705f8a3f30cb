package app

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/api"
	"github.com/space-sandbox/space/internal/config"
	"github.com/space-sandbox/space/internal/store"
	"github.com/space-sandbox/space/internal/testenv"
)

// testConfig is a config for a Main on ":0" ports with a database of the test's own.
func testConfig(t testing.TB) config.Config {
	t.Helper()
	cfg := config.Default()
	cfg.HTTPAddr, cfg.InternalHTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.DatabaseURL = testenv.DatabaseURL(t)
	cfg.Redis.Addrs = []string{testenv.RedisAddr(t)}
	// A timeout fit for a test machine running dozens of servers under the race
	// detector: at the 100ms default an overloaded moment fails a Redis call open (and
	// three in a row open the breaker), which looks like a wrong count. The tests about
	// Redis timeouts set their own.
	cfg.Redis.Timeout = 2 * time.Second
	cfg.ShutdownTimeout = 10 * time.Second
	cfg.Dispatcher.Workers = 2 // dozens of servers run at once in this package
	cfg.Sandbox.TemplatesFile = testenv.WriteFile(t, "templates.json", testTemplates)
	cfg.Auth.Mode = config.AuthTrustedHeader
	cfg.Auth.TrustedProxyCIDRs = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
	return cfg
}

const testTemplates = `{"templates": {
	"python-3.12": {"image": "python:3.12-slim", "max_disk_gib": 50},
	"node-22": {"image": "node:22-slim"}
}}`

// startMains runs n Mains built from cfg on one Redis prefix, as replicas of one
// deployment in one process, each closed when the test ends; noReplenisher leaves the
// warm pool to the test's own rounds.
func startMains(t testing.TB, cfg config.Config, n int, noReplenisher bool) []*Main {
	t.Helper()
	prefix := testenv.Prefix(t)
	var replicas []*Main
	for range n {
		m := NewMain(cfg, NewLogger(io.Discard, "error"))
		m.RedisPrefix = prefix
		m.noReplenisher = noReplenisher
		if err := m.Run(testenv.Context(t)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		replicas = append(replicas, m)
	}
	return replicas
}

// startMain runs a Main built from cfg, closed when the test ends.
func startMain(t testing.TB, cfg config.Config) *Main {
	t.Helper()
	m := NewMain(cfg, NewLogger(io.Discard, "error"))
	m.RedisPrefix = testenv.Prefix(t)
	if err := m.Run(testenv.Context(t)); err != nil {
		m.Close()
		t.Fatalf("run: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func getJSON(t *testing.T, url string, v any) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	if v != nil {
		if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
			t.Fatalf("GET %s: decode: %v", url, err)
		}
	}
	return resp.StatusCode
}

func TestServe(t *testing.T) {
	t.Parallel()

	t.Run("redis stopped leaves a fail-open replica ready and degraded, and a fail-closed one unready", func(t *testing.T) {
		t.Parallel()
		for _, mode := range []config.FailureMode{config.FailOpen, config.FailClosed} {
			t.Run(string(mode), func(t *testing.T) {
				t.Parallel()
				redisSrv := testenv.StartRedis(t)
				cfg := testConfig(t)
				cfg.Redis.Addrs = []string{redisSrv.Addr}
				cfg.Admission.FailureMode = mode
				m := startMain(t, cfg)

				var ready api.Readiness
				if code := getJSON(t, m.PublicURL()+"/readyz", &ready); code != http.StatusOK || ready.Status != "ok" {
					t.Fatalf("readyz = %d %+v, want 200 ok", code, ready)
				}
				redisSrv.Stop()
				ready = api.Readiness{}
				code := getJSON(t, m.PublicURL()+"/readyz", &ready)
				switch mode {
				case config.FailOpen:
					if code != http.StatusOK || ready.Status != "degraded" || len(ready.Degraded) != 1 || ready.Degraded[0] != "redis" || len(ready.Down) != 0 {
						t.Fatalf("readyz with redis stopped = %d %+v, want 200 degraded naming redis", code, ready)
					}
				case config.FailClosed:
					if code != http.StatusServiceUnavailable || len(ready.Down) != 1 || ready.Down[0] != "redis" {
						t.Fatalf("readyz with redis stopped = %d %+v, want 503 naming redis", code, ready)
					}
				}
				if c := ready.Checks["redis"]; c.Error != "" || c.Detail != "" || ready.Checks["postgres"].Status != "ok" {
					t.Fatalf("the public readyz says more than what is down: %+v", ready)
				}
				wantReady := map[config.FailureMode]string{config.FailOpen: "space_ready 1", config.FailClosed: "space_ready 0"}[mode]
				metrics := scrape(t, m)
				for _, want := range []string{wantReady, `space_dependency_up{dependency="redis"} 0`, `space_dependency_up{dependency="postgres"} 1`} {
					if !strings.Contains(metrics, "\n"+want+"\n") {
						t.Errorf("/metrics with redis stopped lacks %q", want)
					}
				}
				var internal api.Readiness
				getJSON(t, m.InternalURL()+"/readyz", &internal)
				if internal.Checks["redis"].Error == "" {
					t.Fatalf("the internal readyz does not say why redis is down: %+v", internal)
				}
				redisSrv.Start()
				testenv.Eventually(t, 10*time.Second, "readyz to recover", func() bool {
					var r api.Readiness
					return getJSON(t, m.PublicURL()+"/readyz", &r) == http.StatusOK && r.Status == "ok"
				})
			})
		}
	})

	t.Run("readyz is 503 naming postgres while it is unreachable", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig(t)
		url, proxy := testenv.ProxyDatabaseURL(t, cfg.DatabaseURL)
		cfg.DatabaseURL = url
		m := startMain(t, cfg)
		proxy.Cut()
		var ready api.Readiness
		if code := getJSON(t, m.PublicURL()+"/readyz", &ready); code != http.StatusServiceUnavailable || len(ready.Down) != 1 || ready.Down[0] != "postgres" {
			t.Fatalf("readyz = %d %+v, want 503 naming postgres", code, ready)
		}
		if c := ready.Checks["postgres"]; c.Status != "unavailable" || c.Error != "" || c.Detail != "" {
			t.Fatalf("the public readyz says how postgres is down, not only that it is: %+v", c)
		}
		// /metrics is still served, without the series read from Postgres, and says
		// the replica is not ready.
		metrics := scrape(t, m)
		for _, want := range []string{"space_ready 0", `space_dependency_up{dependency="postgres"} 0`, "space_redis_circuit_breaker_state"} {
			if !strings.Contains(metrics, "\n"+want) {
				t.Errorf("/metrics with postgres cut lacks %q", want)
			}
		}
		proxy.Restore()
		testenv.Eventually(t, 10*time.Second, "readyz to recover", func() bool {
			return getJSON(t, m.PublicURL()+"/readyz", nil) == http.StatusOK
		})
	})

	t.Run("serve refuses an unmigrated database with a clear message", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig(t)
		cfg.DatabaseURL = testenv.EmptyDatabaseURL(t)
		m := NewMain(cfg, NewLogger(io.Discard, "error"))
		defer m.Close()
		err := m.Run(testenv.Context(t))
		if !errors.Is(err, store.ErrNotMigrated) || !strings.Contains(err.Error(), "space-api migrate") {
			t.Fatalf("Run on an unmigrated database = %v, want ErrNotMigrated telling to run space-api migrate", err)
		}
	})

	t.Run("metrics are on the internal listener and not the public one", func(t *testing.T) {
		t.Parallel()
		m := startMain(t, testConfig(t))
		getJSON(t, m.PublicURL()+"/healthz", nil)
		resp, err := http.Get(m.InternalURL() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !bytes.Contains(body, []byte(`space_http_requests_total{code="200",listener="public",method="GET",route="/healthz"} 1`)) {
			t.Fatalf("internal /metrics = %d, missing the healthz request count:\n%.2000s", resp.StatusCode, body)
		}
		if code := getJSON(t, m.PublicURL()+"/metrics", nil); code != http.StatusNotFound {
			t.Fatalf("public /metrics = %d, want 404", code)
		}
	})
}

func TestRun(t *testing.T) {
	t.Parallel()

	t.Run("a bad variable stops the start with one line naming it", func(t *testing.T) {
		t.Parallel()
		env := map[string]string{
			"SPACE_DATABASE_URL":  "postgres://x@127.0.0.1:1/x",
			"SPACE_REDIS_ADDRS":   "127.0.0.1:1",
			"SPACE_REDIS_TIMEOUT": "fast",
		}
		err := Run(context.Background(), []string{"serve"}, func(k string) string { return env[k] }, io.Discard, io.Discard)
		if err == nil || err.Error() != `SPACE_REDIS_TIMEOUT="fast" is invalid: want a positive Go duration such as 100ms, 2s or 10m` {
			t.Fatalf("run = %v", err)
		}
	})

	t.Run("version prints without any configuration", func(t *testing.T) {
		t.Parallel()
		var out bytes.Buffer
		if err := Run(context.Background(), []string{"version"}, func(string) string { return "" }, &out, io.Discard); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(out.String(), "space-api ") {
			t.Fatalf("version printed %q", out.String())
		}
	})

	t.Run("config prints every variable with its default, without any configuration", func(t *testing.T) {
		t.Parallel()
		var out bytes.Buffer
		if err := Run(context.Background(), []string{"config"}, func(string) string { return "" }, &out, io.Discard); err != nil {
			t.Fatal(err)
		}
		for _, v := range config.Vars() {
			want := v.Name + "=" + v.Default
			if v.Default == "" && v.Required == "" {
				want = "#" + v.Name + "="
			}
			if !strings.Contains(out.String(), "\n"+want+"\n") || !strings.Contains(out.String(), v.Help) {
				t.Errorf("config does not print %q with its help %q", want, v.Help)
			}
		}
		var md, want bytes.Buffer
		if err := Run(context.Background(), []string{"config", "--markdown"}, func(string) string { return "" }, &md, io.Discard); err != nil {
			t.Fatal(err)
		}
		if err := config.WriteMarkdown(&want); err != nil || md.String() != want.String() {
			t.Errorf("config --markdown printed something else than the docs tables (%v):\n%s", err, md.String())
		}
		if err := Run(context.Background(), []string{"config", "--yaml"}, func(string) string { return "" }, io.Discard, io.Discard); err == nil {
			t.Error("config --yaml succeeded")
		}
	})

	t.Run("an unknown command is an error", func(t *testing.T) {
		t.Parallel()
		err := Run(context.Background(), []string{"frobnicate"}, func(string) string { return "" }, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), `unknown command "frobnicate"`) {
			t.Fatalf("run = %v", err)
		}
	})

	t.Run("migrate then serve on an empty database", func(t *testing.T) {
		t.Parallel()
		addr := testenv.FreeAddr(t)
		env := map[string]string{
			"SPACE_DATABASE_URL":       testenv.EmptyDatabaseURL(t),
			"SPACE_REDIS_ADDRS":        testenv.RedisAddr(t),
			"SPACE_HTTP_ADDR":          addr,
			"SPACE_INTERNAL_HTTP_ADDR": "127.0.0.1:0",
			"SPACE_TEMPLATES_FILE":     testenv.WriteFile(t, "templates.json", testTemplates),
		}
		getenv := func(k string) string { return env[k] }
		if err := Run(testenv.Context(t), []string{"migrate"}, getenv, io.Discard, io.Discard); err != nil {
			t.Fatalf("migrate: %v", err)
		}
		ctx, cancel := context.WithCancel(testenv.Context(t))
		done := make(chan error, 1)
		go func() { done <- Run(ctx, nil, getenv, io.Discard, io.Discard) }()
		testenv.Eventually(t, 20*time.Second, "serve to answer readyz", func() bool {
			select {
			case err := <-done:
				t.Fatalf("serve stopped by itself: %v", err)
			default:
			}
			resp, err := http.Get("http://" + addr + "/readyz")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		})
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("serve after cancel: %v", err)
		}
	})
}

// scrape returns m's /metrics, which must answer 200.
func scrape(t *testing.T, m *Main) string {
	t.Helper()
	resp, err := http.Get(m.InternalURL() + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics = %d (%v): %s", resp.StatusCode, err, body)
	}
	return string(body)
}

func TestTuneGC(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name, gogc string
		want       []int // the percents set
	}{
		{"without GOGC the collector runs at space-api's own percent", "", []int{config.GCPercent}},
		{"a GOGC of the operator's is left to Go", "100", nil},
		{"GOGC=off is left to Go", "off", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var got []int
			TuneGC(func(k string) string {
				if k == "GOGC" {
					return tc.gogc
				}
				return ""
			}, func(p int) int { got = append(got, p); return 100 })
			if !slices.Equal(got, tc.want) {
				t.Errorf("set %v, want %v", got, tc.want)
			}
		})
	}
}
