package flags

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/open-feature/go-sdk/openfeature"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/logs"
	"github.com/space-sandbox/space/internal/metric"
)

// WarnInterval is how often, at most, the Resolver logs the same warning: a malformed
// rate entry per key, or an unusable quota flag. A flood of requests must not become a
// flood of log lines.
const WarnInterval = time.Minute

// Rate sources, as GET /v1/limits reports them (see space.RateSource).
const (
	SourceEnv               = space.SourceEnv
	SourceFlag              = space.SourceFlag
	SourceMalformedFallback = space.SourceMalformedFallback
)

// Defaults are the caps of a client when neither its entry in the quota flag nor the
// flag's "default" sets them. Zero means no cap.
type Defaults struct {
	Concurrency   int
	LiveSandboxes int
}

// DefaultLimits returns the built-in caps: 10 requests in flight and 50 live sandboxes
// per client key. They are deliberately modest: an operator raises them for the
// clients it knows, in the flag, and unknown callers share one key.
func DefaultLimits() Defaults {
	return Defaults{Concurrency: 10, LiveSandboxes: 50}
}

// Env is what the environment configures, below the quota flag.
type Env struct {
	// AdmissionEnabled is SPACE_CLUSTER_ACTIVATION_ADMISSION_ENABLED. Off, the flag's
	// "rate" object is ignored (nothing is charged anyway).
	AdmissionEnabled bool
	// Cluster is the shared cluster activation rate.
	Cluster space.Rate
	// ClientRate is the rate of every client key unless the flag says otherwise; nil
	// means no client bucket (config.Admission.Client).
	ClientRate *space.Rate
	// Defaults are the caps below the flag. The zero value means DefaultLimits(); to
	// have no caps by default, say so in the flag's "default" (0 = no cap).
	Defaults Defaults
	// FallbackTier is SPACE_FALLBACK_TIER: the floor tier of every client whose tier
	// cannot be resolved. A quota flag with a tier table must name it among its tiers.
	FallbackTier string
	// OwnKeys is true when every authenticated client id is one an operator issued (an
	// API key's client, SPACE_AUTH_MODE=api_key): the set of ids is bounded by the key
	// table, so with a tier table loaded each may be a budget key of its own, on its
	// tier. Otherwise (X-Client-ID from a gateway, any string) only the ids the quota
	// flag names, or the tier flag's rules target, get one.
	OwnKeys bool
}

// ResolverOptions configures NewResolver.
type ResolverOptions struct {
	// Client evaluates the flags; nil means no flags at all: the env defaults apply to
	// everyone and nobody is allowlisted.
	Client *openfeature.Client
	// Env is the configuration below the flag.
	Env Env
	// Logger receives the rate-limited warnings; default slog.Default().
	Logger *slog.Logger
	// Now is the clock of the once-a-WarnInterval warnings; default time.Now.
	Now func() time.Time
	// Registerer registers the resolver's fallback counters; nil leaves them
	// unregistered.
	Registerer prometheus.Registerer
	// Version, when set, is the version of what Client's provider serves: a number that
	// changes once the provider serves new flags, and on which its answers alone depend
	// (FileProvider.Version). Resolve then keeps the caller it resolved for a client id
	// until the version changes, instead of evaluating the flags for every request. Nil
	// evaluates every time: a provider with targeting rules (flagd) may answer each id,
	// or each moment, differently.
	Version func() uint64
}

// maxCachedCallers bounds the callers a Resolver keeps per flags version: client ids in
// trusted_header mode are whatever a gateway sends, and a caller past the bound is
// resolved every time, as without a Version.
const maxCachedCallers = 4096

