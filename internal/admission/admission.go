// Package admission holds the activation budget (docs/design.md, admission buckets) and the per-client
// limits beside it, all in Redis so that every replica enforces the same numbers:
//
//   - Admitter charges the shared cluster activation bucket and the caller's client
//     activation bucket in one Lua script (bucket.lua): one token from each, or none.
//   - ConcurrencyLimiter caps a client's in-flight requests with leases that expire,
//     so a crashed replica's places come back.
//   - Limiter is one token bucket per arbitrary key on the same script, e.g. failed
//     authentications per source address.
//
// Time always comes from Redis TIME, never from a replica's clock.
package admission

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/logs"
	"github.com/space-sandbox/space/internal/metric"
)

// Options configures an Admitter.
type Options struct {
	// Redis is required: a standalone client or a cluster client. Build it with
	// ContextTimeoutEnabled so that a timed-out call also frees its connection at once;
	// without it the call still returns at the timeout, but go-redis holds the
	// connection until its own ReadTimeout.
	Redis redis.UniversalClient
	// Prefix namespaces the keys (required; SPACE_REDIS_KEY_PREFIX, "space" by default,
	// which gives exactly the keys of the design:
	// space:cluster_admission:sandbox_activation and its client keys). It must not
	// contain braces: the client keys use the cluster key as their Redis Cluster hash
	// tag.
	Prefix string
	// Enabled false admits everything and charges nothing, without a Redis call.
	Enabled bool
	// Cluster is the shared bucket every activation charges.
	Cluster space.Rate
	// FailClosed chooses what a Redis error or timeout does: false (the default)
	// admits ("fail open": an outage of the budget store must not stop activations),
	// true returns an error wrapping ErrUnavailable (503). Both are counted as
	// decision="error".
	FailClosed bool
	// Shadow decides and records but admits: a would-be rejection is counted as
	// shadow_rejected and admitted with Decision.Shadow set. A Redis error in shadow
	// mode admits too, whatever FailClosed says.
	Shadow bool
	// Timeout bounds each Redis call (required; SPACE_REDIS_TIMEOUT, 100ms by default):
	// an admission decision that cannot be made quickly is better failed open or
	// closed than waited for.
	Timeout time.Duration
	// Breaker, shared by a replica's Redis components, fails calls at once while Redis
	// is known to be down (see Breaker); nil calls Redis every time.
	Breaker *Breaker
	// Registerer receives the metrics; nil registers them nowhere.
	Registerer prometheus.Registerer
	// Logger receives Redis failures (at most one line per 10 s); nil discards.
	Logger *slog.Logger
	// Now is the replica's clock of the refusals it knows without Redis (CachedRefusal);
	// default time.Now. Bucket time itself is always Redis TIME.
	Now func() time.Time
	// RefusalMaxAge bounds how old what a replica learnt of a bucket may be and still
	// refuse from memory (SPACE_REFUSAL_CACHE_MAX_AGE): past it, the next charge asks
	// Redis again. Memory can only know a bucket as far as every writer of it is
	// another replica taking tokens; an operator who deletes the key to reset it, or
	// anything else that gives tokens back, is seen within this bound. Zero refuses
	// nothing from memory.
	RefusalMaxAge time.Duration
}

// Admitter decides activations against the cluster bucket and, when the caller has a
// rate of its own, its client bucket. It is safe for concurrent use; replicas sharing
// one Redis share its buckets.
//
// Each bucket is one Redis string (ClusterKey, ClientKey) holding its tokens and the
// Redis time they were counted at, as two little-endian doubles (bucket.lua says why
// binary). A bucket's key expires once the bucket could have refilled completely
// (burst/refill seconds, at most 10^12 s): a missing key is a full bucket, so idle
// clients cost no memory.
type Admitter struct {
	run        runner
	enabled    bool
	failClosed bool
	shadow     bool

	cluster     space.Rate
	clusterArgs bucketArgs
	clusterKey  string
	// clientPrefix is the client key without the client: "{<cluster key>}:client:".
	clientPrefix string

	metrics *admissionMetrics
	errLog  *throttledLog

	// known holds, per bucket, its state as this replica last learnt it from Redis, so
	// that CachedRefusal can refuse without asking. Keys are the cluster key
	// and bounded budget keys: the map is bounded by the allowlist.
	known  sync.Map // string (Redis key) -> *atomic.Pointer[knownBucket]
	now    func() time.Time
	maxAge time.Duration
}

