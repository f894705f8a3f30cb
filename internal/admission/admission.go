// Package admission holds the activation budget (docs/design.md, "Admission buckets")
// and the per-client limits beside it, all in Redis so that every replica enforces the
// same numbers:
//
//   - Admitter charges an activation's cost to the shared cluster activation bucket and
//     the caller's client activation bucket in one Lua script (bucket.lua; reserve.lua
//     while tiers reserve shares of the cluster bucket): from each, or from none.
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
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/admission/model"
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
	// admits within what the replica knows of each bucket ("fail open": an outage of
	// the budget store must not stop activations, nor lift budgets; see spendLocally),
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
	// BatchAbove is how many of the Admitter's decisions may be on their way to Redis
	// at once, each on its own, before the ones callers start wait and go together as
	// one batch script call when a round trip comes back (SPACE_REDIS_BATCH_ABOVE,
	// whose default is DefaultBatchAbove, 8): see coalescer. 0, as that variable's 0,
	// never batches: every decision is a call of its own and nothing waits, which is
	// what a zero Options asks for (New refuses a negative number).
	BatchAbove int
	// MaxKeys bounds the buckets this replica remembers for CachedRefusal
	// (keyed.DefaultMax, 100,000, when 0): past it the least recently used are
	// forgotten, and asked about again. A bucket not asked about for idleBuckets
	// (10 s) and full again by its refill is forgotten before (newKnownBuckets).
	MaxKeys int
	// Registerer receives the metrics; nil registers them nowhere.
	Registerer prometheus.Registerer
	// BudgetKeys bounds the budget keys that label its series per key
	// (space_sandbox_soft_breaches_total): nil labels every key.
	BudgetKeys *metric.Keys
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
	// Reservations returns how tiers share the cluster bucket out now (the tier table
	// in force, *flags.Resolver.Reservations); nil, or a nil answer, is one cluster
	// bucket for everyone. Every charge, a warm-up's included, follows it, so that the
	// total admitted never exceeds the cluster rate whoever charges.
	Reservations func() *space.Reservations
	// Replicas says how many replicas share the buckets now (the roster's count of
	// live replicas, *replicas.Roster.Count); nil, or an answer below 1, is 1. It
	// matters only while Redis cannot decide and the failure mode is open: each
	// replica then spends its share of the cluster bucket (see spendLocally), so that
	// n replicas in an outage admit about the cluster's rate between them, not n times it.
	Replicas func() int
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
	// clientPrefix is the client key without the client: "{<cluster key>}:client:";
	// tierPrefix a tier reserve's key without the tier: "{<cluster key>}:tier:".
	clientPrefix, tierPrefix string
	// reservations is Options.Reservations; plans holds the script's keys and
	// arguments of the last reservations seen, built once per tier table.
	reservations func() *space.Reservations
	plans        atomic.Pointer[reservePlan]

	metrics *admissionMetrics
	errLog  *throttledLog

	// memory is what this replica learnt of the buckets from Redis, for refusals
	// without asking (memory.go); outage is its copy of the cluster side while Redis
	// cannot decide (outage.go).
	memory
	outage
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
	// SoftBreach is true when the decision admitted the client over its soft limit.
	SoftBreach bool
	// Source is where an admitted decision's cluster tokens came from first when tiers
	// reserve shares of the cluster bucket: "reserve" (the tier's own), "shared" or
	// "borrowed" (another tier's idle reserve); "" otherwise. Drawn says how many
	// came from each.
	Source string
	Drawn  model.Drawn
	// FailedOpen is true when Redis failed and fail-open mode admitted from the
	// replica's own view of the buckets; the bucket states are then unknown (zero
	// Remaining). A charge that view refuses is an ordinary rejection.
	FailedOpen bool

	// bound is the cluster side's upper bound the refusal memory keeps (model rule
	// 11); redisNow the Redis time of the decision (µs), for the reference tests.
	bound    float64
	redisNow float64
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
	if err := checkAbove("admission", "BatchAbove", opts.BatchAbove); err != nil {
		return nil, err
	}
	if opts.Enabled {
		if err := opts.Cluster.Validate(); err != nil {
			return nil, fmt.Errorf("admission: cluster rate: %w", err)
		}
	}
	metrics, err := newAdmissionMetrics(opts.Registerer)
	if err == nil {
		metrics.keys = opts.BudgetKeys
	}
	if err != nil {
		return nil, err
	}
	clusterKey := ClusterKey(prefix)
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	return &Admitter{
		memory: memory{
			known:  newKnownBuckets(opts.MaxKeys, now),
			now:    now,
			maxAge: opts.RefusalMaxAge,
		},
		outage:       outage{replicas: opts.Replicas},
		run:          newRunner(opts.Redis, opts.Timeout, opts.Breaker, opts.BatchAbove),
		enabled:      opts.Enabled,
		failClosed:   opts.FailClosed,
		shadow:       opts.Shadow,
		cluster:      opts.Cluster,
		clusterArgs:  argsOf(opts.Cluster),
		clusterKey:   clusterKey,
		clientPrefix: "{" + clusterKey + "}:client:",
		tierPrefix:   "{" + clusterKey + "}:tier:",
		reservations: opts.Reservations,
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

// Charge is the activation flow's seam (space.Charger): c.Cost tokens from the cluster
// bucket (from the tier's reserve first, when tiers reserve shares of it) and, when
// c.Rate is not nil, from c.Key's bucket, all or none, decided by Redis. A refusal is a
// *space.LimitError; a Redis failure admits in fail-open mode (within this replica's
// own view of the buckets: see spendLocally) and is an error wrapping
// ErrUnavailable in fail-closed mode. The flow asks CachedRefusal itself, once, before
// it gets here. A soft breach is reported except in shadow mode, which decides and
// records but tells nobody to degrade.
func (a *Admitter) Charge(ctx context.Context, c space.Charge) (space.Charged, error) {
	d, err := a.decide(ctx, c, take)
	if err != nil {
		return space.Charged{}, err
	}
	if le := d.LimitError(c.Key); le != nil {
		return space.Charged{}, le
	}
	return space.Charged{SoftBreach: d.SoftBreach && !a.shadow}, nil
}

// decide runs one decision (mode take: the charge's cost; peek: nothing taken) on the
// script its charge needs, and applies shadow mode and the metrics to a take.
func (a *Admitter) decide(ctx context.Context, c space.Charge, mode string) (Decision, error) {
	if !a.enabled {
		return a.disabled(c.Rate), nil
	}
	if c.Cost < 1 {
		return Decision{}, fmt.Errorf("admit: cost %d, want at least 1", c.Cost)
	}
	if c.Rate != nil {
		if c.Key == "" {
			return Decision{}, errors.New("admit: a client rate needs a client key")
		}
		if err := c.Rate.Validate(); err != nil {
			return Decision{}, fmt.Errorf("admit: client %q rate: %w", c.Key, err)
		}
	}
	cost := mode
	if mode == take {
		cost = strconv.Itoa(c.Cost)
	}
	var res *space.Reservations
	if a.reservations != nil {
		res = a.reservations()
	}
	sent := a.now()
	start := time.Now()
	var d Decision
	var err error
	if res != nil {
		d, err = a.reserved(ctx, c, res, cost, sent)
	} else {
		d, err = a.plain(ctx, c, cost, sent)
	}
	if err == nil {
		a.learnt.Add(1)
	}
	if mode == peek {
		return d, err
	}
	a.metrics.script.Observe(time.Since(start).Seconds())
	if err != nil {
		return a.failed(c, err)
	}
	switch {
	case d.Admitted:
		a.metrics.admitted(c, d)
	case a.shadow:
		a.metrics.count(decisionShadowRejected, d.Bucket, c.Tier)
		d.Admitted, d.Shadow = true, true
	default:
		a.metrics.count(decisionRejected, d.Bucket, c.Tier)
	}
	return d, nil
}

// plain is the decision of bucket.lua: the cluster bucket, and the client bucket with
// its soft limit when c has them.
func (a *Admitter) plain(ctx context.Context, c space.Charge, cost string, sent time.Time) (Decision, error) {
	keys := []string{a.clusterKey}
	clusterArgs := a.clusterArgs
	var clientArgs, softArgs bucketArgs
	floor := 0.0
	if c.Floor > 0 && c.Rate == nil {
		clusterArgs = withFloor(clusterArgs, c.Floor)
		floor = float64(c.Floor)
	}
	if c.Rate != nil {
		keys = append(keys, a.clientPrefix+string(c.Key))
		clientArgs = argsOf(*c.Rate)
		if c.Soft != nil {
			softArgs = argsOf(*c.Soft)
		}
	}
	admitted, states, breach, now, err := a.run.decide(ctx, cost, keys, clusterArgs, clientArgs, softArgs)
	if err != nil {
		return Decision{}, err
	}
	d := Decision{Admitted: admitted, SoftBreach: breach, Cluster: states[0], bound: states[0].Remaining, redisNow: now}
	d.Cluster.Rate = a.cluster
	// What the charge can draw: the level less the floor (model rule 9); the memory
	// keeps the level itself.
	d.Cluster.Remaining = d.bound - floor
	a.remember(a.clusterKey, BucketState{Rate: a.cluster, Remaining: d.bound}, sent)
	if c.Rate != nil {
		cs := states[1]
		cs.Rate = *c.Rate
		d.Client = &cs
		a.remember(keys[1], cs, sent)
	}
	if !admitted {
		d.refused()
	}
	return d, nil
}

// refused names a refusal's bucket and its retry (model rule 8): the client bucket
// when it was short of the cost (it refills later than now), whatever the cluster
// held; the retry is the later of the short buckets' refills.
func (d *Decision) refused() {
	if d.Client != nil && d.Client.Refill > 0 {
		d.Bucket, d.RetryAfter = space.BucketClientActivation, d.Client.Refill
	} else {
		d.Bucket = space.BucketClusterActivation
	}
	if d.Cluster.Refill > 0 {
		d.RetryAfter = max(d.RetryAfter, d.Cluster.Refill)
	}
}

func (a *Admitter) peek(ctx context.Context, c space.Charge) (Decision, error) {
	d, err := a.decide(ctx, c, peek)
	if err != nil {
		return Decision{}, fmt.Errorf("peek: %w", unavailable(err))
	}
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
	// admitted within what this replica knows of the buckets (and counted as
	// decision="error"); a client known empty is refused.
	FailOpen Enforcement = "fail_open"
	// FailClosed: Redis cannot be reached and the failure mode is closed: activations
	// are refused with 503.
	FailClosed Enforcement = "fail_closed"
)

// Report is Peek with how decisions are applied now: the buckets as c would find them
// (when Redis answers) and the Enforcement a charge of this moment would follow.
// It takes nothing, writes nothing (but a refusal's expiry repair, see bucket.lua)
// and counts nothing.
func (a *Admitter) Report(ctx context.Context, c space.Charge) (Decision, Enforcement, error) {
	if !a.enabled {
		return a.disabled(c.Rate), Disabled, nil
	}
	c.Cost = max(c.Cost, 1)
	d, err := a.peek(ctx, c)
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

// disabled is the decision of a disabled Admitter: admitted, every bucket full.
func (a *Admitter) disabled(clientRate *space.Rate) Decision {
	d := Decision{Admitted: true, Cluster: BucketState{Rate: a.cluster, Remaining: float64(a.cluster.Burst)}}
	if clientRate != nil {
		d.Client = &BucketState{Rate: *clientRate, Remaining: float64(clientRate.Burst)}
	}
	return d
}
