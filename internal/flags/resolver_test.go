package flags

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/open-feature/go-sdk/openfeature"

	"github.com/space-sandbox/space"
)

const malformedRateWarning = "quota flag: malformed rate entry, this key stays on the env client rate"

// wantRate checks the client rate part of l: want nil means no client bucket.
func wantRate(t *testing.T, l space.Caller, want *space.Rate, exempt bool, source space.RateSource) {
	t.Helper()
	switch {
	case want == nil && l.ClientRate != nil:
		t.Errorf("%s: client rate = %+v, want no client bucket", l.Key, *l.ClientRate)
	case want != nil && (l.ClientRate == nil || *l.ClientRate != *want):
		t.Errorf("%s: client rate = %v, want %+v", l.Key, l.ClientRate, *want)
	}
	if l.ClientExempt != exempt {
		t.Errorf("%s: exempt = %v, want %v", l.Key, l.ClientExempt, exempt)
	}
	if l.RateSource != source {
		t.Errorf("%s: rate source = %q, want %q", l.Key, l.RateSource, source)
	}
}

func TestResolverRate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("a rate entry replaces the env client rate for its key", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(designExample))
		wantRate(t, f.resolver.Resolve(ctx, "acme"), &space.Rate{RefillRPS: 10, Burst: 40}, false, SourceFlag)
	})

	t.Run("a null rate exempts the key: no client bucket", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(designExample))
		wantRate(t, f.resolver.Resolve(ctx, "globex"), nil, true, SourceFlag)
	})

	t.Run("a malformed entry leaves only its key on the env rate, the others on their entries", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(`{
			"clients": {"acme": {}, "globex": {}, "initech": {}, "hooli": {}},
			"rate": {"acme": {"refill_rps": -1, "burst": 40}, "globex": {"refill_rps": 3, "burst": 1.5},
			         "initech": {"refill_rps": 7, "burst": 9}, "hooli": null}}`))
		wantRate(t, f.resolver.Resolve(ctx, "acme"), &envRate, false, SourceMalformedFallback)
		wantRate(t, f.resolver.Resolve(ctx, "globex"), &envRate, false, SourceMalformedFallback)
		wantRate(t, f.resolver.Resolve(ctx, "initech"), &space.Rate{RefillRPS: 7, Burst: 9}, false, SourceFlag)
		wantRate(t, f.resolver.Resolve(ctx, "hooli"), nil, true, SourceFlag)
		wantRate(t, f.resolver.Resolve(ctx, "someone"), &envRate, false, SourceEnv)
		if got := f.counter("space_flags_rate_entry_fallbacks_total", map[string]string{"client": "acme"}); got != 1 {
			t.Errorf("rate_entry_fallbacks_total{client=acme} = %g, want 1", got)
		}
	})

	t.Run("a malformed entry with no env rate leaves its key without a client bucket", func(t *testing.T) {
		t.Parallel()
		env := defaultEnv()
		env.ClientRate = nil
		f := setup(t, quotaFile(`{"clients": {"acme": {}}, "rate": {"acme": "fast"}}`), withEnv(env))
		wantRate(t, f.resolver.Resolve(ctx, "acme"), nil, false, SourceMalformedFallback)
	})

	t.Run("a rate entry does not allowlist its key", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(`{"clients": {"acme": {}}, "rate": {"initech": {"refill_rps": 50, "burst": 500}}}`))
		l := f.resolver.Resolve(ctx, "initech")
		if l.Key != space.Unknown || l.Allowlisted {
			t.Fatalf("initech resolved to %q (allowlisted %v), want unknown", l.Key, l.Allowlisted)
		}
		wantRate(t, l, &envRate, false, SourceEnv)
	})

	t.Run("disabled admission ignores rate", func(t *testing.T) {
		t.Parallel()
		env := defaultEnv()
		env.AdmissionEnabled = false
		f := setup(t, quotaFile(`{"clients": {"acme": {}, "globex": {}, "initech": {}},
			"rate": {"acme": {"refill_rps": 10, "burst": 40}, "globex": null, "initech": "bad", "unknown": null}}`), withEnv(env))
		for _, id := range []string{"acme", "globex", "initech", "someone"} {
			l := f.resolver.Resolve(ctx, space.ClientID(id))
			if l.AdmissionEnabled {
				t.Errorf("%s: admission enabled", id)
			}
			wantRate(t, l, &envRate, false, SourceEnv)
		}
		if n := f.logs.count(slog.LevelWarn, malformedRateWarning, nil); n != 0 {
			t.Errorf("%d warnings about an ignored entry, want 0", n)
		}
	})

	t.Run(`"unknown": null lifts the shared unknown rate`, func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(`{"clients": {"acme": {}}, "rate": {"unknown": null}}`))
		for _, id := range []string{"", "someone", "unknown"} {
			l := f.resolver.Resolve(ctx, space.ClientID(id))
			if l.Key != space.Unknown {
				t.Fatalf("%q resolved to %q", id, l.Key)
			}
			wantRate(t, l, nil, true, SourceFlag)
		}
		wantRate(t, f.resolver.Resolve(ctx, "acme"), &envRate, false, SourceEnv)
	})

	t.Run("a key without an entry stays on the env rate, or has no client bucket without one", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(`{"clients": {"acme": {}}}`))
		wantRate(t, f.resolver.Resolve(ctx, "acme"), &envRate, false, SourceEnv)
		env := defaultEnv()
		env.ClientRate = nil
		g := setup(t, quotaFile(`{"clients": {"acme": {}}}`), withEnv(env))
		wantRate(t, g.resolver.Resolve(ctx, "acme"), nil, false, SourceEnv)
	})

	t.Run("the rate handed out is the caller's own copy", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(goodQuota))
		l := f.resolver.Resolve(ctx, "acme")
		l.ClientRate.Burst = 1
		u := f.resolver.Resolve(ctx, "someone")
		u.ClientRate.Burst = 1
		wantRate(t, f.resolver.Resolve(ctx, "acme"), &space.Rate{RefillRPS: 10, Burst: 40}, false, SourceFlag)
		wantRate(t, f.resolver.Resolve(ctx, "someone"), &envRate, false, SourceEnv)
	})

	t.Run("the cluster rate is the env's", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(designExample))
		if l := f.resolver.Resolve(ctx, "acme"); l.Cluster != defaultEnv().Cluster || !l.AdmissionEnabled {
			t.Errorf("got %+v", l)
		}
	})
}