// knownBucket is one bucket as a decision found it: at most Tokens at time At (the
// replica's clock before the decision was sent, so no later than Redis's), under Rate.
// Tokens only come back at Rate, and other replicas only take them, so Tokens plus the
// refill since At bounds the bucket from above for as long as the rate holds.
type knownBucket struct {
	Rate   space.Rate
	Tokens float64
	At     time.Time
}

// BucketState is one bucket's side of a decision.
type BucketState struct {
	Rate space.Rate
	// Remaining is the tokens left after the decision (fractional: the bucket refills
	// continuously).
	Remaining float64
	// Refill is the time until the bucket next holds a whole token, 0 when it holds
	// one now. A bucket that never refills reports the longest Duration.
	Refill time.Duration
}

// Decision is the outcome of one Admit or Peek. A rejection is a Decision with
// Admitted false, not an error.
type Decision struct {
	Admitted bool
	// Bucket is the bucket that rejected (or would have, in shadow mode):
	// client_activation when the client bucket was empty, whatever the cluster
	// bucket held; otherwise cluster_activation. Empty when admitted on its merits.
	Bucket space.Bucket
	// Cluster is the cluster bucket after the decision.
	Cluster BucketState
	// Client is the client bucket after the decision; nil when no client rate was
	// given (the decision ran on the cluster key alone).
	Client *BucketState
	// RetryAfter, on a rejection, is the refill of whichever empty bucket refills
	// last: the earliest moment a retry can succeed. Not jittered (see RetryAfter).
	RetryAfter time.Duration
	// Shadow is true when the decision rejected and shadow mode admitted anyway.
	Shadow bool
	// FailedOpen is true when Redis failed and fail-open mode admitted; the bucket
	// states are then unknown (zero Remaining).
	FailedOpen bool
}

// LimitError describes a rejection for the API (a 429): the rejecting bucket, its
// rate, what it held, and the retry delay. It returns nil for an admitted decision,
// including one admitted only by shadow mode, so that a caller may write
// `if le := d.LimitError(c); le != nil { return le }`.
func (d Decision) LimitError(client space.ClientKey) *space.LimitError {
	if d.Admitted || d.Bucket == "" {
		return nil
	}
	state := d.Cluster
	if d.Bucket == space.BucketClientActivation && d.Client != nil {
		state = *d.Client
	}
	limit := state.Rate
	return &space.LimitError{
		Bucket:     d.Bucket,
		Client:     client,
		RetryAfter: d.RetryAfter,
		Limit:      &limit,
		Remaining:  state.Remaining,
	}
}

// New returns an Admitter, or an error naming the option that is wrong.
func New(opts Options) (*Admitter, error) {
	if opts.Redis == nil {
		return nil, errors.New("admission: Redis is required")
	}
	prefix, err := checkPrefix(opts.Prefix)
	if err != nil {
		return nil, err
	}
	if err := checkTimeout("admission", opts.Timeout); err != nil {
		return nil, err
	}
	if opts.Enabled {
		if err := opts.Cluster.Validate(); err != nil {
			return nil, fmt.Errorf("admission: cluster rate: %w", err)
		}
	}
	metrics, err := newAdmissionMetrics(opts.Registerer)
	if err != nil {
		return nil, err
	}
	clusterKey := ClusterKey(prefix)
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	return &Admitter{
		now:          now,
		maxAge:       opts.RefusalMaxAge,
		run:          newRunner(opts.Redis, opts.Timeout, opts.Breaker),
		enabled:      opts.Enabled,
		failClosed:   opts.FailClosed,
		shadow:       opts.Shadow,
		cluster:      opts.Cluster,
		clusterArgs:  argsOf(opts.Cluster),
		clusterKey:   clusterKey,
		clientPrefix: "{" + clusterKey + "}:client:",
		metrics:      metrics,
		errLog:       newThrottledLog(opts.Logger, "admission: redis failed"),
	}, nil
}