// Resolver turns an authenticated client id into its space.Caller: its budget key and
// every limit on it, by one evaluation of the quota flag per request or job, so that a
// flag change applies to the next one; with a provider that says when its flags change
// (ResolverOptions.Version, the file provider's), by one per id and change of the
// flags, which applies a change to the next request as well. It is safe for
// concurrent use.
//
// Parsing is not repeated per request: the parsed value is cached against the identity
// of the value the provider returned (the map's address, kept alive by the cache so it
// cannot be reused), and the file provider hands out the same map until the file
// changes. This relies on providers not modifying a value they have handed out, which
// concurrent evaluations require anyway. A provider that decodes a fresh value on every
// evaluation still works, at the cost of a parse per request.
//
// When the provider fails, or hands out a value that is not a valid quota flag, the
// Resolver keeps using the last good value (none before the first: env defaults,
// nobody allowlisted), logs at most once a WarnInterval and counts
// space_flags_quota_fallbacks_total. A flag that is not in the provider at all (absent
// or DISABLED) is not a failure: it means no allowlist and env defaults.
type Resolver struct {
	client   *openfeature.Client
	env      Env
	log      *slog.Logger
	warnings *logs.Throttle
	metrics  resolverMetrics

	seen    atomic.Pointer[parsedQuotas] // the last value the provider returned, parsed
	next    atomic.Pointer[parsedQuotas] // the last value Prepare parsed before it was served
	parsing sync.Mutex                   // held by the one goroutine parsing a new value
	good    atomic.Pointer[parsedQuotas] // the last good value; never nil

	version func() uint64
	cache   atomic.Pointer[callerCache] // the callers resolved under one flags version
}

// callerCache is the callers resolved under one version of the flags, by client id.
// Each request of an id is handed a copy, with rates of its own.
type callerCache struct {
	version uint64
	callers sync.Map // space.ClientID -> space.Caller
	size    atomic.Int64
}

// parsedQuotas is one quota flag value and what parsing it gave. Never modified once
// built.
type parsedQuotas struct {
	src any            // the provider's value, kept so that its address stays unique while cached
	id  unsafe.Pointer // the identity of src: its map's address; nil when src is not a map
	q   Quotas
	err error
	// maxKeyLen is the longest allowlisted key: a longer claimed id is not looked up.
	maxKeyLen int
	// reservations is the tier table's share-out of the cluster bucket; nil when no
	// tier reserves anything.
	reservations *space.Reservations
	// warnings are what the value holds that works but is likely a mistake (a client
	// naming a tier the table lacks, a tier nothing names), logged when it is first
	// seen.
	warnings []string
}

var noQuotas = &parsedQuotas{q: Quotas{Clients: map[space.ClientKey]*ClientQuota{}, Rates: map[space.ClientKey]RateEntry{}, Tiers: map[string]Tier{}}}

// NewResolver returns a Resolver. Env.ClientRate is copied: a later change to the
// caller's value does not reach the Resolver.
func NewResolver(opts ResolverOptions) *Resolver {
	r := &Resolver{
		client:  opts.Client,
		env:     opts.Env,
		log:     opts.Logger,
		metrics: newResolverMetrics(opts.Registerer),
		version: opts.Version,
	}
	if r.env.ClientRate != nil {
		rate := *r.env.ClientRate
		r.env.ClientRate = &rate
	}
	if r.env.Defaults == (Defaults{}) {
		r.env.Defaults = DefaultLimits()
	}
	if r.log == nil {
		r.log = slog.Default()
	}
	r.warnings = logs.NewThrottle(WarnInterval, opts.Now)
	r.good.Store(noQuotas)
	if r.client != nil {
		// A provider that says its flags changed gets the quota flag parsed on the
		// event's goroutine, before requests meet it (see parse).
		refresh := func(d openfeature.EventDetails) {
			if len(d.FlagChanges) == 0 || slices.Contains(d.FlagChanges, QuotaFlag) {
				r.Refresh(context.Background())
			}
		}
		r.client.AddHandler(openfeature.ProviderConfigChange, &refresh)
	}
	metric.Register(opts.Registerer, reservedCollector{r})
	return r
}