func TestResolverCaps(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	caps := func(t *testing.T, l space.Caller, concurrency, live int) {
		t.Helper()
		if l.Concurrency != concurrency || l.LiveSandboxes != live {
			t.Errorf("%s: caps = %d/%d, want %d/%d", l.Key, l.Concurrency, l.LiveSandboxes, concurrency, live)
		}
	}

	t.Run("a client entry overrides the flag's default field by field", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(`{"clients": {"acme": {"concurrency": 20}, "globex": {"live_sandboxes": 0}, "hooli": {}},
			"default": {"concurrency": 4, "live_sandboxes": 8}}`))
		caps(t, f.resolver.Resolve(ctx, "acme"), 20, 8)
		caps(t, f.resolver.Resolve(ctx, "globex"), 4, 0)
		caps(t, f.resolver.Resolve(ctx, "hooli"), 4, 8)
		caps(t, f.resolver.Resolve(ctx, "someone"), 4, 8)
	})

	t.Run("the built-in defaults apply where the flag says nothing", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(`{"clients": {"acme": {"live_sandboxes": 7}}, "default": {"concurrency": 3}}`))
		d := DefaultLimits()
		caps(t, f.resolver.Resolve(ctx, "acme"), 3, 7)
		caps(t, f.resolver.Resolve(ctx, "someone"), 3, d.LiveSandboxes)
	})

	t.Run("the env defaults replace the built-in ones", func(t *testing.T) {
		t.Parallel()
		env := defaultEnv()
		env.Defaults = Defaults{Concurrency: 1, LiveSandboxes: 2}
		f := setup(t, quotaFile(`{"clients": {"acme": {}}}`), withEnv(env))
		caps(t, f.resolver.Resolve(ctx, "acme"), 1, 2)
	})

	t.Run("the built-in defaults are 10 in flight and 50 live", func(t *testing.T) {
		t.Parallel()
		if d := DefaultLimits(); d != (Defaults{Concurrency: 10, LiveSandboxes: 50}) {
			t.Errorf("DefaultLimits() = %+v", d)
		}
	})

	t.Run("a clients entry for unknown sets the caps every unknown caller shares", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(`{"clients": {"unknown": {"concurrency": 2, "live_sandboxes": 3}}}`))
		l := f.resolver.Resolve(ctx, "someone")
		caps(t, l, 2, 3)
		if l.Key != space.Unknown || l.Allowlisted {
			t.Errorf("got %q allowlisted=%v, want unknown and not allowlisted", l.Key, l.Allowlisted)
		}
	})
}

