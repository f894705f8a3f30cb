package flags

import (
	"context"
	"errors"
	"log/slog"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/open-feature/go-sdk/openfeature"

	"github.com/space-sandbox/space"
)

// tiersEnv is defaultEnv with a floor tier.
func tiersEnv() Env {
	env := defaultEnv()
	env.FallbackTier = "free"
	return env
}

// threeTiers is a quota flag with three tiers of distinct numbers.
const threeTiers = `{
  "tiers": {
    "free":  {"refill_rps": 1, "burst": 5, "concurrency": 5, "live_sandboxes": 20},
    "pro":   {"refill_rps": 5, "burst": 20, "concurrency": 50, "live_sandboxes": 200, "max_activation_cost": 4},
    "scale": {"refill_rps": 20, "burst": 80, "concurrency": 200, "live_sandboxes": 1000}
  },
  "clients": {"acme": {"tier": "pro"}, "globex": {"tier": "free"}, "initech": {"tier": "scale", "concurrency": 7}},
  "default": {"concurrency": 10, "live_sandboxes": 50}
}`

func TestTiers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("each client gets exactly its tier's numbers, and where each came from", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(threeTiers), withEnv(tiersEnv()))
		for id, want := range map[space.ClientID]struct {
			tier       string
			rate       space.Rate
			conc, live int
			maxCost    int
			concFrom   space.RateSource
			tierFrom   space.TierSource
		}{
			"acme":    {"pro", space.Rate{RefillRPS: 5, Burst: 20}, 50, 200, 4, space.SourceTier, space.TierFromClient},
			"globex":  {"free", space.Rate{RefillRPS: 1, Burst: 5}, 5, 20, 0, space.SourceTier, space.TierFromClient},
			"initech": {"scale", space.Rate{RefillRPS: 20, Burst: 80}, 7, 1000, 0, space.SourceClient, space.TierFromClient},
		} {
			c := f.resolver.Resolve(ctx, id)
			if c.Key != space.ClientKey(id) || c.Tier != want.tier || c.TierSource != want.tierFrom || c.ClientRate == nil || *c.ClientRate != want.rate ||
				c.Concurrency != want.conc || c.LiveSandboxes != want.live || c.MaxActivationCost != want.maxCost ||
				c.Sources.ClientRate != space.SourceTier || c.Sources.Concurrency != want.concFrom || c.Sources.LiveSandboxes != space.SourceTier {
				t.Errorf("%s resolved to %+v", id, c)
			}
		}
	})

	t.Run("a client entry overriding one field keeps the tier's others, half a rate included", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(`{"tiers": {"free": {"refill_rps": 1, "burst": 5, "concurrency": 5, "live_sandboxes": 20}},
			"clients": {"acme": {"tier": "free", "burst": 9}}}`), withEnv(tiersEnv()))
		c := f.resolver.Resolve(ctx, "acme")
		if *c.ClientRate != (space.Rate{RefillRPS: 1, Burst: 9}) || c.Sources.ClientRate != space.SourceClient || c.Concurrency != 5 || c.LiveSandboxes != 20 {
			t.Fatalf("acme = rate %+v (from %s), caps %d/%d", *c.ClientRate, c.Sources.ClientRate, c.Concurrency, c.LiveSandboxes)
		}
	})

	t.Run("a rate entry still wins over the tier", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(`{"tiers": {"free": {"refill_rps": 1, "burst": 5}}, "clients": {"acme": {"tier": "free"}},
			"rate": {"acme": {"refill_rps": 3, "burst": 30}}}`), withEnv(tiersEnv()))
		if c := f.resolver.Resolve(ctx, "acme"); *c.ClientRate != (space.Rate{RefillRPS: 3, Burst: 30}) || c.Sources.ClientRate != SourceFlag {
			t.Fatalf("acme = %+v from %s", *c.ClientRate, c.Sources.ClientRate)
		}
	})

	t.Run("a client naming a tier the table lacks gets the floor, counted and reported", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(`{"tiers": {"free": {"refill_rps": 1, "burst": 5}, "pro": {"refill_rps": 9, "burst": 90}},
			"clients": {"acme": {"tier": "premium"}}}`), withEnv(tiersEnv()))
		c := f.resolver.Resolve(ctx, "acme")
		if c.Tier != "free" || c.TierSource != space.TierFallback || c.FallbackReason != space.FallbackUnknownTier ||
			*c.ClientRate != (space.Rate{RefillRPS: 1, Burst: 5}) || c.Sources.ClientRate != space.SourceFallback || len(c.Warnings) == 0 {
			t.Fatalf("acme = %+v", c)
		}
		if n := f.counter("space_tier_fallback_total", map[string]string{"reason": "unknown_tier"}); n != 1 {
			t.Fatalf("fallbacks counted %v, want 1", n)
		}
	})

	t.Run("a client nothing assigns is on the floor, and that is not counted as a fall", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(threeTiers), withEnv(tiersEnv()))
		c := f.resolver.Resolve(ctx, "umbrella")
		if c.Key != space.Unknown || c.Tier != "free" || c.TierSource != space.TierFallback || c.FallbackReason != space.FallbackUnassigned {
			t.Fatalf("umbrella = %+v", c)
		}
		for _, reason := range []string{"unknown_tier", "evaluation_error", "provider_not_ready"} {
			if n := f.counter("space_tier_fallback_total", map[string]string{"reason": reason}); n != 0 {
				t.Fatalf("fallbacks{%s} = %v, want none", reason, n)
			}
		}
	})

	t.Run("with API keys every client is a budget key of its own on its tier", func(t *testing.T) {
		t.Parallel()
		env := tiersEnv()
		env.OwnKeys = true
		f := setup(t, quotaFile(threeTiers), withEnv(env))
		if c := f.resolver.Resolve(ctx, "umbrella"); c.Key != "umbrella" || c.Allowlisted || c.Tier != "free" {
			t.Fatalf("umbrella = key %q allowlisted %v tier %q, want a key of its own on the floor", c.Key, c.Allowlisted, c.Tier)
		}
	})

	t.Run("without a tier table nothing changes: no tier, the env and the entry", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(`{"clients": {"acme": {"concurrency": 3}}}`), withEnv(tiersEnv()))
		c := f.resolver.Resolve(ctx, "acme")
		if c.Tier != "" || c.TierSource != "" || c.Concurrency != 3 || *c.ClientRate != envRate {
			t.Fatalf("acme = %+v", c)
		}
	})

	t.Run("a reload that renames a tier moves its clients in the next request; a malformed one keeps the last good table", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(threeTiers), withEnv(tiersEnv()))
		if c := f.resolver.Resolve(ctx, "acme"); c.Tier != "pro" {
			t.Fatalf("acme on %q", c.Tier)
		}
		f.update(strings.ReplaceAll(threeTiers, `"pro"`, `"business"`))
		if c := f.resolver.Resolve(ctx, "acme"); c.Tier != "business" || c.ClientRate.Burst != 20 {
			t.Fatalf("after the rename acme is on %q (%+v)", c.Tier, c.ClientRate)
		}
		bad := strings.Replace(threeTiers, `"burst": 80`, `"burst": 0`, 1)
		f.writeAtomic(quotaFile(bad))
		r := f.waitFailed()
		if !strings.Contains(r.Err.Error(), "tiers.scale") || !strings.Contains(r.Err.Error(), "burst") {
			t.Fatalf("the malformed reload's error %q names neither the tier nor the field", r.Err)
		}
		if c := f.resolver.Resolve(ctx, "acme"); c.Tier != "business" {
			t.Fatalf("after a malformed reload acme is on %q, want the last good table's business", c.Tier)
		}
	})

	t.Run("a table is refused without its floor tier, or when its reserves leave the cluster nothing to share", func(t *testing.T) {
		t.Parallel()
		for name, tc := range map[string]struct {
			quota, fallback, want string
		}{
			"no floor set":        {threeTiers, "", "SPACE_FALLBACK_TIER"},
			"a floor not in it":   {threeTiers, "hobby", `"hobby" is not in the tier table`},
			"over-reserved rates": {`{"tiers": {"free": {}, "pro": {"reserved_rps": 60, "reserved_burst": 10}, "scale": {"reserved_rps": 40, "reserved_burst": 10}}}`, "free", "tiers pro, scale reserve 100/s"},
			"over-reserved burst": {`{"tiers": {"free": {}, "pro": {"reserved_rps": 1, "reserved_burst": 200}}}`, "free", "tiers pro reserve"},
		} {
			env := defaultEnv()
			env.FallbackTier = tc.fallback
			q, err := ParseQuotas(decode(t, tc.quota))
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if _, _, err := inForce(q, env); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s: %v, want a refusal saying %q", name, err, tc.want)
			}
		}
	})

	t.Run("a malformed tier is refused naming the tier and the field", func(t *testing.T) {
		t.Parallel()
		for raw, want := range map[string]string{
			`{"tiers": {"pro": {"refill_rps": 5}}}`:                                                    "tiers.pro: malformed flag value: refill_rps and burst are set together",
			`{"tiers": {"pro": {"burst": 0, "refill_rps": 1}}}`:                                        "tiers.pro: malformed flag value: burst must be an integer >= 1",
			`{"tiers": {"pro": {"refill_rps": 1, "burst": 5, "soft_refill_rps": 2, "soft_burst": 3}}}`: "tiers.pro: malformed flag value: the soft limit",
			`{"tiers": {"pro": {"lendable": 0.5}}}`:                                                    "tiers.pro: malformed flag value: lendable says",
			`{"tiers": {"pro": {"reserved_rps": 1, "reserved_burst": 2, "lendable": 2}}}`:              "tiers.pro: malformed flag value: lendable must be a number from 0 to 1",
			`{"tiers": {"pro": {"reserved_rps": 0, "reserved_burst": 2}}}`:                             "tiers.pro: malformed flag value: reserved_rps must be a number > 0",
			`{"tiers": {"pro": {"queue_weight": 0}}}`:                                                  "tiers.pro: malformed flag value: queue_weight must be an integer from 1 to 64",
			`{"tiers": {"pro": {"queue_weight": 65}}}`:                                                 "tiers.pro: malformed flag value: queue_weight must be an integer from 1 to 64",
			`{"tiers": {"pro": {"queue_weight": 1.5}}}`:                                                "tiers.pro: malformed flag value: queue_weight must be an integer from 1 to 64",
			`{"tiers": {"pro": {"concurency": 5}}}`:                                                    `tiers.pro: malformed flag value: unknown field "concurency"`,
			`{"tiers": {"Pro": {}}}`:                                                                   "tiers.Pro: malformed flag value: a tier name is",
			`{"clients": {"acme": {"reserved_rps": 5}}}`:                                               `clients.acme: malformed flag value: unknown field "reserved_rps"`,
			`{"default": {"burst": 5}}`:                                                                `default: malformed flag value: unknown field "burst"`,
		} {
			if _, err := ParseQuotas(decode(t, raw)); err == nil || !strings.HasPrefix(err.Error(), want) {
				t.Errorf("%s: %v, want an error starting %q", raw, err, want)
			}
		}
	})

	t.Run("GET /v1/tiers' table is built by the same layering as a request", func(t *testing.T) {
		t.Parallel()
		f := setup(t, quotaFile(threeTiers), withEnv(tiersEnv()))
		table := f.resolver.Tiers(ctx)
		if table.Fallback != "free" || len(table.Tiers) != 3 {
			t.Fatalf("table = %+v", table)
		}
		byName := map[string]space.Caller{}
		for _, c := range table.Tiers {
			byName[c.Tier] = c
		}
		// A client on pro with no override of its own is served exactly pro's row.
		acme := f.resolver.Resolve(ctx, "acme")
		pro := byName["pro"]
		if *pro.ClientRate != *acme.ClientRate || pro.Concurrency != acme.Concurrency || pro.LiveSandboxes != acme.LiveSandboxes || pro.MaxActivationCost != acme.MaxActivationCost {
			t.Fatalf("pro's row %+v differs from acme's limits %+v", pro, acme)
		}
	})
}

