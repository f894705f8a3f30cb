package main

import (
	"net/http"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/config"
	"github.com/space-sandbox/space/internal/substrate"
)

func TestSoftLimit(t *testing.T) {
	t.Parallel()

	t.Run("a client at 7/s under a soft 5/s and a hard 10/s: the creates over the soft rate are marked, none under it, and none is refused", func(t *testing.T) {
		t.Parallel()
		const softRPS, softBurst = 5, 5
		s := startServer(t, e2eOptions{
			quota: `{"tiers": {"pro": {"refill_rps": 10, "burst": 10, "soft_refill_rps": 5, "soft_burst": 5,
				"concurrency": 20, "live_sandboxes": 200}}, "clients": {"acme": {"tier": "pro"}}}`,
			config: func(c *config.Config) { c.Flags.FallbackTier = "pro" },
		})
		// A create every 1/7 s for 5 s, one at a time, so that each is decided between
		// its send and its answer (a create slower than its slot delays the next; the
		// model below follows the real send times). A first create of another client
		// takes the start-up's slowness out of the measured run.
		s.create("someone-else", nodeBody)
		type sent struct {
			at      time.Time
			sandbox space.Sandbox
			header  http.Header
		}
		var all []sent
		next := time.Now()
		for end := next.Add(5 * time.Second); next.Before(end); next = next.Add(time.Second / 7) {
			time.Sleep(time.Until(next))
			at := time.Now()
			r := s.do("POST", "/v1/sandboxes", "acme", nodeBody)
			if r.StatusCode != http.StatusCreated {
				t.Fatalf("create at 7/s = %d %s, want 201: the hard limit is 10/s", r.StatusCode, r.body)
			}
			var sb space.Sandbox
			r.json(t, &sb)
			all = append(all, sent{at, sb, r.Header})
		}

		// The soft bucket as a model over the send times: each create takes a token
		// when one is there, and is a breach when none is.
		tokens, last, want := float64(softBurst), all[0].at, 0
		marked := map[string]bool{}
		for i, c := range all {
			tokens = min(softBurst, tokens+c.at.Sub(last).Seconds()*softRPS)
			last = c.at
			if tokens >= 1 {
				tokens--
			} else {
				want++
			}
			if c.sandbox.SoftBreach {
				marked[c.sandbox.ID] = true
				if c.sandbox.SoftBreachAt == nil {
					t.Errorf("create %d is marked with no soft_breach_at", i)
				}
				if c.at.Sub(all[0].at) < 1500*time.Millisecond {
					t.Errorf("create %d, %v in, marked while the client was under its soft rate", i, c.at.Sub(all[0].at))
				}
			}
		}
		if got := len(marked); got < want-1 || got > want+1 || want < 3 {
			t.Fatalf("%d of %d creates marked, want the soft bucket's %d (±1 for the clocks)", got, len(all), want)
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
