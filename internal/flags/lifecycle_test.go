package flags

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space"
)

// lifecycleTiers is a tier table whose tiers set distinct lifecycles, with clients on
// them as they are and overriding them.
const lifecycleTiers = `{
  "tiers": {
    "free": {"max_lifetime_seconds": 3600, "idle_timeout_seconds": 300, "idle_action": "terminate", "paused_sandboxes": 2},
    "pro":  {"max_lifetime_seconds": 86400, "idle_timeout_seconds": 900, "idle_action": "pause",
             "paused_retention_seconds": 604800, "paused_sandboxes": 100}
  },
  "clients": {
    "acme":    {"tier": "pro"},
    "globex":  {"tier": "pro", "idle_timeout_seconds": 1800, "paused_sandboxes": 0},
    "initech": {"tier": "gold"},
    "hooli":   {"tier": "free", "max_lifetime_seconds": 0, "idle_action": "pause"}
  }
}`

// lifecycleSources are the five sources of c's lifecycle, in Lifecycle's order.
func lifecycleSources(c space.Caller) [5]space.RateSource {
	s := c.Sources
	return [5]space.RateSource{s.MaxLifetime, s.IdleTimeout, s.IdleAction, s.PausedRetention, s.PausedSandboxes}
}

func allFrom(s space.RateSource) [5]space.RateSource { return [5]space.RateSource{s, s, s, s, s} }

