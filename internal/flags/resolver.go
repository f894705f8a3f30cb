package flags

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/open-feature/go-sdk/openfeature"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/logs"
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
}

// Resolver turns an authenticated client id into its space.Caller: its budget key and
// every limit on it, by one evaluation of the quota flag per request or job, so that a
// flag change applies to the next one. It is safe for concurrent use.
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

	seen atomic.Pointer[parsedQuotas] // the last value the provider returned, parsed
	good atomic.Pointer[parsedQuotas] // the last good value; never nil
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
}

var noQuotas = &parsedQuotas{q: Quotas{Clients: map[space.ClientKey]ClientQuota{}, Rates: map[space.ClientKey]RateEntry{}}}

// NewResolver returns a Resolver. Env.ClientRate is copied: a later change to the
// caller's value does not reach the Resolver.
func NewResolver(opts ResolverOptions) *Resolver {
	r := &Resolver{
		client:  opts.Client,
		env:     opts.Env,
		log:     opts.Logger,
		metrics: newResolverMetrics(opts.Registerer),
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
	return r
}

// Resolve returns the caller of the authenticated client id: the id itself, which owns
// what the caller creates, and its budget key with every limit on it. The budget key is
// the id when the id is on the allowlist and space.Unknown otherwise; no other string
// is ever returned as a key. It is the hot path: one flag evaluation, no parse unless
// the flag changed.
//
// A queued operation's or a sandbox owner's id is resolved the same way when the work
// runs: an id that has left the allowlist since is charged and capped as
// space.Unknown from then on, while still owning its sandboxes.
func (r *Resolver) Resolve(ctx context.Context, id space.ClientID) space.Caller {
	p := r.quotas(ctx, id)
	key := space.Unknown
	if id != "" && len(id) <= p.maxKeyLen {
		if _, ok := p.q.Clients[space.ClientKey(id)]; ok {
			key = space.ClientKey(id)
		}
	}
	c := r.limits(p.q, key)
	c.ID = id
	return c
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

// limits layers the flag over the env for one budget key.
func (r *Resolver) limits(q Quotas, key space.ClientKey) space.Caller {
	entry, listed := q.Clients[key]
	l := space.Caller{
		Key:              key,
		Allowlisted:      listed && key != space.Unknown,
		Concurrency:      r.env.Defaults.Concurrency,
		LiveSandboxes:    r.env.Defaults.LiveSandboxes,
		AdmissionEnabled: r.env.AdmissionEnabled,
		Cluster:          r.env.Cluster,
		RateSource:       SourceEnv,
	}
	overlay(&l, q.Default)
	if listed {
		overlay(&l, entry)
	}
	envRate := func() {
		if r.env.ClientRate != nil {
			rate := *r.env.ClientRate
			l.ClientRate = &rate
		}
	}
	rate, hasRate := q.Rates[key]
	switch {
	case !r.env.AdmissionEnabled || !hasRate:
		envRate()
	case rate.Malformed != nil:
		envRate()
		l.RateSource = SourceMalformedFallback
		r.metrics.rateFallback.WithLabelValues(string(key)).Inc()
		if r.warn("rate:" + string(key)) {
			r.log.Warn("quota flag: malformed rate entry, this key stays on the env client rate",
				"flag", QuotaFlag, "client", string(key), "error", rate.Malformed.Error(),
				"env_rate", rateString(r.env.ClientRate), "next_warning_in", WarnInterval.String())
		}
	case rate.Exempt:
		l.ClientExempt = true
		l.RateSource = SourceFlag
	default:
		c := *rate.Rate
		l.ClientRate = &c
		l.RateSource = SourceFlag
	}
	return l
}

func overlay(l *space.Caller, cq ClientQuota) {
	if cq.Concurrency != nil {
		l.Concurrency = *cq.Concurrency
	}
	if cq.LiveSandboxes != nil {
		l.LiveSandboxes = *cq.LiveSandboxes
	}
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
func (r *Resolver) quotas(ctx context.Context, id space.ClientID) *parsedQuotas {
	if r.client == nil {
		return noQuotas
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
		return noQuotas
	}
	if err != nil {
		r.metrics.evalError.Inc()
		if r.warn("evaluate") {
			r.log.Warn("quota flag: evaluation failed, using the last good value",
				"flag", QuotaFlag, "error", err.Error(), "next_warning_in", WarnInterval.String())
		}
		return r.good.Load()
	}
	p := r.parse(details.Value)
	if p.err != nil {
		r.metrics.malformed.Inc()
		if r.warn("malformed") {
			r.log.Warn("quota flag: the provider's value is malformed, using the last good value",
				"flag", QuotaFlag, "error", p.err.Error(), "next_warning_in", WarnInterval.String())
		}
		return r.good.Load()
	}
	r.keep(p)
	return p
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
func (r *Resolver) parse(v any) *parsedQuotas {
	id := identity(v)
	if id != nil {
		if s := r.seen.Load(); s != nil && s.id == id {
			return s
		}
	}
	p := &parsedQuotas{src: v, id: id}
	p.q, p.err = ParseQuotas(v)
	for key := range p.q.Clients {
		p.maxKeyLen = max(p.maxKeyLen, len(key))
	}
	if id != nil {
		r.seen.Store(p)
	}
	return p
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