func checkPrefix(prefix string) (string, error) {
	if prefix == "" {
		return "", errors.New("admission: Prefix is required")
	}
	if strings.ContainsAny(prefix, "{}") {
		return "", fmt.Errorf("admission: prefix %q must not contain braces: the cluster key is the client keys' hash tag", prefix)
	}
	return prefix, nil
}

// ClusterKey is the cluster bucket's key under prefix:
// "<prefix>:cluster_admission:sandbox_activation".
func ClusterKey(prefix string) string {
	return prefix + ":cluster_admission:sandbox_activation"
}

// ClientKey is client's bucket key under prefix:
// "{<prefix>:cluster_admission:sandbox_activation}:client:<client>". The braces make
// the whole cluster key the Redis Cluster hash tag, so both keys of a decision live in
// one slot and one script can hold both.
func ClientKey(prefix string, client space.ClientKey) string {
	return "{" + ClusterKey(prefix) + "}:client:" + string(client)
}

// Enabled reports whether activations are charged at all.
func (a *Admitter) Enabled() bool { return a.enabled }

// ClusterRate is the shared bucket's rate.
func (a *Admitter) ClusterRate() space.Rate { return a.cluster }

// Admit decides one activation: it takes one token from the cluster bucket and, when
// clientRate is not nil, one from client's bucket, both or neither. With clientRate
// nil (an exempt client, or the warm pool's replenisher with client "") only the
// cluster bucket is charged.
//
// It returns an error only for a bad argument or, in fail-closed mode, when Redis
// fails or does not answer within the timeout (an error wrapping ErrUnavailable).
func (a *Admitter) Admit(ctx context.Context, client space.ClientKey, clientRate *space.Rate) (Decision, error) {
	return a.admit(ctx, client, clientRate, 1)
}

// Charge is the activation flow's seam (space.Charger): cost tokens from the cluster
// bucket and, when rate is not nil, from key's bucket, all or none, decided by Redis.
// A refusal is a *space.LimitError; a Redis failure admits in fail-open mode and is an
// error wrapping ErrUnavailable in fail-closed mode. The flow asks CachedRefusal
// itself, once, before it gets here.
func (a *Admitter) Charge(ctx context.Context, c space.Charge) (space.Charged, error) {
	d, err := a.admit(ctx, c.Key, c.Rate, c.Cost)
	if err != nil {
		return space.Charged{}, err
	}
	if le := d.LimitError(c.Key); le != nil {
		return space.Charged{}, le
	}
	return space.Charged{}, nil
}

func (a *Admitter) admit(ctx context.Context, client space.ClientKey, clientRate *space.Rate, cost int) (Decision, error) {
	if !a.enabled {
		return a.disabled(clientRate), nil
	}
	if cost < 1 {
		return Decision{}, fmt.Errorf("admit: cost %d, want at least 1", cost)
	}
	keys, clientArgs, err := a.keys(client, clientRate)
	if err != nil {
		return Decision{}, fmt.Errorf("admit: %w", err)
	}
	sent := a.now()
	start := time.Now()
	admitted, states, err := a.run.decide(ctx, strconv.Itoa(cost), keys, a.clusterArgs, clientArgs)
	a.metrics.script.Observe(time.Since(start).Seconds())
	if err != nil {
		return a.failed(client, clientRate, err)
	}
	d := a.decision(admitted, states, clientRate)
	a.learn(keys, d, sent)
	switch {
	case d.Admitted:
		a.metrics.admitted(clientRate != nil)
	case a.shadow:
		a.metrics.count(decisionShadowRejected, d.Bucket)
		d.Admitted, d.Shadow = true, true
	default:
		a.metrics.count(decisionRejected, d.Bucket)
	}
	return d, nil
}

