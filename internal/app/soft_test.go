package app

import (
	"net/http"
	"slices"
	"sort"
	"testing"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/config"
	"github.com/space-sandbox/space/internal/substrate"
)

func TestSoftLimit(t *testing.T) {
	t.Parallel()

	t.Run("a client past its soft burst: the creates over it are marked, none before, and none is refused", func(t *testing.T) {
		t.Parallel()
		// A soft bucket of 5 that barely refills, inside a hard one of 20: whatever
		// the machine's speed, the first 5 creates are within the soft limit and the
		// 7 after it over it.
		const softBurst, creates = 5, 12
		s := startServer(t, e2eOptions{
			quota: `{"tiers": {"pro": {"refill_rps": 0.000001, "burst": 20, "soft_refill_rps": 0.0000005, "soft_burst": 5,
				"concurrency": 20, "live_sandboxes": 200}}, "clients": {"acme": {"tier": "pro"}}}`,
			config: func(c *config.Config) { c.Flags.FallbackTier = "pro" },
		})
		type sent struct {
			sandbox space.Sandbox
			header  http.Header
		}
		var all []sent
		for range creates {
			r := s.do("POST", "/v1/sandboxes", "acme", nodeBody)
			if r.StatusCode != http.StatusCreated {
				t.Fatalf("create = %d %s, want 201: the hard limit is 20", r.StatusCode, r.body)
			}
			var sb space.Sandbox
			r.json(t, &sb)
			all = append(all, sent{sb, r.Header})
		}
		marked := map[string]bool{}
		for i, c := range all {
			if c.sandbox.SoftBreach != (i >= softBurst) {
				t.Errorf("create %d: soft_breach %v, want %v", i, c.sandbox.SoftBreach, i >= softBurst)
			}
			if c.sandbox.SoftBreach {
				marked[c.sandbox.ID] = true
				if c.sandbox.SoftBreachAt == nil {
					t.Errorf("create %d is marked with no soft_breach_at", i)
				}
			}
		}
		// The record says so on GET, the substrate was told, and the counter agrees.
		for id := range marked {
			var sb space.Sandbox
			s.do("GET", "/v1/sandboxes/"+id, "acme", "").json(t, &sb)
			if !sb.SoftBreach || sb.SoftBreachAt == nil {
				t.Fatalf("GET %s: soft_breach %v at %v, want it marked", id, sb.SoftBreach, sb.SoftBreachAt)
			}
		}
		told := map[string]bool{}
		for _, c := range s.m.Substrate.(*substrate.Simulated).Calls() {
			if c.Op == substrate.OpStartCold && c.SoftBreach {
				told[c.SandboxID] = true
			}
		}
		if len(told) != len(marked) {
			t.Fatalf("the substrate was told of %d soft breaches, the records show %d", len(told), len(marked))
		}
		for id := range marked {
			if !told[id] {
				t.Fatalf("sandbox %s is marked, but its start did not carry the breach", id)
			}
		}
		if got := s.metric("space_sandbox_soft_breaches_total", `budget_key="acme"`, `tier="pro"`); int(got) != len(marked) {
			t.Fatalf("space_sandbox_soft_breaches_total = %v, want %d", got, len(marked))
		}
		// The caller's answer does not change: a breached 201 has the headers of any other.
		var breached, plain http.Header
		for _, c := range all {
			if c.sandbox.SoftBreach {
				breached = c.header
			} else {
				plain = c.header
			}
		}
		if !slices.Equal(headerNames(breached), headerNames(plain)) {
			t.Fatalf("a breached create answers with headers %v, another with %v", headerNames(breached), headerNames(plain))
		}
	})
}

func headerNames(h http.Header) []string {
	var names []string
	for k := range h {
		if k != "Date" && k != "Content-Length" {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	return names
}