// Resolve returns the caller of the authenticated client id: the id itself, which owns
// what the caller creates, and its budget key with every limit on it. It is the hot
// path: one evaluation of the quota flag (two when the client's tier comes from the
// tier flag), no parse unless the flag changed, no I/O of its own; with a Version, no
// evaluation either while the flags stay as they were for an id already resolved (a
// flooding client is refused without one).
//
// The budget key is the id when the quota flag's "clients" names it; with a tier table
// loaded, also when the id is bounded anyway (Env.OwnKeys) or the tier flag's rules
// target it. Otherwise it is space.Unknown, shared by every such caller; no other
// string is ever returned as a key. A queued operation's or a sandbox owner's id is
// resolved the same way when the work runs: an id that has left the allowlist since is
// charged and capped as space.Unknown from then on, while still owning its sandboxes.
//
// With a tier table, every key is on exactly one tier (see tierOf).
func (r *Resolver) Resolve(ctx context.Context, id space.ClientID) space.Caller {
	if r.version == nil {
		c, _ := r.resolve(ctx, id)
		return c
	}
	// The version is read before the flags: a caller kept under it was resolved from
	// flags no older than it, and the next version forgets it.
	v := r.version()
	cache := r.cache.Load()
	for cache == nil || cache.version < v {
		// Only a newer version replaces the cache: a request that read the version just
		// before a reload must not throw away what the requests after it keep.
		fresh := &callerCache{version: v}
		if r.cache.CompareAndSwap(cache, fresh) {
			cache = fresh
			break
		}
		cache = r.cache.Load()
	}
	if cache.version != v {
		// This request read the version before a reload the cache has seen: resolved
		// from the flags as they are, and not kept.
		c, _ := r.resolve(ctx, id)
		return c
	}
	if c, ok := cache.callers.Load(id); ok {
		return own(c.(space.Caller))
	}
	c, keep := r.resolve(ctx, id)
	if keep && cache.size.Add(1) <= maxCachedCallers {
		cache.callers.Store(id, c)
		return own(c)
	}
	return c
}

// own is c with rates and warnings of its own, as a resolution hands them out, so that
// no request can change another's.
func own(c space.Caller) space.Caller {
	c.ClientRate, c.SoftRate = copyRate(c.ClientRate), copyRate(c.SoftRate)
	if c.Warnings != nil {
		c.Warnings = slices.Clone(c.Warnings)
	}
	return c
}

// resolve is one resolution of id from the flags, and whether the caller may be kept
// for the flags' version: not when a fallback gave it (the last good quota flag after
// a failure, the floor tier for a tier that could not be resolved, the env rate for a
// malformed entry), which is counted, and maybe logged, at every resolution. A client
// no tier is assigned to is on the floor tier by design, and is kept.
func (r *Resolver) resolve(ctx context.Context, id space.ClientID) (space.Caller, bool) {
	p, fresh := r.quotas(ctx, id)
	key := space.Unknown
	if id != "" && len(id) <= p.maxKeyLen {
		if _, ok := p.q.Clients[space.ClientKey(id)]; ok {
			key = space.ClientKey(id)
		}
	}
	var t tierChoice
	if len(p.q.Tiers) > 0 {
		t = r.tierOf(ctx, p, id, key)
		if key == space.Unknown && id != "" && (r.env.OwnKeys || t.targeted) {
			key = space.ClientKey(id)
		}
	}
	c := r.limits(p, key, t)
	c.ID = id
	counted := t.source == space.TierFallback && t.reason != space.FallbackUnassigned
	return c, fresh && !counted && c.RateSource != SourceMalformedFallback
}

// tierChoice is the tier a key is on and how it was chosen.
type tierChoice struct {
	tier     *Tier
	source   space.TierSource
	reason   string // for a fallback
	targeted bool   // the tier flag's rules named this id
	warning  string
}