// CachedRefusal returns the refusal that an Admit of cost now would meet, when this replica
// knows it without asking Redis: a bucket that its last decision found too empty to
// hold cost tokens by now, even with every token refilled since and none taken. It
// answers from memory, in nanoseconds, so a client flooding over its rate costs no
// Redis call (envoyproxy/ratelimit's local cache of keys over the limit, with the
// time a key stays over it counted from the bucket's own refill).
//
// It only ever refuses; nil means "ask Redis" (Charge does). A bucket is known
// under the rate it was decided with: a flag that changes the client's rate, exempts
// it or moves it on or off the allowlist makes the entry not apply, so the next create
// is Redis's. The known tokens are an upper bound as long as other replicas only take
// tokens, so a refusal here is never wrong beyond the instant of the refill itself,
// and its Retry-After is counted from that refill. What gives tokens back (a key reset
// by hand) is seen once the entry is older than Options.RefusalMaxAge, when the next
// charge asks Redis and learns the bucket afresh. Nothing is refused in shadow mode or
// with admission disabled. A refusal is counted as Admit counts one.
func (a *Admitter) CachedRefusal(c space.Charge) *space.LimitError {
	if !a.enabled || a.shadow || a.maxAge <= 0 {
		return nil
	}
	key, rate, cost := c.Key, c.Rate, c.Cost
	now := a.now()
	var le *space.LimitError
	if rate != nil && key != "" {
		le = a.knownShort(a.clientPrefix+string(key), *rate, cost, now, space.BucketClientActivation, key)
	}
	if cluster := a.knownShort(a.clusterKey, a.cluster, cost, now, space.BucketClusterActivation, key); cluster != nil {
		if le == nil {
			le = cluster
		} else {
			// Both short: the client bucket is named, the retry waits for both.
			le.RetryAfter = max(le.RetryAfter, cluster.RetryAfter)
		}
	}
	if le != nil {
		a.metrics.count(decisionRejected, le.Bucket)
		a.metrics.local.WithLabelValues(string(le.Bucket)).Inc()
	}
	return le
}

// knownShort is the refusal of bucket key for cost at now, if its known state says it
// cannot hold cost tokens yet.
func (a *Admitter) knownShort(key string, rate space.Rate, cost int, now time.Time, bucket space.Bucket, client space.ClientKey) *space.LimitError {
	v, ok := a.known.Load(key)
	if !ok {
		return nil
	}
	k := v.(*atomic.Pointer[knownBucket]).Load()
	if k == nil || k.Rate != rate {
		return nil
	}
	age := now.Sub(k.At)
	if age > a.maxAge {
		return nil
	}
	tokens := k.Tokens
	if age > 0 {
		tokens += age.Seconds() * rate.RefillRPS
	}
	tokens = math.Min(tokens, float64(rate.Burst))
	need := float64(cost)
	if tokens >= need {
		return nil
	}
	limit := rate
	return &space.LimitError{Bucket: bucket, Client: client, RetryAfter: micros((need - tokens) / rate.RefillRPS * 1e6), Limit: &limit, Remaining: tokens}
}

// learn records what a decision found of each bucket, for CachedRefusal.
func (a *Admitter) learn(keys []string, d Decision, sent time.Time) {
	a.remember(keys[0], d.Cluster, sent)
	if d.Client != nil && len(keys) > 1 {
		a.remember(keys[1], *d.Client, sent)
	}
}

func (a *Admitter) remember(key string, st BucketState, at time.Time) {
	v, ok := a.known.Load(key)
	if !ok {
		v, _ = a.known.LoadOrStore(key, &atomic.Pointer[knownBucket]{})
	}
	v.(*atomic.Pointer[knownBucket]).Store(&knownBucket{Rate: st.Rate, Tokens: st.Remaining, At: at})
}

// Peek reports the buckets as Admit would find them now, without taking a token or
// writing anything: Admitted says whether an Admit now would succeed. With admission
// disabled it reports full buckets without asking Redis. A Redis failure is returned
// as an error wrapping ErrUnavailable, whatever the failure mode; nothing is counted.
func (a *Admitter) Peek(ctx context.Context, client space.ClientKey, clientRate *space.Rate) (Decision, error) {
	if !a.enabled {
		return a.disabled(clientRate), nil
	}
	keys, clientArgs, err := a.keys(client, clientRate)
	if err != nil {
		return Decision{}, fmt.Errorf("peek: %w", err)
	}
	sent := a.now()
	admitted, states, err := a.run.decide(ctx, peek, keys, a.clusterArgs, clientArgs)
	if err != nil {
		return Decision{}, fmt.Errorf("peek: %w", unavailable(err))
	}
	d := a.decision(admitted, states, clientRate)
	a.learn(keys, d, sent)
	return d, nil
}

