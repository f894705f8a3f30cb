package app

import (
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/api"
	"github.com/space-sandbox/space/internal/config"
	"github.com/space-sandbox/space/internal/testenv"
)

// TestComposedFromOutside drives the admission features together through the API, as
// a client sees them: costs with reserves, and what a refusal and /v1/limits report
// under reserves.
func TestComposedFromOutside(t *testing.T) {
	t.Parallel()

	t.Run("a cost no single source holds is created, and one past all a tier can draw is a 422 naming template, tier and cost", func(t *testing.T) {
		t.Parallel()
		// docs/tiers.md's layout: cluster 100/s burst 200, pro reserving 20/s (40),
		// enterprise 40/s (80); free may draw the shared 80 and 20 lent by each.
		s := startServer(t, e2eOptions{
			quota: `{"tiers": {
					"free": {"refill_rps": 0.000001, "burst": 500, "concurrency": 10, "live_sandboxes": 10},
					"pro": {"refill_rps": 0.000001, "burst": 500, "concurrency": 10, "live_sandboxes": 10,
						"reserved_rps": 20, "reserved_burst": 40, "lendable": 0.5},
					"enterprise": {"refill_rps": 0.000001, "burst": 500, "concurrency": 10, "live_sandboxes": 10,
						"reserved_rps": 40, "reserved_burst": 80, "lendable": 0.25}},
				"clients": {"acme": {"tier": "pro"}, "initech": {"tier": "free"}}}`,
			config: func(c *config.Config) {
				c.Admission.Cluster = space.Rate{RefillRPS: 100, Burst: 200}
				c.Flags.FallbackTier = "free"
				c.Sandbox.TemplatesFile = testenv.WriteFile(t, "templates.json", `{"templates": {
					"python-3.12": {"image": "python:3.12-slim", "max_disk_gib": 50},
					"big": {"image": "big:1", "activation_cost": 100},
					"huge": {"image": "huge:1", "activation_cost": 121}}}`)
			},
		})
		big := `{"template":"big","cpu_millis":1000,"memory_mib":1024,"disk_gib":5}`
		huge := `{"template":"huge","cpu_millis":1000,"memory_mib":1024,"disk_gib":5}`
		if r := s.do("POST", "/v1/sandboxes", "acme", big); r.StatusCode != http.StatusCreated {
			t.Fatalf("pro's create of cost 100 on full buckets = %d %s, want 201 (its 40 and 60 shared)", r.StatusCode, r.body)
		}
		r := s.do("POST", "/v1/sandboxes", "initech", huge)
		p := r.problem(t)
		if r.StatusCode != http.StatusUnprocessableEntity || p.Field != "template" ||
			!strings.Contains(p.Detail, `"huge"`) || !strings.Contains(p.Detail, `tier "free"`) || !strings.Contains(p.Detail, "121") {
			t.Fatalf("free's create of cost 121 = %d %+v, want a 422 naming the template, the tier and the cost", r.StatusCode, p)
		}
	})

	t.Run("a refusal and /v1/limits say what the tier can draw, not what busy tiers hold", func(t *testing.T) {
		t.Parallel()
		// Cluster 2/s burst 12; pro and enterprise each reserve 0.1/s burst 4 and lend
		// all of it while idle; the shared remainder is 1.8/s burst 4.
		s := startServer(t, e2eOptions{
			quota: `{"tiers": {
					"free": {"refill_rps": 1000, "burst": 100, "concurrency": 10, "live_sandboxes": 100},
					"pro": {"refill_rps": 1000, "burst": 100, "concurrency": 10, "live_sandboxes": 100,
						"reserved_rps": 0.1, "reserved_burst": 4, "lendable": 1},
					"enterprise": {"refill_rps": 1000, "burst": 100, "concurrency": 10, "live_sandboxes": 100,
						"reserved_rps": 0.1, "reserved_burst": 4, "lendable": 1}},
				"clients": {"acme": {"tier": "pro"}, "globex": {"tier": "enterprise"}, "initech": {"tier": "free"}}}`,
			config: func(c *config.Config) {
				c.Admission.Cluster = space.Rate{RefillRPS: 2, Burst: 12}
				c.Flags.FallbackTier = "free"
			},
		})
		s.create("acme", nodeBody)
		s.create("globex", nodeBody) // both tiers have asked: neither lends for 40 s
		// The shared remainder was full, its 4 tokens, when free's creates began: from
		// then on it holds at most what refilled since, 1.8 a second. So free gets its
		// 4 and then, until a create is refused, only what refilled (none, unless the
		// machine is slow): never the busy lenders' 8.
		began := time.Now()
		for range 4 {
			s.create("initech", nodeBody)
		}
		r := s.do("POST", "/v1/sandboxes", "initech", nodeBody)
		for refilled := 0; r.StatusCode == http.StatusCreated; r = s.do("POST", "/v1/sandboxes", "initech", nodeBody) {
			if refilled++; float64(refilled) > 1.8*time.Since(began).Seconds()+0.01 {
				t.Fatalf("free's create %d was admitted %v after its first: more than the shared remainder's 4 and its refill", 4+refilled, time.Since(began))
			}
		}
		if r.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("free's create past the shared remainder = %d %s, want 429", r.StatusCode, r.body)
		}
		m := regexp.MustCompile(`^"cluster_activation";r=(\d+);t=(\d+)$`).FindStringSubmatch(r.Header.Get("RateLimit"))
		if m == nil || m[1] != "0" {
			t.Fatalf("RateLimit %q, want cluster_activation with r=0: nothing is left to draw", r.Header.Get("RateLimit"))
		}
		if retry, _ := strconv.Atoi(r.Header.Get("Retry-After")); retry > 2 {
			t.Fatalf("Retry-After %d, want the shared remainder's second or so, not the lenders' 40 s", retry)
		}
		var limits api.LimitsBody
		s.do("GET", "/v1/limits", "initech", "").json(t, &limits)
		// Judged against the time it took, which a loaded machine stretches: the busy
		// lenders' 8 tokens would be far over it.
		most := 1.8*time.Since(began).Seconds() + 0.01
		if limits.Cluster.Remaining == nil {
			t.Fatalf("free's /v1/limits has no cluster remaining: %+v", limits.Cluster)
		}
		if got := *limits.Cluster.Remaining; got > most {
			t.Fatalf("free's /v1/limits cluster remaining %.2f, want at most the %.2f refilled since its creates began", got, most)
		}
	})
}