// tierOf resolves the tier of budget key (of client id), in this order:
//
//  1. the "tier" of the key's entry in "clients";
//  2. else the tier flag, evaluated with the client id as targetingKey;
//  3. else the floor tier, Env.FallbackTier.
//
// A tier name the table lacks, an evaluation error and a provider that is not ready
// all give the floor tier too, never space.Unknown's numbers (unless they are the
// floor's), never the highest tier, never no limit: failing open would hand out
// throughput nobody bought. Each such fall is counted by reason in
// space_tier_fallback_total and logged at most once a WarnInterval per reason.
func (r *Resolver) tierOf(ctx context.Context, p *parsedQuotas, id space.ClientID, key space.ClientKey) tierChoice {
	name, source := "", space.TierFromClient
	if entry := p.q.Clients[key]; entry != nil {
		name = entry.Tier
	}
	targeted := false
	if name == "" {
		source = space.TierFromFlag
		ec := openfeature.EvaluationContext{}
		if id != "" {
			ec = openfeature.NewEvaluationContext(string(id), nil)
		}
		details, err := r.client.StringValueDetails(ctx, TierFlag, "", ec)
		switch {
		case err != nil && details.ErrorCode == openfeature.FlagNotFoundCode, err == nil && details.Value == "":
			return r.fallback(p, space.FallbackUnassigned, "")
		case err != nil && details.ErrorCode == openfeature.ProviderNotReadyCode:
			return r.fallback(p, space.FallbackProviderNotReady, err.Error())
		case err != nil:
			return r.fallback(p, space.FallbackEvaluationError, err.Error())
		}
		name, targeted = details.Value, details.Reason == openfeature.TargetingMatchReason
	}
	t, ok := p.q.Tiers[name]
	if !ok {
		c := r.fallback(p, space.FallbackUnknownTier, fmt.Sprintf("tier %q (from the %s) is not in the tier table", truncate(name), sourceWords(source)))
		c.targeted = targeted
		return c
	}
	return tierChoice{tier: &t, source: source, targeted: targeted}
}

func sourceWords(s space.TierSource) string {
	if s == space.TierFromClient {
		return "client's entry"
	}
	return "flag " + TierFlag
}

// fallback is the floor tier, for reason; detail, when not empty, is logged (at most
// once a WarnInterval per reason) and reported to the caller as a warning.
func (r *Resolver) fallback(p *parsedQuotas, reason, detail string) tierChoice {
	c := tierChoice{source: space.TierFallback, reason: reason}
	if t, ok := p.q.Tiers[r.env.FallbackTier]; ok {
		c.tier = &t
	}
	if reason == space.FallbackUnassigned {
		return c
	}
	r.metrics.tierFallback.WithLabelValues(reason).Inc()
	c.warning = fmt.Sprintf("the tier could not be resolved (%s: %s), so the floor tier %q applies", reason, detail, r.env.FallbackTier)
	if r.warn("tier:" + reason) {
		r.log.Warn("tier fallback: the floor tier applies", "reason", reason, "detail", detail,
			"fallback_tier", r.env.FallbackTier, "next_warning_in", WarnInterval.String())
	}
	return c
}

// Reservations returns how the tier table in force shares the cluster bucket out (the
// last good quota flag's), nil when no tier reserves anything: for every charge to
// follow, a warm-up's included. It evaluates nothing.
func (r *Resolver) Reservations() *space.Reservations {
	return r.good.Load().reservations
}

// Tiers returns the tier table in force: empty when the quota flag has none.
func (r *Resolver) Tiers(ctx context.Context) TierTable {
	p, _ := r.quotas(ctx, "")
	out := TierTable{Reservations: p.reservations}
	if len(p.q.Tiers) == 0 {
		return out
	}
	out.Fallback = r.env.FallbackTier
	for _, name := range sortedKeys(p.q.Tiers) {
		t := p.q.Tiers[name]
		c := r.limits(p, "", tierChoice{tier: &t, source: space.TierFromClient})
		c.Key, c.Allowlisted = "", false
		out.Tiers = append(out.Tiers, c)
	}
	return out
}

