package api

import (
	"bytes"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/flags"
)

// lifecycleReport is the part of a /v1/limits body, or of a /v1/tiers row, that says
// the lifecycle: the lifecycle object as written, and the sources.
type lifecycleReport struct {
	Name      string            `json:"name"`
	Lifecycle json.RawMessage   `json:"lifecycle"`
	Sources   map[string]string `json:"sources"`
}

// sameJSON reports whether got is want, whitespace aside.
func sameJSON(t *testing.T, got json.RawMessage, want string) bool {
	t.Helper()
	var g, w bytes.Buffer
	if err := json.Compact(&g, got); err != nil {
		t.Fatalf("%s: %v", got, err)
	}
	if err := json.Compact(&w, []byte(want)); err != nil {
		t.Fatalf("bad test JSON %s: %v", want, err)
	}
	return g.String() == w.String()
}

// proLifecycle is the contract's example of a tier's lifecycle.
var proLifecycle = space.Lifecycle{MaxLifetime: 24 * time.Hour, IdleTimeout: 15 * time.Minute, IdleAction: space.IdlePause,
	PausedRetention: 7 * 24 * time.Hour, PausedSandboxes: 100}

const proLifecycleJSON = `{"max_lifetime_seconds": 86400, "idle_timeout_seconds": 900, "idle_action": "pause",
	"paused_retention_seconds": 604800, "paused_sandboxes": 100}`

func TestLifecycleReports(t *testing.T) {
	t.Parallel()

	limits := func(t *testing.T, h *handlers) lifecycleReport {
		t.Helper()
		w := h.do(h.public, "GET", "/v1/limits", "")
		var r lifecycleReport
		if err := json.Unmarshal(w.Body.Bytes(), &r); err != nil || w.Code != http.StatusOK {
			t.Fatalf("limits = %d %s", w.Code, w.Body)
		}
		return r
	}

	t.Run("GET /v1/limits reports the caller's lifecycle in seconds, and where each field came from", func(t *testing.T) {
		t.Parallel()
		h := setup(t)
		h.callers.with = func(c *space.Caller) {
			c.Lifecycle = proLifecycle
			c.Lifecycle.IdleTimeout = 30 * time.Minute
			c.Sources.MaxLifetime, c.Sources.IdleTimeout, c.Sources.IdleAction = space.SourceTier, space.SourceClient, space.SourceTier
			c.Sources.PausedRetention, c.Sources.PausedSandboxes = space.SourceFallback, space.SourceEnv
		}
		r := limits(t, h)
		if want := `{"max_lifetime_seconds": 86400, "idle_timeout_seconds": 1800, "idle_action": "pause",
			"paused_retention_seconds": 604800, "paused_sandboxes": 100}`; !sameJSON(t, r.Lifecycle, want) {
			t.Fatalf("lifecycle = %s, want %s", r.Lifecycle, want)
		}
		for field, want := range map[string]string{"max_lifetime_seconds": "tier", "idle_timeout_seconds": "client", "idle_action": "tier",
			"paused_retention_seconds": "fallback", "paused_sandboxes": "env"} {
			if got := r.Sources[field]; got != want {
				t.Errorf("sources.%s = %q, want %q", field, got, want)
			}
		}
	})

	t.Run("a lifecycle that bounds nothing is all null, an idle action without an idle timeout too", func(t *testing.T) {
		t.Parallel()
		for name, lc := range map[string]space.Lifecycle{
			"the zero lifecycle":            {},
			"an idle action and no timeout": {IdleAction: space.IdleTerminate},
		} {
			h := setup(t)
			h.callers.with = func(c *space.Caller) { c.Lifecycle = lc }
			if r := limits(t, h); !sameJSON(t, r.Lifecycle, `{"max_lifetime_seconds": null, "idle_timeout_seconds": null, "idle_action": null,
				"paused_retention_seconds": null, "paused_sandboxes": null}`) {
				t.Errorf("%s: lifecycle = %s, want every field null", name, r.Lifecycle)
			}
		}
	})

	t.Run("an idle timeout whose action is unnamed is reported as pause, the lifecycle's default", func(t *testing.T) {
		t.Parallel()
		h := setup(t)
		h.callers.with = func(c *space.Caller) {
			c.Lifecycle = space.Lifecycle{IdleTimeout: 90 * time.Second, MaxLifetime: 1500 * time.Millisecond}
		}
		// Never reported shorter than it is: a part of a second counts as one.
		if r := limits(t, h); !sameJSON(t, r.Lifecycle, `{"max_lifetime_seconds": 2, "idle_timeout_seconds": 90, "idle_action": "pause",
			"paused_retention_seconds": null, "paused_sandboxes": null}`) {
			t.Fatalf("lifecycle = %s", r.Lifecycle)
		}
	})

	t.Run("GET /v1/tiers reports each tier's lifecycle from the table in force, with its sources", func(t *testing.T) {
		t.Parallel()
		h := setup(t)
		pro := space.Caller{Tier: "pro", Lifecycle: proLifecycle, QueueWeight: 1, Sources: space.Sources{MaxLifetime: space.SourceTier,
			IdleTimeout: space.SourceTier, IdleAction: space.SourceTier, PausedRetention: space.SourceTier, PausedSandboxes: space.SourceTier}}
		free := space.Caller{Tier: "free", Lifecycle: space.Lifecycle{MaxLifetime: time.Hour, IdleTimeout: 5 * time.Minute, IdleAction: space.IdleTerminate},
			Sources: space.Sources{MaxLifetime: space.SourceTier, IdleTimeout: space.SourceTier, IdleAction: space.SourceTier,
				PausedRetention: space.SourceEnv, PausedSandboxes: space.SourceEnv}}
		h.tiers.table = flags.TierTable{Fallback: "free", Tiers: []space.Caller{free, pro}}
		w := h.do(h.public, "GET", "/v1/tiers", "")
		var body struct {
			Tiers []lifecycleReport `json:"tiers"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil || w.Code != http.StatusOK || len(body.Tiers) != 2 {
			t.Fatalf("tiers = %d %s", w.Code, w.Body)
		}
		rows := map[string]lifecycleReport{}
		for _, r := range body.Tiers {
			rows[r.Name] = r
		}
		if got := rows["pro"]; !sameJSON(t, got.Lifecycle, proLifecycleJSON) || got.Sources["idle_action"] != "tier" {
			t.Errorf("pro = %s from %v", got.Lifecycle, got.Sources)
		}
		if got := rows["free"]; !sameJSON(t, got.Lifecycle, `{"max_lifetime_seconds": 3600, "idle_timeout_seconds": 300, "idle_action": "terminate",
			"paused_retention_seconds": null, "paused_sandboxes": null}`) || got.Sources["paused_sandboxes"] != "env" {
			t.Errorf("free = %s from %v", got.Lifecycle, got.Sources)
		}
	})
}