func TestResolverAllowlist(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("an allowlisted X-Client-ID is honoured", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(designExample))
		for _, id := range []string{"acme", "globex"} {
			if l := f.resolver.Resolve(ctx, space.ClientID(id)); l.Key != space.ClientKey(id) || !l.Allowlisted {
				t.Errorf("%q resolved to %q (allowlisted %v)", id, l.Key, l.Allowlisted)
			}
		}
	})

	t.Run("any other X-Client-ID is unknown", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(designExample))
		for name, id := range map[string]string{
			"unallowlisted":         "initech",
			"empty":                 "",
			"huge":                  strings.Repeat("acme", 1<<18),
			"another case":          "ACME",
			"a prefix":              "acm",
			"with a trailing space": "acme ",
			"with a NUL":            "acme\x00",
			"unknown itself":        "unknown",
		} {
			l := f.resolver.Resolve(ctx, space.ClientID(id))
			if l.Key != space.Unknown || l.Allowlisted {
				t.Errorf("%s id resolved to %q (allowlisted %v), want unknown", name, l.Key, l.Allowlisted)
			}
		}
	})

	t.Run("without flags nobody is allowlisted and the env defaults apply", func(t *testing.T) {
		t.Parallel()
		r := NewResolver(ResolverOptions{Env: defaultEnv(), Logger: discardLogger()})
		l := r.Resolve(ctx, "acme")
		if l.Key != space.Unknown || l.Allowlisted {
			t.Errorf("acme resolved to %q without flags", l.Key)
		}
		wantRate(t, l, &envRate, false, SourceEnv)
		if d := DefaultLimits(); l.Concurrency != d.Concurrency || l.LiveSandboxes != d.LiveSandboxes {
			t.Errorf("caps = %d/%d, want the defaults", l.Concurrency, l.LiveSandboxes)
		}
	})

	t.Run("a file without the quota flag allowlists nobody", func(t *testing.T) {
		t.Parallel()
		f := setup(t, flagsFile(map[string]string{WarmPoolFlag: `{}`}))
		if l := f.resolver.Resolve(ctx, "acme"); l.Key != space.Unknown {
			t.Errorf("acme resolved to %q", l.Key)
		}
	})

	t.Run("a disabled quota flag allowlists nobody", func(t *testing.T) {
		t.Parallel()
		f := setup(t, strings.Replace(quotaFile(designExample), `"ENABLED"`, `"DISABLED"`, 1))
		if l := f.resolver.Resolve(ctx, "acme"); l.Key != space.Unknown {
			t.Errorf("acme resolved to %q", l.Key)
		}
	})
}