// PoolTargets returns the warm pool targets of WarmPoolFlag. With no flags, or the flag
// absent or disabled, there are none (empty, no error). A provider failure or a
// malformed value is an error, for the pool to keep its current targets.
func (r *Resolver) PoolTargets(ctx context.Context) ([]PoolTarget, error) {
	if r.client == nil {
		return []PoolTarget{}, nil
	}
	details, err := r.client.ObjectValueDetails(ctx, WarmPoolFlag, nil, openfeature.EvaluationContext{})
	if (err != nil && details.ErrorCode == openfeature.FlagNotFoundCode) || (err == nil && details.Value == nil) {
		return []PoolTarget{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("evaluate flag %s: %w", WarmPoolFlag, err)
	}
	targets, err := ParsePoolTargets(details.Value)
	if err != nil {
		return nil, fmt.Errorf("flag %s: %w", WarmPoolFlag, err)
	}
	return targets, nil
}

// limits layers the flag over the env for one budget key on tier t, each value from
// the most specific place that sets it: the key's "rate" entry (its rate and burst),
// then the key's entry in "clients", then its tier, then the flag's "default", then
// the env and the built-in defaults. Caller.Sources says which gave each value.
func (r *Resolver) limits(p *parsedQuotas, key space.ClientKey, t tierChoice) space.Caller {
	q := p.q
	var entry ClientQuota
	e, listed := q.Clients[key]
	if listed {
		entry = *e
	}
	c := space.Caller{
		Key:              key,
		Allowlisted:      listed && key != space.Unknown,
		Concurrency:      r.env.Defaults.Concurrency,
		LiveSandboxes:    r.env.Defaults.LiveSandboxes,
		AdmissionEnabled: r.env.AdmissionEnabled,
		Cluster:          r.env.Cluster,
		QueueWeight:      1,
		Sources: space.Sources{ClientRate: SourceEnv, Concurrency: SourceEnv, LiveSandboxes: SourceEnv,
			MaxActivationCost: SourceEnv, SoftRate: SourceEnv, QueueWeight: SourceEnv,
			MaxLifetime: SourceEnv, IdleTimeout: SourceEnv, IdleAction: SourceEnv, PausedRetention: SourceEnv, PausedSandboxes: SourceEnv},
	}
	l := layered{caller: &c, rpsFrom: SourceEnv, burstFrom: SourceEnv}
	if r.env.ClientRate != nil {
		l.rps, l.burst = &r.env.ClientRate.RefillRPS, &r.env.ClientRate.Burst
	}
	l.apply(q.Default.Fields, space.SourceDefault)
	if t.tier != nil {
		source := space.SourceTier
		if t.source == space.TierFallback {
			source = space.SourceFallback
		}
		l.apply(t.tier.Fields, source)
		c.Tier = t.tier.Name
		c.Reservations = p.reservations
	}
	c.TierSource, c.FallbackReason = t.source, t.reason
	if t.warning != "" {
		c.Warnings = append(c.Warnings, t.warning)
	}
	if listed {
		l.apply(entry.Fields, space.SourceClient)
	}
	l.finish(r.env.ClientRate)
	c.Warnings = append(c.Warnings, lifecycleWarnings(c.Lifecycle)...)

	rate, hasRate := q.Rates[key]
	switch {
	case !r.env.AdmissionEnabled:
		// Nothing is charged: the rate in force is the env's, whatever the flag says.
		c.ClientRate, c.Sources.ClientRate = copyRate(r.env.ClientRate), SourceEnv
	case !hasRate:
	case rate.Malformed != nil:
		c.ClientRate, c.Sources.ClientRate = copyRate(r.env.ClientRate), SourceMalformedFallback
		c.Warnings = append(c.Warnings, "this client's entry in the quota flag's rate object is malformed; the env rate applies until it is fixed")
		r.metrics.rateFallback.WithLabelValues(string(key)).Inc()
		if r.warn("rate:" + string(key)) {
			r.log.Warn("quota flag: malformed rate entry, this key stays on the env client rate",
				"flag", QuotaFlag, "client", string(key), "error", rate.Malformed.Error(),
				"env_rate", rateString(r.env.ClientRate), "next_warning_in", WarnInterval.String())
		}
	case rate.Exempt:
		c.ClientRate, c.ClientExempt, c.Sources.ClientRate = nil, true, SourceFlag
	default:
		c.ClientRate, c.Sources.ClientRate = copyRate(rate.Rate), SourceFlag
	}
	c.RateSource = c.Sources.ClientRate
	if c.SoftRate != nil && (c.ClientRate == nil || c.SoftRate.RefillRPS > c.ClientRate.RefillRPS || c.SoftRate.Burst > c.ClientRate.Burst) {
		c.Warnings = append(c.Warnings, fmt.Sprintf("the soft limit (%s) does not lie within the client's hard rate (%s), so it is not applied",
			rateString(c.SoftRate), rateString(c.ClientRate)))
		c.SoftRate, c.Sources.SoftRate = nil, SourceEnv
	}
	return c
}

// layered is a Caller being built layer by layer. The two halves of a rate (refill and
// burst) are kept apart until every layer is applied, since a client entry may
// override one half of its tier's rate.
type layered struct {
	caller               *space.Caller
	rps, softRPS         *float64
	burst, softBurst     *int64
	rpsFrom, softFrom    space.RateSource
	burstFrom, softBFrom space.RateSource
}

// apply lays f over what is below it, field by field.
func (l *layered) apply(f Fields, source space.RateSource) {
	c := l.caller
	if f.RefillRPS != nil {
		l.rps, l.rpsFrom = f.RefillRPS, source
	}
	if f.Burst != nil {
		l.burst, l.burstFrom = f.Burst, source
	}
	if f.Concurrency != nil {
		c.Concurrency, c.Sources.Concurrency = *f.Concurrency, source
	}
	if f.LiveSandboxes != nil {
		c.LiveSandboxes, c.Sources.LiveSandboxes = *f.LiveSandboxes, source
	}
	if f.MaxActivationCost != nil {
		c.MaxActivationCost, c.Sources.MaxActivationCost = *f.MaxActivationCost, source
	}
	if f.QueueWeight != nil {
		c.QueueWeight, c.Sources.QueueWeight = *f.QueueWeight, source
	}
	if f.SoftRefillRPS != nil {
		l.softRPS, l.softFrom = f.SoftRefillRPS, source
	}
	if f.SoftBurst != nil {
		l.softBurst, l.softBFrom = f.SoftBurst, source
	}
	lc, s := &c.Lifecycle, &c.Sources
	if f.MaxLifetime != nil {
		lc.MaxLifetime, s.MaxLifetime = *f.MaxLifetime, source
	}
	if f.IdleTimeout != nil {
		lc.IdleTimeout, s.IdleTimeout = *f.IdleTimeout, source
	}
	if f.IdleAction != nil {
		lc.IdleAction, s.IdleAction = *f.IdleAction, source
	}
	if f.PausedRetention != nil {
		lc.PausedRetention, s.PausedRetention = *f.PausedRetention, source
	}
	if f.PausedSandboxes != nil {
		lc.PausedSandboxes, s.PausedSandboxes = *f.PausedSandboxes, source
	}
}

// finish joins the halves of the rates. A rate whose halves came from different layers
// is reported from the more specific one; a rate missing a half (a client overriding
// one half of a rate its tier does not have, with no env rate below) is not applied,
// with a warning, and the env rate stands. An idle timeout that no layer gave an idle
// action gets pause, the built-in default (its source stays env).
func (l *layered) finish(env *space.Rate) {
	c := l.caller
	switch {
	case l.rps != nil && l.burst != nil:
		rate := space.Rate{RefillRPS: *l.rps, Burst: *l.burst}
		if rate.Validate() == nil {
			c.ClientRate, c.Sources.ClientRate = &rate, moreSpecific(l.rpsFrom, l.burstFrom)
		}
	case l.rps != nil || l.burst != nil:
		c.ClientRate = copyRate(env)
		c.Warnings = append(c.Warnings, "the client's entry sets one half of a rate (refill_rps or burst) with nothing below to complete it, so the env rate applies")
	}
	switch {
	case l.softRPS != nil && l.softBurst != nil:
		rate := space.Rate{RefillRPS: *l.softRPS, Burst: *l.softBurst}
		if rate.Validate() == nil {
			c.SoftRate, c.Sources.SoftRate = &rate, moreSpecific(l.softFrom, l.softBFrom)
		}
	case l.softRPS != nil || l.softBurst != nil:
		c.Warnings = append(c.Warnings, "the client's entry sets one half of a soft limit (soft_refill_rps or soft_burst) with nothing below to complete it, so no soft limit applies")
	}
	if c.Lifecycle.IdleTimeout > 0 && c.Lifecycle.IdleAction == "" {
		c.Lifecycle.IdleAction = space.IdlePause
	}
}

// lifecycleWarnings are what a resolved lifecycle holds that works but is likely a
// mistake: an idle action that can never come. A paused retention past the max
// lifetime is not one: a tier may keep a retention for the clients whose entries lift
// its max lifetime (docs/tiers.md's pro tier does).
func lifecycleWarnings(lc space.Lifecycle) []string {
	var out []string
	if lc.MaxLifetime > 0 && lc.IdleTimeout >= lc.MaxLifetime {
		out = append(out, fmt.Sprintf("idle_timeout_seconds (%d) is not below max_lifetime_seconds (%d): the max lifetime ends every sandbox before its idle action (%s) can come",
			seconds(lc.IdleTimeout), seconds(lc.MaxLifetime), lc.IdleAction))
	}
	if lc.IdleTimeout == 0 && lc.IdleAction != "" {
		out = append(out, fmt.Sprintf("idle_action (%s) is set without an idle_timeout_seconds, so no sandbox is ever idle and it is never taken", lc.IdleAction))
	}
	return out
}

func seconds(d time.Duration) int64 { return int64(d / time.Second) }

// specificity orders the sources from the least specific to the most.
var specificity = map[space.RateSource]int{SourceEnv: 0, space.SourceDefault: 1, space.SourceFallback: 2, space.SourceTier: 2, space.SourceClient: 3, SourceFlag: 4}

func moreSpecific(a, b space.RateSource) space.RateSource {
	if specificity[b] > specificity[a] {
		return b
	}
	return a
}

func copyRate(r *space.Rate) *space.Rate {
	if r == nil {
		return nil
	}
	c := *r
	return &c
}

func rateString(r *space.Rate) string {
	if r == nil {
		return "none"
	}
	return fmt.Sprintf("%g/s burst %d", r.RefillRPS, r.Burst)
}

// quotas evaluates the quota flag once for client id and returns its parsed value, or
// the last good one. The id is the evaluation's targetingKey: the file provider serves
// one static value whoever asks, and a provider with targeting (flagd) can serve a
// client a variant of its own with no change here.
func (r *Resolver) quotas(ctx context.Context, id space.ClientID) (*parsedQuotas, bool) {
	if r.client == nil {
		return noQuotas, true
	}
	ec := openfeature.EvaluationContext{}
	if id != "" {
		ec = openfeature.NewEvaluationContext(string(id), nil)
	}
	details, err := r.client.ObjectValueDetails(ctx, QuotaFlag, nil, ec)
	if (err != nil && details.ErrorCode == openfeature.FlagNotFoundCode) || (err == nil && details.Value == nil) {
		// Absent, disabled, or a provider that has no value for it (the no-op provider):
		// no flag is not a failure.
		r.keep(noQuotas)
		return noQuotas, true
	}
	if err != nil {
		r.metrics.evalError.Inc()
		if r.warn("evaluate") {
			r.log.Warn("quota flag: evaluation failed, using the last good value",
				"flag", QuotaFlag, "error", err.Error(), "next_warning_in", WarnInterval.String())
		}
		return r.good.Load(), false
	}
	p, current := r.parse(details.Value)
	if p.err != nil {
		r.metrics.malformed.Inc()
		if r.warn("malformed") {
			r.log.Warn("quota flag: the provider's value is malformed, using the last good value",
				"flag", QuotaFlag, "error", p.err.Error(), "next_warning_in", WarnInterval.String())
		}
		return r.good.Load(), false
	}
	r.keep(p)
	return p, current
}

// Refresh evaluates the quota flag and parses its value now, so that no request has to:
// the Resolver calls it on a provider's configuration-changed event, on the event's
// goroutine, for a provider that cannot have its values prepared (Prepare) before it
// serves them. It is an optimisation only; a value nobody refreshed is parsed by the
// first request that meets it.
func (r *Resolver) Refresh(ctx context.Context) {
	r.quotas(ctx, "")
}

// keep makes p the last good value; the store is skipped when it already is, so that
// the hot path does not write a shared cache line per request.
func (r *Resolver) keep(p *parsedQuotas) {
	if r.good.Load() != p {
		r.good.Store(p)
	}
}

// parse returns the parsed form of v, from the cache when v is the value parsed last.
// The cache is what keeps a flag evaluation per request cheap: with the 200-client flag
// of BenchmarkResolveCachedParse a Resolve is about a hundred times faster, and
// allocates some 70 times less, than BenchmarkResolveParseEachTime's.
//
// A new value is parsed by one goroutine at a time (with 10,000 clients a parse takes
// tens of milliseconds; every request in flight parsing it at once would stall a
// replica for a second). While one does, the others are served the value parsed last,
// and told so (current false) so that nothing resolved from it is kept; only the very
// first parse is waited for. A value Prepare parsed before it was served is never
// parsed again: the file provider's reloads reach requests parsed.
func (r *Resolver) parse(v any) (p *parsedQuotas, current bool) {
	id := identity(v)
	if id != nil {
		if s := r.seen.Load(); s != nil && s.id == id {
			return s, true
		}
		if p := r.prepared(id); p != nil {
			return p, true
		}
		if !r.parsing.TryLock() {
			if s := r.seen.Load(); s != nil {
				return s, false
			}
			r.parsing.Lock()
		}
		defer r.parsing.Unlock()
		if s := r.seen.Load(); s != nil && s.id == id {
			return s, true
		}
		if p := r.prepared(id); p != nil {
			return p, true
		}
	}
	p = r.build(v, id)
	if id != nil {
		r.seen.Store(p)
	}
	return p, true
}

// prepared returns the value of identity id when Prepare parsed it before the provider
// served it, and makes it the value last met.
func (r *Resolver) prepared(id unsafe.Pointer) *parsedQuotas {
	if n := r.next.Load(); n != nil && n.id == id {
		r.seen.Store(n)
		return n
	}
	return nil
}

// build parses v, of identity id, and logs the warnings of its tier table.
func (r *Resolver) build(v any, id unsafe.Pointer) *parsedQuotas {
	p := &parsedQuotas{src: v, id: id}
	p.q, p.reservations, p.warnings, p.err = parseInForce(v, r.env)
	for _, w := range p.warnings {
		if r.warn("table:" + w) {
			r.log.Warn("quota flag: "+w, "flag", QuotaFlag)
		}
	}
	for key := range p.q.Clients {
		p.maxKeyLen = max(p.maxKeyLen, len(key))
	}
	return p
}

// Prepare parses value when key is the quota flag's, a value its provider is about to
// serve, so that no request has to: the requests that meet it find it parsed, and are
// never served the value parsed last because a parse of the new one is under way (see
// parse). FileProvider.Prepare takes it, and calls it on the reload's goroutine before
// the new file is put in service, so that the reload's signal (OnReload, a new
// Version) means the new limits are in service. Any other key, and a value that is not
// an object, is ignored; a value that never gets served only costs its parse.
func (r *Resolver) Prepare(key string, value any) {
	if key != QuotaFlag {
		return
	}
	id := identity(value)
	if id == nil {
		return
	}
	r.parsing.Lock()
	defer r.parsing.Unlock()
	r.next.Store(r.build(value, id))
}

// identity is the address of v's map, which names the value as long as it is alive; nil
// for anything else, which is then parsed every time (it is not a valid flag anyway).
// A map cannot be compared with ==, so its address, through reflect, is the cheap key
// (see parse for the benchmark that keeps the cache).
func identity(v any) unsafe.Pointer {
	if m, ok := v.(map[string]any); ok && m != nil {
		return reflect.ValueOf(m).UnsafePointer()
	}
	return nil
}

// warn reports whether the warning of key may be logged now: once a WarnInterval.
func (r *Resolver) warn(key string) bool {
	ok, _ := r.warnings.Allow(key)
	return ok
}