// Enforcement is how admission decisions are applied right now, as GET /v1/limits
// reports it: what the caller is told is what the Admitter does.
type Enforcement string

const (
	// Enforced: decided on Redis and enforced; an empty bucket refuses.
	Enforced Enforcement = "enforced"
	// Shadow: decided and recorded (space_sandbox_admission_rate_decisions_total
	// {decision="shadow_rejected"}), but every activation is admitted.
	Shadow Enforcement = "shadow"
	// Disabled: nothing is charged or decided
	// (SPACE_CLUSTER_ACTIVATION_ADMISSION_ENABLED=false).
	Disabled Enforcement = "disabled"
	// FailOpen: Redis cannot be reached and the failure mode is open: activations are
	// admitted unbudgeted (and counted as decision="error").
	FailOpen Enforcement = "fail_open"
	// FailClosed: Redis cannot be reached and the failure mode is closed: activations
	// are refused with 503.
	FailClosed Enforcement = "fail_closed"
)

// Report is Peek with how decisions are applied now: the buckets as Admit would find
// them (when Redis answers) and the Enforcement an Admit of this moment would follow.
// It takes nothing, writes nothing (but a refusal's expiry repair, see bucket.lua)
// and counts nothing.
func (a *Admitter) Report(ctx context.Context, client space.ClientKey, clientRate *space.Rate) (Decision, Enforcement, error) {
	if !a.enabled {
		return a.disabled(clientRate), Disabled, nil
	}
	d, err := a.Peek(ctx, client, clientRate)
	switch {
	case a.shadow:
		return d, Shadow, err
	case err != nil && a.failClosed:
		return d, FailClosed, err
	case err != nil:
		return d, FailOpen, err
	}
	return d, Enforced, nil
}

func (a *Admitter) keys(client space.ClientKey, clientRate *space.Rate) ([]string, bucketArgs, error) {
	if clientRate == nil {
		return []string{a.clusterKey}, "", nil
	}
	if client == "" {
		return nil, "", errors.New("a client rate needs a client key")
	}
	if err := clientRate.Validate(); err != nil {
		return nil, "", fmt.Errorf("client %q rate: %w", client, err)
	}
	return []string{a.clusterKey, a.clientPrefix + string(client)}, argsOf(*clientRate), nil
}

// decision builds a Decision from the script's answer.
func (a *Admitter) decision(admitted bool, states []BucketState, clientRate *space.Rate) Decision {
	d := Decision{Admitted: admitted, Cluster: states[0]}
	d.Cluster.Rate = a.cluster
	if clientRate != nil {
		c := states[1]
		c.Rate = *clientRate
		d.Client = &c
	}
	if admitted {
		return d
	}
	if d.Client != nil && d.Client.Remaining < 1 {
		d.Bucket = space.BucketClientActivation
		d.RetryAfter = d.Client.Refill
	} else {
		d.Bucket = space.BucketClusterActivation
	}
	if d.Cluster.Remaining < 1 {
		d.RetryAfter = max(d.RetryAfter, d.Cluster.Refill)
	}
	return d
}

// disabled is the decision of a disabled Admitter: admitted, every bucket full.
func (a *Admitter) disabled(clientRate *space.Rate) Decision {
	d := Decision{Admitted: true, Cluster: BucketState{Rate: a.cluster, Remaining: float64(a.cluster.Burst)}}
	if clientRate != nil {
		d.Client = &BucketState{Rate: *clientRate, Remaining: float64(clientRate.Burst)}
	}
	return d
}

// failed applies the failure mode to a Redis error.
func (a *Admitter) failed(client space.ClientKey, clientRate *space.Rate, err error) (Decision, error) {
	a.metrics.errored(clientRate != nil)
	a.errLog.log(err, "client", string(client), "fail_closed", a.failClosed && !a.shadow)
	if a.failClosed && !a.shadow {
		return Decision{}, fmt.Errorf("admit: %w", unavailable(err))
	}
	d := Decision{Admitted: true, FailedOpen: true, Cluster: BucketState{Rate: a.cluster}}
	if clientRate != nil {
		d.Client = &BucketState{Rate: *clientRate}
	}
	return d, nil
}