func TestResolverFlagChanges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("a flag change applies to the next request", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(`{"clients": {"acme": {}}}`))
		if l := f.resolver.Resolve(ctx, "globex"); l.Key != space.Unknown {
			t.Fatalf("globex allowlisted before the change")
		}
		f.update(`{"clients": {"acme": {}, "globex": {"concurrency": 3}}}`)
		if l := f.resolver.Resolve(ctx, "globex"); l.Key != "globex" || l.Concurrency != 3 {
			t.Errorf("after the change globex = %+v", l)
		}
		f.update(`{"clients": {"globex": {}}}`)
		if l := f.resolver.Resolve(ctx, "acme"); l.Key != space.Unknown {
			t.Errorf("acme still allowlisted after its removal")
		}
	})

	t.Run("the same value is parsed once, a new one again", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(designExample))
		f.resolver.Resolve(ctx, "acme")
		first := f.resolver.seen.Load()
		for range 10 {
			f.resolver.Resolve(ctx, "acme")
		}
		if f.resolver.seen.Load() != first {
			t.Fatal("the unchanged flag was parsed again")
		}
		f.update(goodQuota)
		f.resolver.Resolve(ctx, "acme")
		if f.resolver.seen.Load() == first {
			t.Fatal("the changed flag was not parsed")
		}
	})

	t.Run("another provider's garbage keeps the last good value", func(t *testing.T) {
		t.Parallel()
		stub := &stubProvider{}
		stub.set(decode(t, designExample))
		f := setup(t, quotaFile(`{}`), withProvider(stub))
		if l := f.resolver.Resolve(ctx, "acme"); l.Key != "acme" {
			t.Fatalf("acme = %q with a good value", l.Key)
		}
		for _, garbage := range []any{"garbage", []any{1.0}, decode(t, `{"clients": 5}`), decode(t, `{"clients": {"acme": {"concurrency": -1}}}`)} {
			stub.set(garbage)
			l := f.resolver.Resolve(ctx, "acme")
			if l.Key != "acme" || l.Concurrency != 20 {
				t.Errorf("with %v: acme = %+v, want the last good value", garbage, l)
			}
			wantRate(t, l, &space.Rate{RefillRPS: 10, Burst: 40}, false, SourceFlag)
		}
		if got := f.counter("space_flags_quota_fallbacks_total", map[string]string{"reason": "malformed"}); got != 4 {
			t.Errorf(`quota_fallbacks_total{reason="malformed"} = %g, want 4`, got)
		}
		msg := "quota flag: the provider's value is malformed, using the last good value"
		if n := f.logs.count(slog.LevelWarn, msg, nil); n != 1 {
			t.Errorf("%d warnings, want 1 a minute", n)
		}
	})

	t.Run("a provider error keeps the last good value, an absent flag drops it", func(t *testing.T) {
		t.Parallel()
		stub := &stubProvider{}
		stub.set(decode(t, designExample))
		f := setup(t, quotaFile(`{}`), withProvider(stub))
		f.resolver.Resolve(ctx, "acme")
		stub.fail(openfeature.NewGeneralResolutionError("backend unreachable"))
		if l := f.resolver.Resolve(ctx, "acme"); l.Key != "acme" {
			t.Errorf("acme = %q while the provider fails, want the last good value", l.Key)
		}
		if got := f.counter("space_flags_quota_fallbacks_total", map[string]string{"reason": "evaluation_error"}); got != 1 {
			t.Errorf(`quota_fallbacks_total{reason="evaluation_error"} = %g, want 1`, got)
		}
		stub.fail(openfeature.NewFlagNotFoundResolutionError("gone"))
		if l := f.resolver.Resolve(ctx, "acme"); l.Key != space.Unknown {
			t.Errorf("acme = %q once the flag is gone, want unknown", l.Key)
		}
	})

	t.Run("garbage before any good value means no allowlist", func(t *testing.T) {
		t.Parallel()
		stub := &stubProvider{}
		stub.set(42.0)
		f := setup(t, quotaFile(`{}`), withProvider(stub))
		l := f.resolver.Resolve(ctx, "acme")
		if l.Key != space.Unknown {
			t.Errorf("acme = %q", l.Key)
		}
		wantRate(t, l, &envRate, false, SourceEnv)
	})
}

func TestResolverWarnings(t *testing.T) {
	t.Parallel()

	t.Run("a malformed entry is logged once a minute per key under a flood of requests", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(`{"clients": {"acme": {}, "globex": {}},
			"rate": {"acme": {"refill_rps": "ten", "burst": 4}, "unknown": {"burst": 0}, "globex": {"refill_rps": 1, "burst": 1}}}`))
		flood := func() {
			const goroutines, perGoroutine = 50, 200 // 10,000 requests
			ids := []string{"acme", "someone", "globex", ""}
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Go(func() {
					for i := range perGoroutine {
						f.resolver.Resolve(context.Background(), space.ClientID(ids[(g+i)%len(ids)]))
					}
				})
			}
			wg.Wait()
		}
		warnings := func(key string) int {
			return f.logs.count(slog.LevelWarn, malformedRateWarning, map[string]string{"client": key})
		}
		check := func(when string, want int) {
			t.Helper()
			for _, key := range []string{"acme", "unknown"} {
				if got := warnings(key); got != want {
					t.Errorf("%s: %d warnings for %s, want %d", when, got, key, want)
				}
			}
			if got := warnings("globex"); got != 0 {
				t.Errorf("%s: %d warnings for the valid globex entry", when, got)
			}
		}
		flood()
		check("after the first flood", 1)
		f.clock.Advance(59 * time.Second)
		flood()
		check("59s later", 1)
		f.clock.Advance(time.Second)
		flood()
		check("a minute later", 2)
	})
}

