package flags

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space"
)

func TestLifecycleFieldsAreChecked(t *testing.T) {
	t.Parallel()

	t.Run("a malformed lifecycle field is refused naming where it is and the field", func(t *testing.T) {
		t.Parallel()
		for raw, want := range map[string]string{
			`{"tiers": {"pro": {"max_lifetime_seconds": -1}}}`:        "tiers.pro: malformed flag value: max_lifetime_seconds must be whole seconds from 0 (none) to 315360000 (10 years), got -1",
			`{"tiers": {"pro": {"max_lifetime_seconds": 315360001}}}`: "tiers.pro: malformed flag value: max_lifetime_seconds must be whole seconds from 0 (none) to 315360000 (10 years), got ",
			`{"tiers": {"pro": {"idle_timeout_seconds": 1.5}}}`:       "tiers.pro: malformed flag value: idle_timeout_seconds must be whole seconds",
			`{"tiers": {"pro": {"idle_timeout_seconds": "900"}}}`:     `tiers.pro: malformed flag value: idle_timeout_seconds must be whole seconds from 0 (none) to 315360000 (10 years), got "900"`,
			`{"tiers": {"pro": {"paused_retention_seconds": 1e30}}}`:  "tiers.pro: malformed flag value: paused_retention_seconds must be whole seconds",
			`{"tiers": {"pro": {"idle_action": "sleep"}}}`:            `tiers.pro: malformed flag value: idle_action must be "pause" or "terminate", got "sleep"`,
			`{"tiers": {"pro": {"idle_action": "Pause"}}}`:            `tiers.pro: malformed flag value: idle_action must be "pause" or "terminate", got "Pause"`,
			`{"tiers": {"pro": {"idle_action": 1}}}`:                  `tiers.pro: malformed flag value: idle_action must be "pause" or "terminate", got 1`,
			`{"tiers": {"pro": {"paused_sandboxes": -1}}}`:            "tiers.pro: malformed flag value: paused_sandboxes must be an integer from 0 (no cap) to 2147483647, got -1",
			`{"clients": {"acme": {"paused_sandboxes": 2.5}}}`:        "clients.acme: malformed flag value: paused_sandboxes must be an integer from 0 (no cap)",
			`{"clients": {"acme": {"max_lifetime_seconds": true}}}`:   "clients.acme: malformed flag value: max_lifetime_seconds must be whole seconds from 0 (none) to 315360000 (10 years), got true",
			`{"clients": {"acme": {"idle_action": ""}}}`:              `clients.acme: malformed flag value: idle_action must be "pause" or "terminate", got ""`,
			`{"clients": {"acme": {"idle_timout_seconds": 60}}}`:      `clients.acme: malformed flag value: unknown field "idle_timout_seconds"`,
			`{"default": {"max_lifetime_seconds": 3600}}`:             `default: malformed flag value: unknown field "max_lifetime_seconds"`,
			`{"default": {"idle_action": "pause", "concurrency": 1}}`: `default: malformed flag value: unknown field "idle_action"`,
		} {
			_, err := ParseQuotas(decode(t, raw))
			if !errors.Is(err, ErrMalformed) || !strings.HasPrefix(err.Error(), want) {
				t.Errorf("%s: %v, want an error starting %q", raw, err, want)
			}
		}
	})

	t.Run("zero and the ten-year maximum are accepted, null says nothing", func(t *testing.T) {
		t.Parallel()
		q, err := ParseQuotas(decode(t, `{"tiers": {"pro": {"max_lifetime_seconds": 315360000, "idle_timeout_seconds": 0,
			"idle_action": "terminate", "paused_retention_seconds": null, "paused_sandboxes": 0}}}`))
		if err != nil {
			t.Fatal(err)
		}
		pro := q.Tiers["pro"].Fields
		if *pro.MaxLifetime != 3650*24*time.Hour || *pro.IdleTimeout != 0 || *pro.IdleAction != space.IdleTerminate ||
			pro.PausedRetention != nil || *pro.PausedSandboxes != 0 {
			t.Fatalf("pro = %+v", pro)
		}
	})
}