// Decision label values of space_sandbox_admission_rate_decisions_total.
const (
	decisionAdmitted       = "admitted"
	decisionRejected       = "rejected"
	decisionError          = "error"
	decisionShadowRejected = "shadow_rejected"
)

// admissionMetrics are the admission series (docs/design.md, observability).
//
// space_sandbox_admission_rate_decisions_total{decision, bucket} counts each Admit
// (never Peek, never a disabled Admitter) as follows:
//
//   - admitted: once for bucket="cluster_activation" and, when the client had a rate,
//     once more for bucket="client_activation": one count per token taken, so the
//     cluster_activation series is the number of activations charged.
//   - rejected: once, for the bucket that rejected (client_activation when both were
//     empty). Nothing was taken from either bucket.
//   - shadow_rejected: as rejected, for a decision shadow mode then admitted.
//   - error: as admitted (cluster, plus client when the client had a rate), for a
//     call that failed or timed out, in either failure mode.
//
// So the decisions made are admitted{cluster_activation} + error{cluster_activation} +
// rejected and shadow_rejected summed over both buckets. Client keys are never labels.
//
// space_sandbox_admission_script_seconds is the time of each Admit's script call as
// the replica saw it (round trip included, failures and timeouts too).
type admissionMetrics struct {
	decisions *prometheus.CounterVec
	script    prometheus.Histogram
	local     *prometheus.CounterVec

	admittedCluster, admittedClient prometheus.Counter
	errorCluster, errorClient       prometheus.Counter
}

func newAdmissionMetrics(reg prometheus.Registerer) (*admissionMetrics, error) {
	decisions := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "space_sandbox_admission_rate_decisions_total",
		Help: "Activation admission decisions, by decision and bucket (see internal/admission).",
	}, []string{"decision", "bucket"})
	script := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "space_sandbox_admission_script_seconds",
		Help:    "Time of the admission script call, round trip included.",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2, 12), // 100µs to about 200ms
	})
	decisions = metric.Register(reg, decisions)
	script = metric.Register(reg, script)
	local := metric.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "space_sandbox_admission_local_refusals_total",
		Help: "Rejections answered by the replica from what it last learnt of the bucket, without asking Redis (also counted in space_sandbox_admission_rate_decisions_total), by bucket.",
	}, []string{"bucket"}))
	m := &admissionMetrics{decisions: decisions, script: script, local: local}
	m.admittedCluster = decisions.WithLabelValues(decisionAdmitted, string(space.BucketClusterActivation))
	m.admittedClient = decisions.WithLabelValues(decisionAdmitted, string(space.BucketClientActivation))
	m.errorCluster = decisions.WithLabelValues(decisionError, string(space.BucketClusterActivation))
	m.errorClient = decisions.WithLabelValues(decisionError, string(space.BucketClientActivation))
	// The rejections too, so that every series exists (at 0) from the start.
	for _, b := range []space.Bucket{space.BucketClusterActivation, space.BucketClientActivation} {
		for _, d := range []string{decisionRejected, decisionShadowRejected} {
			decisions.WithLabelValues(d, string(b))
		}
		local.WithLabelValues(string(b))
	}
	return m, nil
}

func (m *admissionMetrics) admitted(client bool) {
	m.admittedCluster.Inc()
	if client {
		m.admittedClient.Inc()
	}
}

func (m *admissionMetrics) errored(client bool) {
	m.errorCluster.Inc()
	if client {
		m.errorClient.Inc()
	}
}

func (m *admissionMetrics) count(decision string, bucket space.Bucket) {
	m.decisions.WithLabelValues(decision, string(bucket)).Inc()
}

// throttledLog logs a repeated failure at most once every 10 seconds, with the
// number of failures it did not log, so that an outage under load does not flood the
// logs.
type throttledLog struct {
	logger   *slog.Logger
	msg      string
	throttle *logs.Throttle
}

func newThrottledLog(logger *slog.Logger, msg string) *throttledLog {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &throttledLog{logger: logger, msg: msg, throttle: logs.NewThrottle(10*time.Second, nil)}
}

func (l *throttledLog) log(err error, attrs ...any) {
	if ok, held := l.throttle.Allow(""); ok {
		l.logger.Warn(l.msg, append(attrs, "err", err.Error(), "suppressed", held)...)
	}
}