// tierStub serves a tier flag answering per targeting key, or failing, beside the
// quota flag of a stubProvider.
type tierStub struct {
	*stubProvider
	tiers    map[string]string // by targeting key: a TARGETING_MATCH
	fallback string            // the flag's default variant for every other key
	failure  atomic.Pointer[openfeature.ResolutionError]
}

func (s *tierStub) StringEvaluation(_ context.Context, flag string, def string, ec openfeature.FlattenedContext) openfeature.StringResolutionDetail {
	if flag != TierFlag {
		return openfeature.StringResolutionDetail{Value: def, ProviderResolutionDetail: openfeature.ProviderResolutionDetail{
			ResolutionError: openfeature.NewFlagNotFoundResolutionError(flag), Reason: openfeature.ErrorReason}}
	}
	if e := s.failure.Load(); e != nil {
		return openfeature.StringResolutionDetail{Value: def, ProviderResolutionDetail: openfeature.ProviderResolutionDetail{ResolutionError: *e, Reason: openfeature.ErrorReason}}
	}
	key, _ := ec[openfeature.TargetingKey].(string)
	if v, ok := s.tiers[key]; ok {
		return openfeature.StringResolutionDetail{Value: v, ProviderResolutionDetail: openfeature.ProviderResolutionDetail{Reason: openfeature.TargetingMatchReason}}
	}
	return openfeature.StringResolutionDetail{Value: s.fallback, ProviderResolutionDetail: openfeature.ProviderResolutionDetail{Reason: openfeature.StaticReason}}
}