func TestLifecycle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const day = 24 * time.Hour

	t.Run("a client on a tier gets the tier's lifecycle, every field from the tier", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(lifecycleTiers), withEnv(tiersEnv()))
		c := f.resolver.Resolve(ctx, "acme")
		want := space.Lifecycle{MaxLifetime: day, IdleTimeout: 15 * time.Minute, IdleAction: space.IdlePause,
			PausedRetention: 7 * day, PausedSandboxes: 100}
		if c.Lifecycle != want || lifecycleSources(c) != allFrom(space.SourceTier) {
			t.Fatalf("acme = %+v from %v, want %+v, all from the tier", c.Lifecycle, lifecycleSources(c), want)
		}
		if len(c.Warnings) != 0 {
			t.Fatalf("acme's sound lifecycle warned: %q", c.Warnings)
		}
	})

	t.Run("a client entry overrides its tier field by field, a zero lifting the tier's bound", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(lifecycleTiers), withEnv(tiersEnv()))
		c := f.resolver.Resolve(ctx, "globex")
		want := space.Lifecycle{MaxLifetime: day, IdleTimeout: 30 * time.Minute, IdleAction: space.IdlePause,
			PausedRetention: 7 * day, PausedSandboxes: 0}
		wantFrom := [5]space.RateSource{space.SourceTier, space.SourceClient, space.SourceTier, space.SourceTier, space.SourceClient}
		if c.Lifecycle != want || lifecycleSources(c) != wantFrom {
			t.Fatalf("globex = %+v from %v, want %+v from %v", c.Lifecycle, lifecycleSources(c), want, wantFrom)
		}
		c = f.resolver.Resolve(ctx, "hooli")
		want = space.Lifecycle{MaxLifetime: 0, IdleTimeout: 5 * time.Minute, IdleAction: space.IdlePause, PausedSandboxes: 2}
		wantFrom = [5]space.RateSource{space.SourceClient, space.SourceTier, space.SourceClient, SourceEnv, space.SourceTier}
		if c.Lifecycle != want || lifecycleSources(c) != wantFrom {
			t.Fatalf("hooli = %+v from %v, want %+v from %v", c.Lifecycle, lifecycleSources(c), want, wantFrom)
		}
	})

	t.Run("a client whose tier cannot be resolved gets the floor tier's lifecycle, from the fallback", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(lifecycleTiers), withEnv(tiersEnv()))
		c := f.resolver.Resolve(ctx, "initech")
		want := space.Lifecycle{MaxLifetime: time.Hour, IdleTimeout: 5 * time.Minute, IdleAction: space.IdleTerminate, PausedSandboxes: 2}
		wantFrom := [5]space.RateSource{space.SourceFallback, space.SourceFallback, space.SourceFallback, SourceEnv, space.SourceFallback}
		if c.Tier != "free" || c.Lifecycle != want || lifecycleSources(c) != wantFrom {
			t.Fatalf("initech on %q = %+v from %v, want free's %+v from %v", c.Tier, c.Lifecycle, lifecycleSources(c), want, wantFrom)
		}
	})

	t.Run("with nothing set the lifecycle bounds nothing, every field from env", func(t *testing.T) {
		t.Parallel()
		for name, quota := range map[string]string{
			"no tier table":              `{"clients": {"acme": {"concurrency": 3}}}`,
			"a tier without a lifecycle": threeTiers,
		} {
			f := setup(t, quotaFile(quota), withEnv(tiersEnv()))
			for _, id := range []space.ClientID{"acme", "someone"} {
				c := f.resolver.Resolve(ctx, id)
				if c.Lifecycle != (space.Lifecycle{}) || lifecycleSources(c) != allFrom(SourceEnv) {
					t.Errorf("%s: %s = %+v from %v, want the zero lifecycle from env", name, id, c.Lifecycle, lifecycleSources(c))
				}
			}
		}
	})

	t.Run("an idle timeout with no idle action pauses, the built-in default", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(`{"clients": {"acme": {"idle_timeout_seconds": 60}}}`))
		c := f.resolver.Resolve(ctx, "acme")
		if c.Lifecycle.IdleTimeout != time.Minute || c.Lifecycle.IdleAction != space.IdlePause ||
			c.Sources.IdleTimeout != space.SourceClient || c.Sources.IdleAction != SourceEnv {
			t.Fatalf("acme = %+v (idle timeout from %s, action from %s)", c.Lifecycle, c.Sources.IdleTimeout, c.Sources.IdleAction)
		}
	})

	t.Run("GET /v1/tiers' rows carry each tier's lifecycle, as a client on it with no entry of its own gets it", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(lifecycleTiers), withEnv(tiersEnv()))
		rows := map[string]space.Caller{}
		for _, c := range f.resolver.Tiers(ctx).Tiers {
			rows[c.Tier] = c
		}
		acme := f.resolver.Resolve(ctx, "acme")
		if pro := rows["pro"]; pro.Lifecycle != acme.Lifecycle || pro.Sources != acme.Sources {
			t.Fatalf("pro's row %+v (%+v) differs from acme's %+v (%+v)", pro.Lifecycle, pro.Sources, acme.Lifecycle, acme.Sources)
		}
		if free := rows["free"]; free.Lifecycle.IdleAction != space.IdleTerminate || free.Lifecycle.MaxLifetime != time.Hour {
			t.Fatalf("free's row = %+v", free.Lifecycle)
		}
	})

	t.Run("a reload that changes a tier's lifecycle applies to the next resolution", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(lifecycleTiers), withEnv(tiersEnv()))
		if c := f.resolver.Resolve(ctx, "acme"); c.Lifecycle.IdleTimeout != 15*time.Minute {
			t.Fatalf("acme's idle timeout = %v", c.Lifecycle.IdleTimeout)
		}
		f.update(strings.Replace(lifecycleTiers, `"idle_timeout_seconds": 900`, `"idle_timeout_seconds": 120`, 1))
		if c := f.resolver.Resolve(ctx, "acme"); c.Lifecycle.IdleTimeout != 2*time.Minute {
			t.Fatalf("after the reload acme's idle timeout = %v, want 2m", c.Lifecycle.IdleTimeout)
		}
	})
}

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

	t.Run("a flags file with a malformed lifecycle field is refused at reload, naming it, and the last good one stays", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(lifecycleTiers), withEnv(tiersEnv()))
		f.writeAtomic(quotaFile(strings.Replace(lifecycleTiers, `"idle_action": "pause"`, `"idle_action": "hibernate"`, 1)))
		r := f.waitFailed()
		if !strings.Contains(r.Err.Error(), "tiers.pro") || !strings.Contains(r.Err.Error(), "idle_action") {
			t.Fatalf("the refusal %q names neither the tier nor the field", r.Err)
		}
		if c := f.resolver.Resolve(context.Background(), "acme"); c.Lifecycle.IdleAction != space.IdlePause || c.Lifecycle.MaxLifetime != 24*time.Hour {
			t.Fatalf("after the refused reload acme = %+v, want the last good pro lifecycle", c.Lifecycle)
		}
	})
}

