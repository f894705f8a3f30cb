package app

import (
	"net/http"
	"os"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/space-sandbox/space/internal/config"
	"github.com/space-sandbox/space/internal/testenv"
)

// TestSignals drives a server through a warm hit, a cold start, a refusal and a queued
// operation, then reads the series an operator watches from a real scrape.
func TestSignals(t *testing.T) {
	t.Parallel()
	s := startServer(t, e2eOptions{
		// acme is on a tier that reserves part of the cluster bucket and has a soft
		// limit of one activation, so that the tier series are there, and that ends its
		// sandboxes a second idle, so that the lifecycle's are.
		quota: `{"tiers": {"pro": {"concurrency": 50, "live_sandboxes": 100, "refill_rps": 0.000001, "burst": 2,
				"soft_refill_rps": 0.0000005, "soft_burst": 1, "reserved_rps": 0.0000001, "reserved_burst": 10,
				"idle_timeout_seconds": 1, "idle_action": "terminate"}},
			"clients": {"acme": {"tier": "pro"}}}`,
		poolShapes: `[{"template": "python-3.12", "cpu_millis": 1000, "memory_mib": 2048, "disk_gib": 10, "target": 1}]`,
		// No worker: the queued create stays queued, and no run of it is refused (and
		// counted) while the test reads the series.
		config: func(c *config.Config) {
			c.Dispatcher.Workers = 0
			c.Flags.FallbackTier = "pro"
			c.Lifecycle.Interval = 100 * time.Millisecond
		},
	})
	testenv.Eventually(t, 30*time.Second, "the warm pool to fill", func() bool {
		return s.metric("space_pool_ready_slots", `shape="python-3.12/1000m/2048Mi/10Gi"`) == 1
	})
	s.create("acme", pythonBody) // warm
	const node = `{"template":"node-22","cpu_millis":1000,"memory_mib":1024,"disk_gib":5}`
	s.create("acme", node) // cold
	s.create("acme", node) // cold
	if r := s.do("POST", "/v1/sandboxes", "acme", node); r.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("a create over the rate = %d %s", r.StatusCode, r.body)
	}
	s.accepted(s.do("POST", "/v1/sandboxes", "acme", node, "Prefer", async), "/v1/operations/")
	testenv.Eventually(t, 30*time.Second, "the three idle sandboxes to be ended", func() bool {
		return strings.Contains(string(s.internal("GET", "/metrics", "").body),
			`space_sandbox_lifecycle_actions_total{action="terminate",reason="idle",tier="pro"} 3`+"\n")
	})

	body := scrape(t, s.m)

	t.Run("the scrape is clean by promlint", func(t *testing.T) {
		problems, err := promlint.New(strings.NewReader(body)).Lint()
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range problems {
			t.Errorf("promlint: %s: %s", p.Metric, p.Text)
		}
	})

	t.Run("every series an operator watches is there, with what happened", func(t *testing.T) {
		for _, want := range []string{
			`space_build_info{goversion="` + runtime.Version() + `",revision="[^"]+",version="[^"]+"} 1`,
			`space_sandbox_activation_seconds_count{kind="create",outcome="warm"} 1`,
			`space_sandbox_activation_seconds_count{kind="create",outcome="cold"} 2`,
			`space_sandbox_activation_seconds_count{kind="create",outcome="rejected"} 1`,
			`space_sandbox_activation_seconds_count{kind="restore",outcome="failed"} 0`,
			`space_sandbox_cold_start_seconds_count{kind="create"} 2`,
			`space_dispatcher_queue_depth{budget_key="acme",kind="create",state="queued",tier="[^"]*"} 1`,
			`space_dispatcher_queue_depth{budget_key="acme",kind="create",state="running",tier="[^"]*"} 0`,
			`space_dispatcher_oldest_queued_seconds{budget_key="unknown",kind="wake",tier=""} 0`,
			`space_pool_target_slots{shape="python-3.12/1000m/2048Mi/10Gi"} 1`,
			`space_pool_ready_slots{shape="python-3.12/1000m/2048Mi/10Gi"} [01]`,
			`space_redis_circuit_breaker_state{state="closed"} 1`,
			`space_ready 1`,
			`space_dependency_up{dependency="postgres"} 1`,
			`space_dependency_up{dependency="redis"} 1`,
			`space_flags_last_reload_successful 1`,
			`space_tier_reserved_rps{tier="pro"} 1e-07`,
			`space_sandbox_admission_cluster_tokens_total{source="reserve",tier="pro"} 2`,
			`space_sandbox_soft_breaches_total{budget_key="acme",tier="pro"} 1`,
			`space_tier_fallback_total{reason="unknown_tier"} 0`,
			`space_sandbox_lifecycle_actions_total{action="terminate",reason="idle",tier="pro"} 3`,
			`space_sandbox_lifecycle_failures_total{action="pause"} 0`,
		} {
			if !regexp.MustCompile(`(?m)^` + want + `$`).MatchString(body) {
				t.Errorf("/metrics lacks a line matching %s", want)
			}
		}
	})

	t.Run("every series the chart's alerts and dashboard read is in the scrape", func(t *testing.T) {
		// deploy/helm's TestMonitoring parses every query and writes the names here.
		golden, err := os.ReadFile("../../deploy/helm/testdata/monitoring-series.txt")
		if err != nil {
			t.Fatal(err)
		}
		names := strings.Fields(string(golden))
		if len(names) < 20 {
			t.Fatalf("%d series names in the golden file, want the chart's", len(names))
		}
		for _, name := range names {
			if name == "up" {
				continue // made by Prometheus for every target, not exported
			}
			if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `[{ ]`).MatchString(body) {
				t.Errorf("the chart reads %s, which the scrape does not have", name)
			}
		}
	})
}