func TestTierFlag(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	stubbed := func(t *testing.T) (*fixture, *tierStub) {
		t.Helper()
		s := &tierStub{stubProvider: &stubProvider{}, tiers: map[string]string{"hooli": "scale", "legacy": "premium"}, fallback: "pro"}
		s.set(decode(t, threeTiers))
		return setup(t, quotaFile(`{}`), withEnv(tiersEnv()), withProvider(s)), s
	}

	t.Run("the tier flag assigns a tier by targeting key, and a targeted client gets a key of its own", func(t *testing.T) {
		t.Parallel()
		f, _ := stubbed(t)
		if c := f.resolver.Resolve(ctx, "hooli"); c.Key != "hooli" || c.Tier != "scale" || c.TierSource != space.TierFromFlag || c.ClientRate.Burst != 80 {
			t.Fatalf("hooli = %+v", c)
		}
		// The flag's default for everyone else puts them on pro, sharing unknown's bucket.
		if c := f.resolver.Resolve(ctx, "umbrella"); c.Key != space.Unknown || c.Tier != "pro" || c.TierSource != space.TierFromFlag {
			t.Fatalf("umbrella = %+v", c)
		}
		// A client entry's tier wins over the flag.
		if c := f.resolver.Resolve(ctx, "globex"); c.Tier != "free" || c.TierSource != space.TierFromClient {
			t.Fatalf("globex = %+v", c)
		}
	})

	t.Run("a flagged tier the table lacks gets the floor, counted", func(t *testing.T) {
		t.Parallel()
		f, _ := stubbed(t)
		if c := f.resolver.Resolve(ctx, "legacy"); c.Tier != "free" || c.FallbackReason != space.FallbackUnknownTier {
			t.Fatalf("legacy = %+v", c)
		}
		if n := f.counter("space_tier_fallback_total", map[string]string{"reason": "unknown_tier"}); n != 1 {
			t.Fatalf("fallbacks %v", n)
		}
	})

	for reason, failure := range map[string]openfeature.ResolutionError{
		space.FallbackEvaluationError:  openfeature.NewGeneralResolutionError("the provider broke"),
		space.FallbackProviderNotReady: openfeature.NewProviderNotReadyResolutionError("not yet"),
	} {
		t.Run("an evaluation that fails with "+reason+" gets the floor, never the highest tier nor no limit", func(t *testing.T) {
			t.Parallel()
			f, s := stubbed(t)
			s.failure.Store(&failure)
			c := f.resolver.Resolve(ctx, "hooli")
			if c.Tier != "free" || c.TierSource != space.TierFallback || c.FallbackReason != reason || c.ClientRate == nil || c.ClientRate.Burst != 5 {
				t.Fatalf("hooli = %+v", c)
			}
			if n := f.counter("space_tier_fallback_total", map[string]string{"reason": reason}); n != 1 {
				t.Fatalf("fallbacks{%s} = %v, want 1", reason, n)
			}
			// Logged once a minute at most, however many requests fall.
			for range 5 {
				f.resolver.Resolve(ctx, "hooli")
			}
			if n := f.logs.count(slog.LevelWarn, "tier fallback: the floor tier applies", map[string]string{"reason": reason}); n != 1 {
				t.Fatalf("logged %d times, want once", n)
			}
		})
	}
}