func TestLifecycleWarnings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("a bound another always beats is reported to the caller, whichever layer set each", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(`{
		  "tiers": {"free": {"max_lifetime_seconds": 3600, "idle_timeout_seconds": 600}},
		  "clients": {
		    "acme":    {"tier": "free", "idle_timeout_seconds": 3600},
		    "globex":  {"tier": "free", "paused_retention_seconds": 7200},
		    "initech": {"tier": "free", "idle_timeout_seconds": 0, "idle_action": "terminate"},
		    "hooli":   {"tier": "free"}
		  }}`), withEnv(tiersEnv()))
		for id, want := range map[space.ClientID]string{
			"acme":    "idle_timeout_seconds (3600) is not below max_lifetime_seconds (3600): the max lifetime ends every sandbox before its idle action (pause) can come",
			"initech": "idle_action (terminate) is set without an idle_timeout_seconds, so no sandbox is ever idle and it is never taken",
		} {
			c := f.resolver.Resolve(ctx, id)
			if len(c.Warnings) != 1 || c.Warnings[0] != want {
				t.Errorf("%s: warnings %q, want %q", id, c.Warnings, want)
			}
		}
		for _, id := range []space.ClientID{"globex", "hooli"} {
			// A retention past the max lifetime is one a client lifting the lifetime
			// keeps: not a mistake.
			if c := f.resolver.Resolve(ctx, id); len(c.Warnings) != 0 {
				t.Errorf("%s: warnings %q, want none", id, c.Warnings)
			}
		}
		// Still in force: a warning changes nothing of what applies.
		if c := f.resolver.Resolve(ctx, "acme"); c.Lifecycle.IdleTimeout != time.Hour || c.Lifecycle.MaxLifetime != time.Hour {
			t.Errorf("acme = %+v", c.Lifecycle)
		}
	})

	t.Run("the table's mistakes are logged when it is loaded, each naming the tier or the entry once", func(t *testing.T) {
		t.Parallel()
		quota := `{
		  "tiers": {"free": {"max_lifetime_seconds": 600, "idle_timeout_seconds": 600}, "pro": {"max_lifetime_seconds": 86400}},
		  "clients": {
		    "acme":   {"tier": "pro", "idle_timeout_seconds": 90000},
		    "globex": {"tier": "free", "idle_action": "terminate"},
		    "hooli":  {"tier": "pro", "idle_timeout_seconds": 60},
		    "umbrella": {"idle_action": "terminate"}
		  }}`
		q, err := ParseQuotas(decode(t, quota))
		if err != nil {
			t.Fatal(err)
		}
		_, warnings, err := inForce(q, tiersEnv())
		if err != nil {
			t.Fatal(err)
		}
		want := []string{
			"tiers.free: idle_timeout_seconds (600) is not below max_lifetime_seconds (600): the max lifetime ends every sandbox before its idle action (pause) can come",
			"clients.acme: idle_timeout_seconds (90000) is not below max_lifetime_seconds (86400): the max lifetime ends every sandbox before its idle action (pause) can come",
			// globex's own idle action does not mend free's, and free's is said once, of
			// free; hooli's is sound; umbrella's tier is known only when it is resolved.
			"clients.globex: idle_timeout_seconds (600) is not below max_lifetime_seconds (600): the max lifetime ends every sandbox before its idle action (terminate) can come",
		}
		var got []string
		for _, w := range warnings {
			if strings.Contains(w, "_seconds") || strings.Contains(w, "idle_action") {
				got = append(got, w)
			}
		}
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Fatalf("warnings:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		f := setup(t, quotaFile(quota), withEnv(tiersEnv()))
		f.resolver.Resolve(ctx, "acme")
		if n := f.logs.count(slog.LevelWarn, "quota flag: "+want[0], map[string]string{"flag": QuotaFlag}); n != 1 {
			t.Fatalf("the tier's mistake was logged %d times, want once", n)
		}
	})

	t.Run("without a tier table each entry's mistakes are logged when it is loaded", func(t *testing.T) {
		t.Parallel()
		q, err := ParseQuotas(decode(t, `{"clients": {"acme": {"idle_action": "pause"}, "globex": {"idle_timeout_seconds": 60}}}`))
		if err != nil {
			t.Fatal(err)
		}
		_, warnings, err := inForce(q, defaultEnv())
		want := "clients.acme: idle_action (pause) is set without an idle_timeout_seconds, so no sandbox is ever idle and it is never taken"
		if err != nil || len(warnings) != 1 || warnings[0] != want {
			t.Fatalf("warnings %q (%v), want %q", warnings, err, want)
		}
	})
}

// TestTheTiersPageExample loads the tier table of docs/tiers.md, so that the example an
// operator copies is one the flag accepts, with the lifecycle the page says and no
// warning about it.
func TestTheTiersPageExample(t *testing.T) {
	t.Parallel()
	page, err := os.ReadFile("../../docs/tiers.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(page), "```json\n")
	example, _, closed := strings.Cut(rest, "```")
	if !ok || !closed {
		t.Fatal("docs/tiers.md has no JSON example")
	}
	// The page's layout: cluster 100/s with a burst of 200, free the floor.
	env := Env{AdmissionEnabled: true, Cluster: space.Rate{RefillRPS: 100, Burst: 200}, FallbackTier: "free"}
	q, err := ParseQuotas(decode(t, example))
	if err != nil {
		t.Fatalf("the page's example is refused: %v", err)
	}
	if _, warnings, err := inForce(q, env); err != nil || len(warnings) != 0 {
		t.Fatalf("the page's example: %v, warnings %q", err, warnings)
	}
	f := setup(t, quotaFile(example), withEnv(env))
	c := f.resolver.Resolve(context.Background(), "initech")
	want := space.Lifecycle{IdleTimeout: time.Hour, IdleAction: space.IdlePause, PausedRetention: 7 * 24 * time.Hour, PausedSandboxes: 100}
	if c.Lifecycle != want || c.Sources.MaxLifetime != space.SourceClient || c.Sources.IdleAction != space.SourceTier || len(c.Warnings) != 0 {
		t.Fatalf("initech = %+v from %+v, warnings %q; want %+v as the page says", c.Lifecycle, c.Sources, c.Warnings, want)
	}
}