func TestResolverIdentity(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("an allowlisted id is its own budget key and keeps its id", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(designExample))
		l := f.resolver.Resolve(ctx, "acme")
		if l.ID != "acme" || l.Key != "acme" || !l.Allowlisted || l.Concurrency != 20 || l.LiveSandboxes != 200 {
			t.Errorf("got %+v", l)
		}
		wantRate(t, l, &space.Rate{RefillRPS: 10, Burst: 40}, false, SourceFlag)
	})

	t.Run("two ids off the allowlist share the unknown budget key but keep their own ids", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(designExample))
		initech, hooli := f.resolver.Resolve(ctx, "initech"), f.resolver.Resolve(ctx, "hooli")
		if initech.Key != space.Unknown || hooli.Key != space.Unknown {
			t.Fatalf("budget keys %q and %q, want both unknown", initech.Key, hooli.Key)
		}
		if initech.ID != "initech" || hooli.ID != "hooli" {
			t.Fatalf("ids %q and %q, want each its own", initech.ID, hooli.ID)
		}
	})

	t.Run("an owner that left the allowlist is charged as unknown from then on", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(`{"clients": {"acme": {"concurrency": 7}}}`))
		if l := f.resolver.Resolve(ctx, "acme"); l.Key != "acme" || l.Concurrency != 7 {
			t.Fatalf("before: %+v", l)
		}
		f.update(`{"default": {"concurrency": 4, "live_sandboxes": 8}}`)
		l := f.resolver.Resolve(ctx, "acme")
		if l.ID != "acme" || l.Key != space.Unknown || l.Allowlisted || l.Concurrency != 4 || l.LiveSandboxes != 8 {
			t.Errorf("after: %+v, want id acme on the unknown key with the default caps", l)
		}
	})
}

func TestResolverPoolTargets(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("the pool targets come from the warm pool flag", func(t *testing.T) {
		t.Parallel()
		f := setup(t, flagsFile(map[string]string{WarmPoolFlag: poolExample}))
		got, err := f.resolver.PoolTargets(ctx)
		if err != nil || len(got) != 4 || got[0].Min != 5 || got[0].Max != 5 || got[0].Shape.Template != "python-3.12" {
			t.Errorf("got %+v, %v", got, err)
		}
	})

	t.Run("no pool flag is no targets and no error", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(`{}`))
		if got, err := f.resolver.PoolTargets(ctx); err != nil || got == nil || len(got) != 0 {
			t.Errorf("got %v, %v", got, err)
		}
		r := NewResolver(ResolverOptions{Logger: discardLogger()})
		if got, err := r.PoolTargets(ctx); err != nil || len(got) != 0 {
			t.Errorf("without flags: got %v, %v", got, err)
		}
	})

	t.Run("a malformed pool flag from another provider is an error", func(t *testing.T) {
		t.Parallel()
		stub := &stubProvider{}
		stub.set(decode(t, `{"shapes": "many"}`))
		f := setup(t, quotaFile(`{}`), withProvider(stub))
		if _, err := f.resolver.PoolTargets(ctx); err == nil || !strings.Contains(err.Error(), WarmPoolFlag) {
			t.Errorf("err = %v, want an error naming the flag", err)
		}
	})
}

// evaluations counts the flag evaluations of an OpenFeature client.
// evaluations counts the flag evaluations made for a client: the requests'. The
// Resolver's own evaluation when the provider says the flags changed (Refresh, no
// targeting key), which parses the new value before a request needs it, races the
// test's next request and is not one of them.
type evaluations struct {
	openfeature.UnimplementedHook
	n atomic.Int64
}

func (e *evaluations) Before(_ context.Context, hc openfeature.HookContext, _ openfeature.HookHints) (*openfeature.EvaluationContext, error) {
	if hc.EvaluationContext().TargetingKey() != "" {
		e.n.Add(1)
	}
	return nil, nil
}

func TestResolverKeepsCallersPerFlagsVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("an id resolved once is not evaluated again until the flags change, and the change applies to the next request", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(`{"clients": {"acme": {"concurrency": 3}}}`))
		count := &evaluations{}
		f.client.AddHooks(count)
		for range 10 {
			if c := f.resolver.Resolve(ctx, "acme"); c.Concurrency != 3 {
				t.Fatalf("acme = %+v", c)
			}
		}
		if n := count.n.Load(); n != 1 {
			t.Fatalf("%d evaluations for 10 requests of one id under one version, want 1", n)
		}
		f.update(`{"clients": {"acme": {"concurrency": 7}}}`)
		if c := f.resolver.Resolve(ctx, "acme"); c.Concurrency != 7 {
			t.Fatalf("after the change acme = %+v, want concurrency 7", c)
		}
		if n := count.n.Load(); n != 2 {
			t.Fatalf("%d evaluations, want 2: one more after the change", n)
		}
	})

	t.Run("a fallback is resolved and counted at every request", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(`{"tiers": {"free": {"refill_rps": 1, "burst": 5}}, "clients": {"acme": {"tier": "premium"}}}`), withEnv(tiersEnv()))
		for range 3 {
			if c := f.resolver.Resolve(ctx, "acme"); c.TierSource != space.TierFallback {
				t.Fatalf("acme = %+v", c)
			}
		}
		if n := f.counter("space_tier_fallback_total", map[string]string{"reason": "unknown_tier"}); n != 3 {
			t.Fatalf("fallbacks counted %v, want 3", n)
		}
	})

	t.Run("a client no tier is assigned to is kept like any other", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(`{"tiers": {"free": {"refill_rps": 1, "burst": 5}}, "clients": {"acme": {}}}`), withEnv(tiersEnv()))
		count := &evaluations{}
		f.client.AddHooks(count)
		for range 3 {
			f.resolver.Resolve(ctx, "acme")
		}
		if n := count.n.Load(); n != 2 { // the quota flag, then the tier flag, once
			t.Fatalf("%d evaluations, want the 2 of one resolution", n)
		}
	})

	t.Run("at most maxCachedCallers ids are kept; the others are resolved each time", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(`{"clients": {"acme": {}}}`))
		for i := range maxCachedCallers + 50 {
			f.resolver.Resolve(ctx, space.ClientID(fmt.Sprintf("id-%d", i)))
		}
		kept := 0
		f.resolver.cache.Load().callers.Range(func(any, any) bool { kept++; return true })
		if kept != maxCachedCallers {
			t.Fatalf("%d callers kept, want %d", kept, maxCachedCallers)
		}
		count := &evaluations{}
		f.client.AddHooks(count)
		if c := f.resolver.Resolve(ctx, space.ClientID(fmt.Sprintf("id-%d", maxCachedCallers+10))); c.Key != space.Unknown {
			t.Fatalf("an id past the bound = %+v", c)
		}
		if count.n.Load() != 1 {
			t.Fatal("an id past the bound was not evaluated")
		}
	})

	t.Run("a request that read the version before a reload keeps nothing and takes nothing away", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(`{"clients": {"acme": {}}}`))
		var version atomic.Uint64
		version.Store(2)
		f.resolver.version = version.Load
		f.resolver.Resolve(ctx, "acme")
		version.Store(1) // as read by a request that began before the reload
		if c := f.resolver.Resolve(ctx, "globex"); c.Key != space.Unknown {
			t.Fatalf("globex = %+v", c)
		}
		cache := f.resolver.cache.Load()
		if cache.version != 2 {
			t.Fatalf("the cache is of version %d, want 2: an older reader replaced it", cache.version)
		}
		if _, ok := cache.callers.Load(space.ClientID("acme")); !ok {
			t.Fatal("acme, resolved under version 2, is no longer kept")
		}
		if _, ok := cache.callers.Load(space.ClientID("globex")); ok {
			t.Fatal("globex, resolved by a reader of version 1, is kept under version 2")
		}
	})

	t.Run("without a version every request evaluates", func(t *testing.T) {
		t.Parallel()
		stub := &stubProvider{}
		stub.set(decode(t, designExample))
		f := setup(t, quotaFile(`{}`), withProvider(stub))
		count := &evaluations{}
		f.client.AddHooks(count)
		for range 5 {
			f.resolver.Resolve(ctx, "acme")
		}
		if n := count.n.Load(); n != 5 {
			t.Fatalf("%d evaluations for 5 requests, want 5", n)
		}
	})
}