// TestEveryFieldIsDeclared holds Fields and fieldTable together: a field added to the
// struct without a declaration (so without a parser, a name and a layering) fails here.
func TestEveryFieldIsDeclared(t *testing.T) {
	t.Parallel()
	var f Fields
	declared := map[uintptr]string{}
	for _, d := range fieldTable {
		if d.of != nil {
			declared[reflect.ValueOf(d.of(&f)).Pointer()] = d.name
		}
	}
	v := reflect.ValueOf(&f).Elem()
	for i := range v.NumField() {
		if _, ok := declared[v.Field(i).Addr().Pointer()]; !ok {
			t.Errorf("Fields.%s has no entry in fieldTable", v.Type().Field(i).Name)
		}
	}
	var r reserveFields
	rv := reflect.ValueOf(&r).Elem()
	reserved := map[uintptr]bool{}
	for _, d := range fieldTable {
		if d.reserve != nil {
			reserved[reflect.ValueOf(d.reserve(&r)).Pointer()] = true
		}
	}
	for i := range rv.NumField() {
		if !reserved[rv.Field(i).Addr().Pointer()] {
			t.Errorf("reserveFields.%s has no entry in fieldTable", rv.Type().Field(i).Name)
		}
	}
}

// TestAFlagsFileWithEveryField parses, from a file on disk through the provider, a tier
// and a client entry that set every field, and checks that each one reaches the
// caller admission is given: a field dropped by the parser, by a key list or by a copy
// fails here.
func TestAFlagsFileWithEveryField(t *testing.T) {
	t.Parallel()
	quota := `{
	  "tiers": {
	    "free": {"refill_rps": 1, "burst": 5},
	    "pro": {"refill_rps": 5, "burst": 20, "concurrency": 50, "live_sandboxes": 200, "max_activation_cost": 4,
	            "soft_refill_rps": 3, "soft_burst": 10, "queue_weight": 4, "reserved_rps": 20, "reserved_burst": 40, "lendable": 0.25,
	            "max_lifetime_seconds": 86400, "idle_timeout_seconds": 900, "idle_action": "pause",
	            "paused_retention_seconds": 604800, "paused_sandboxes": 100}
	  },
	  "clients": {
	    "acme": {"tier": "pro"},
	    "globex": {"tier": "pro", "refill_rps": 6, "burst": 21, "concurrency": 51, "live_sandboxes": 201,
	               "max_activation_cost": 3, "soft_refill_rps": 2, "soft_burst": 9, "queue_weight": 2,
	               "max_lifetime_seconds": 3600, "idle_timeout_seconds": 60, "idle_action": "terminate",
	               "paused_retention_seconds": 120, "paused_sandboxes": 7}
	  }
	}`
	f := setup(t, quotaFile(quota), withEnv(tiersEnv()))
	ctx := context.Background()

	acme := f.resolver.Resolve(ctx, "acme")
	res, ok := acme.Reservations.Of("pro")
	if acme.Tier != "pro" || *acme.ClientRate != (space.Rate{RefillRPS: 5, Burst: 20}) || acme.Concurrency != 50 || acme.LiveSandboxes != 200 ||
		acme.MaxActivationCost != 4 || acme.QueueWeight != 4 || acme.SoftRate == nil || *acme.SoftRate != (space.Rate{RefillRPS: 3, Burst: 10}) ||
		!ok || res.Rate != (space.Rate{RefillRPS: 20, Burst: 40}) || res.Lendable != 0.25 ||
		acme.Lifecycle != (space.Lifecycle{MaxLifetime: 24 * time.Hour, IdleTimeout: 15 * time.Minute, IdleAction: space.IdlePause,
			PausedRetention: 7 * 24 * time.Hour, PausedSandboxes: 100}) {
		t.Fatalf("acme, on pro = %+v (reserve %+v)", acme, res)
	}
	if acme.Reservations.Shared != (space.Rate{RefillRPS: 80, Burst: 160}) || f.resolver.Reservations() != acme.Reservations {
		t.Fatalf("shared remainder %+v, resolver's reservations %p vs %p", acme.Reservations.Shared, f.resolver.Reservations(), acme.Reservations)
	}
	if got := f.counter("space_tier_reserved_rps", map[string]string{"tier": "pro"}); got != 20 {
		t.Fatalf("space_tier_reserved_rps{tier=pro} = %v, want the table's 20", got)
	}
	globex := f.resolver.Resolve(ctx, "globex")
	if *globex.ClientRate != (space.Rate{RefillRPS: 6, Burst: 21}) || globex.Concurrency != 51 || globex.LiveSandboxes != 201 ||
		globex.MaxActivationCost != 3 || globex.QueueWeight != 2 || *globex.SoftRate != (space.Rate{RefillRPS: 2, Burst: 9}) ||
		globex.Lifecycle != (space.Lifecycle{MaxLifetime: time.Hour, IdleTimeout: time.Minute, IdleAction: space.IdleTerminate,
			PausedRetention: 2 * time.Minute, PausedSandboxes: 7}) {
		t.Fatalf("globex, overriding every field = %+v", globex)
	}
	for name, got := range map[string]space.RateSource{"client_activation": globex.Sources.ClientRate, "concurrency": globex.Sources.Concurrency,
		"live_sandboxes": globex.Sources.LiveSandboxes, "max_activation_cost": globex.Sources.MaxActivationCost, "soft_limit": globex.Sources.SoftRate,
		"queue_weight": globex.Sources.QueueWeight, "max_lifetime_seconds": globex.Sources.MaxLifetime, "idle_timeout_seconds": globex.Sources.IdleTimeout,
		"idle_action": globex.Sources.IdleAction, "paused_retention_seconds": globex.Sources.PausedRetention,
		"paused_sandboxes": globex.Sources.PausedSandboxes} {
		if got != space.SourceClient {
			t.Errorf("globex's %s came from %s, want client", name, got)
		}
	}
	// Every field of the parsed tier is set: nothing was dropped on the way in.
	q, err := ParseQuotas(decode(t, quota))
	if err != nil {
		t.Fatal(err)
	}
	tier := reflect.ValueOf(q.Tiers["pro"].Fields)
	client := reflect.ValueOf(q.Clients["globex"].Fields)
	for i := range tier.NumField() {
		if tier.Field(i).IsNil() || client.Field(i).IsNil() {
			t.Errorf("Fields.%s did not come through the parser", tier.Type().Field(i).Name)
		}
	}
}
