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
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/admission/model"
	"github.com/space-sandbox/space/internal/keyed"
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
	// PipelineAbove is how many of this component's scripts may be on their way to
	// Redis at once, each on its own, before the ones callers start wait and go
	// together as one pipeline when a round trip comes back
	// (SPACE_REDIS_PIPELINE_ABOVE): see coalescer. 0 is DefaultPipelineAbove (8);
	// negative sends every script on its own.
	PipelineAbove int
	// MaxKeys bounds the buckets this replica remembers for CachedRefusal
	// (keyed.DefaultMax, 100,000, when 0): past it the least recently used are
	// forgotten, and asked about again.
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

	// known holds, per bucket, its state as this replica last learnt it from Redis, so
	// that CachedRefusal can refuse without asking. Keys are the cluster key, the tier
	// reserves' and the budget keys', at most Options.MaxKeys of them: a bucket
	// forgotten for room is one this replica asks Redis about again, so forgetting
	// never admits (a refusal it would have made from memory, Redis makes).
	known  *keyed.Map[atomic.Pointer[knownBucket]]
	now    func() time.Time
	maxAge time.Duration
	// share is this replica's copy of the cluster side as spent while Redis cannot
	// decide (spendShare); replicas is Options.Replicas; learnt counts the decisions
	// Redis made, so that a copy of the untiered cluster bucket starts again from
	// what Redis said last once it has spoken since.
	share    outageShare
	replicas func() int
	learnt   atomic.Uint64
}

// knownBucket is one bucket as a decision found it: at most Tokens at time At (the
// replica's clock before the decision was sent, so no later than Redis's), under Rate.
// Tokens only come back at Rate, and other replicas only take them, so Tokens plus the
// refill since At bounds the bucket from above for as long as the rate holds.
type knownBucket struct {
	Rate   space.Rate
	Tokens float64
	At     time.Time
	// claimed is the tokens held by the charges CachedRefusal let through to Redis
	// since this state was learnt and not yet released (see CachedRefusal); the next
	// state learnt starts again from none.
	claimed atomic.Int64
	// asked is when CachedRefusal last let a charge through to relearn this state once
	// it was older than RefusalMaxAge (Unix nanoseconds; 0 never).
	asked atomic.Int64
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
		known:        keyed.New(keyed.Options[atomic.Pointer[knownBucket]]{Max: opts.MaxKeys, Now: func() int64 { return now().Unix() }}),
		now:          now,
		maxAge:       opts.RefusalMaxAge,
		run:          newRunner(opts.Redis, opts.Timeout, opts.Breaker, opts.PipelineAbove),
		enabled:      opts.Enabled,
		failClosed:   opts.FailClosed,
		shadow:       opts.Shadow,
		cluster:      opts.Cluster,
		clusterArgs:  argsOf(opts.Cluster),
		clusterKey:   clusterKey,
		clientPrefix: "{" + clusterKey + "}:client:",
		tierPrefix:   "{" + clusterKey + "}:tier:",
		reservations: opts.Reservations,
		replicas:     opts.Replicas,
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

// Admit decides one activation of cost 1 and returns the whole Decision: it takes one
// token from the cluster bucket and, when clientRate is not nil, one from client's
// bucket, both or neither. With clientRate nil (an exempt client) only the cluster
// bucket is charged. The activation flow and the warm pool charge through Charge;
// Admit is the form the benchmarks and tests read decisions with.
//
// It returns an error only for a bad argument or, in fail-closed mode, when Redis
// fails or does not answer within the timeout (an error wrapping ErrUnavailable).
func (a *Admitter) Admit(ctx context.Context, client space.ClientKey, clientRate *space.Rate) (Decision, error) {
	return a.decide(ctx, space.Charge{Key: client, Rate: clientRate, Cost: 1}, take)
}

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

// CachedRefusal returns the refusal that a Charge of c now would meet, when this
// replica knows it without asking Redis: a bucket that its last decision found too
// empty to hold c's cost by now, even with every token refilled since and none
// taken. It answers from memory, in nanoseconds, so a client flooding over its rate
// costs no Redis call (envoyproxy/ratelimit's local cache of keys over the limit, with
// the time a key stays over it counted from the bucket's own refill).
//
// It only ever refuses; no refusal means "ask Redis" (Charge does). A bucket is known
// under the rate it was decided with: a flag that changes the client's rate, exempts
// it or moves it on or off the allowlist makes the entry not apply, so the next create
// is Redis's. The known tokens are an upper bound as long as other replicas only take
// tokens, so a refusal here is never wrong beyond the instant of the refill itself,
// and its Retry-After is counted from that refill. What gives tokens back (a key reset
// by hand) is seen once the entry is older than Options.RefusalMaxAge, when the next
// charge asks Redis and learns the bucket afresh. Nothing is refused in shadow mode or
// with admission disabled. A refusal is counted as Charge counts one.
//
// With tiers reserving shares of the cluster bucket, the cluster side is known per
// tier: an upper bound of everything the tier's charge could draw on (its reserve, the
// shared remainder, what other reserves could ever lend), so that a shared remainder
// known empty never refuses a tier whose reserve holds tokens.
//
// A charge it lets through holds its cost against that upper bound (the Hold) until
// the flow releases it, once the charge is decided or the create ends without one;
// a charge the holds leave short is refused here too, until a decision teaches the
// replica the bucket afresh. Without it, a flood that finds its bucket holding N
// tokens would send every create in flight down the whole create path (a lease,
// Postgres, the script) until the first refusal came back: thousands a second for N
// tokens, and the slower the replica gets the more of them go, until it is
// overloaded by refusals and its Redis calls time out.
//
// A bucket this replica knows nothing of yet (its first charge, or a new rate) lets
// every charge through until the first decision comes back. Making the others wait
// for that one was built and measured: a cold replica under an open-loop flood of
// 2,500/s then answered late, the load generator opened connections for the answers
// it waited for, and the replica's Redis calls timed out (1,400 to 1,800 decisions
// failed open in the flood's first second, against none without the wait).
func (a *Admitter) CachedRefusal(c space.Charge) (space.Hold, *space.LimitError) {
	if !a.enabled || a.shadow || a.maxAge <= 0 {
		return nil, nil
	}
	key, rate, cost := c.Key, c.Rate, c.Cost
	now := a.now()
	var le *space.LimitError
	var client, cluster known
	if rate != nil && key != "" {
		client = a.knownState(a.clientPrefix+string(key), *rate, cost, now)
		le = client.refusal(space.BucketClientActivation, key)
	}
	clusterKey, clusterRate := a.knownCluster(c.Tier)
	cluster = a.knownState(clusterKey, clusterRate, cost+int(c.Floor), now)
	if refused := cluster.refusal(space.BucketClusterActivation, key); refused != nil {
		if le == nil {
			le = refused
		} else {
			// Both short: the client bucket is named, the retry waits for both.
			le.RetryAfter = max(le.RetryAfter, refused.RetryAfter)
		}
	}
	if le == nil {
		// Neither is short by what refilled: the charge holds its tokens in each
		// bucket, which refuses it if earlier holds took them.
		var fromClient, fromCluster *knownBucket
		if fromClient, le = client.claim(cost, space.BucketClientActivation, key); le == nil {
			if fromCluster, le = cluster.claim(cost, space.BucketClusterActivation, key); le == nil {
				return holding(cost, fromClient, fromCluster), nil
			}
			if fromClient != nil {
				fromClient.claimed.Add(-int64(cost))
			}
		}
	}
	a.metrics.count(decisionRejected, le.Bucket, c.Tier)
	a.metrics.refusedLocally(le.Bucket)
	return nil, le
}

// knownCluster is the entry under which a replica knows the cluster side of a charge
// of tier: the cluster bucket, or with tiers reserving shares of it, the tier's upper
// bound of all it could draw on.
func (a *Admitter) knownCluster(tier string) (string, space.Rate) {
	if a.reservations != nil {
		if res := a.reservations(); res != nil {
			t := a.plan(res).of(tier)
			return t.knownKey, t.drawable
		}
	}
	return a.clusterKey, a.cluster
}

// hold is a let-through charge's Hold: its cost claimed from the client's and the
// cluster's known states (either nil when not known).
type hold struct {
	cost            int64
	client, cluster *knownBucket
	released        atomic.Bool
}

// holding is the Hold of a charge of cost claimed from client and cluster: nil (no
// allocation) when neither was known, so nothing is held.
func holding(cost int, client, cluster *knownBucket) space.Hold {
	if client == nil && cluster == nil {
		return nil
	}
	return &hold{cost: int64(cost), client: client, cluster: cluster}
}

// Release implements space.Hold: the claims are given back, to states a decision may
// since have replaced, which is harmless.
func (h *hold) Release() {
	if h.released.Swap(true) {
		return
	}
	for _, k := range [2]*knownBucket{h.client, h.cluster} {
		if k != nil {
			k.claimed.Add(-h.cost)
		}
	}
}

// known is what a replica knows of one bucket for one charge: nothing (k nil), or its
// state and the most it can hold now.
//
// A state older than RefusalMaxAge is relearnt by the next charge, which is let
// through to Redis whatever the state says; the charges that come while that one is
// on its way are judged by the old state meanwhile (it is still an upper bound, unless
// someone gave tokens back by hand, which the charge let through learns): otherwise a
// client that floods again after a pause would send its whole flood to Redis and
// Postgres at once. Another charge is let through if no decision came within another
// RefusalMaxAge.
type known struct {
	k      *knownBucket
	tokens float64 // the most the bucket holds now: the known tokens and all refill since
	need   float64 // what the charge needs left in it: its cost, and a warm-up's floor
}

// knownState is what this replica knows of bucket key for a charge needing need
// tokens at now: nothing when it has no state of the bucket under rate, or for the
// charge that relearns one too old.
func (a *Admitter) knownState(key string, rate space.Rate, need int, now time.Time) known {
	cell := a.known.Load(key)
	if cell == nil {
		return known{}
	}
	k := cell.Load()
	if k == nil || k.Rate != rate {
		return known{}
	}
	age := now.Sub(k.At)
	if age > a.maxAge {
		asked, at := k.asked.Load(), now.UnixNano()
		if at-asked > int64(a.maxAge) && k.asked.CompareAndSwap(asked, at) {
			return known{}
		}
	}
	// A bucket may reach its burst up to model.MemorySlack early after a rate change
	// (model rule 3): what it may hold is read that much later.
	return known{k: k, tokens: k.upTo(now.Add(memorySlack)), need: float64(need)}
}

// refusal is the bucket's refusal if it cannot hold what the charge needs yet.
func (b known) refusal(bucket space.Bucket, client space.ClientKey) *space.LimitError {
	if b.k == nil || b.tokens >= b.need {
		return nil
	}
	return b.limitError(bucket, client, b.tokens)
}

// claim takes cost from what a known bucket can serve now, for a charge let through
// to Redis, and returns the state it claimed from, or the refusal of a charge that
// earlier claims leave short. A bucket not known claims nothing.
func (b known) claim(cost int, bucket space.Bucket, client space.ClientKey) (*knownBucket, *space.LimitError) {
	if b.k == nil {
		return nil, nil
	}
	claimed := b.k.claimed.Add(int64(cost))
	if left := b.tokens - float64(claimed-int64(cost)); left < b.need {
		b.k.claimed.Add(-int64(cost))
		return nil, b.limitError(bucket, client, left)
	}
	return b.k, nil
}

// limitError is the refusal of a charge that finds left of what it needs.
func (b known) limitError(bucket space.Bucket, client space.ClientKey, left float64) *space.LimitError {
	limit := b.k.Rate
	left = max(left, 0)
	return &space.LimitError{Bucket: bucket, Client: client, RetryAfter: micros((b.need - left) / limit.RefillRPS * 1e6), Limit: &limit, Remaining: left, FromMemory: true}
}

// remember records what a decision found of the bucket under key, for CachedRefusal.
func (a *Admitter) remember(key string, st BucketState, at time.Time) {
	a.cell(key).Store(&knownBucket{Rate: st.Rate, Tokens: st.Remaining, At: at})
}

// cell is where this replica keeps what it knows of the bucket under key.
func (a *Admitter) cell(key string) *atomic.Pointer[knownBucket] {
	return a.known.LoadOrNew(key, nil)
}

// upTo is the most the bucket can hold at now: the known tokens and every refill
// since, up to its burst.
func (k *knownBucket) upTo(now time.Time) float64 {
	tokens := k.Tokens
	if age := now.Sub(k.At); age > 0 {
		tokens += age.Seconds() * k.Rate.RefillRPS
	}
	return math.Min(tokens, float64(k.Rate.Burst))
}

// Peek reports the buckets as a charge of one token would find them now, without
// taking a token or writing anything: Admitted says whether it would succeed. With admission
// disabled it reports full buckets without asking Redis. A Redis failure is returned
// as an error wrapping ErrUnavailable, whatever the failure mode; nothing is counted.
func (a *Admitter) Peek(ctx context.Context, client space.ClientKey, clientRate *space.Rate) (Decision, error) {
	return a.peek(ctx, space.Charge{Key: client, Rate: clientRate, Cost: 1})
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

// failed applies the failure mode to a Redis error. Failing open, the charge is
// decided by this replica alone (spendLocally): admitted and counted as an error, or
// refused and counted as a refusal from memory.
func (a *Admitter) failed(c space.Charge, err error) (Decision, error) {
	a.errLog.log(err, "client", string(c.Key), "fail_closed", a.failClosed && !a.shadow)
	if a.failClosed && !a.shadow {
		a.metrics.errored(c)
		return Decision{}, fmt.Errorf("admit: %w", unavailable(err))
	}
	if !a.shadow {
		if d, refused := a.spendLocally(c); refused {
			a.metrics.count(decisionRejected, d.Bucket, c.Tier)
			a.metrics.refusedLocally(d.Bucket)
			return d, nil
		}
	}
	a.metrics.errored(c)
	d := Decision{Admitted: true, FailedOpen: true, Cluster: BucketState{Rate: a.cluster}}
	if c.Rate != nil {
		d.Client = &BucketState{Rate: *c.Rate}
	}
	return d, nil
}

// spendLocally decides a charge that Redis could not decide, failing open: the client
// bucket as this replica knows it (its last decision's state and the refill since, as
// CachedRefusal reads it; a bucket it never learnt, or learnt under another rate, as
// full) must hold the cost, and the cluster side must give it from this replica's
// share (spendShare); the cost is then spent from both here, or from neither. It
// returns the refusal, with refused true, when one is short.
//
// Failing open is for an outage of the budget store: it must not stop activations.
// It must not stop budgets either. Before this, every charge was admitted while Redis
// failed, and a flood over its rate made that happen by itself: a replica loaded
// past its Redis timeout by the flood's first second (the load generator opening
// hundreds of connections, every create in flight queued behind them) timed out
// three calls in a row, the breaker opened, and for the breaker's second the flooder
// was admitted about 1,300 times instead of 50 (make bench, flood scenario). Now a
// replica that cannot ask Redis admits what its own view allows: a client keeps its
// rate, a flooder gets its rate, and the n replicas that Options.Replicas counts
// admit about the cluster bucket's burst and rate between them, tiers and reserves
// included (model rule 12). A client's bucket is not shared out: a client's creates
// do not spread evenly over the replicas (a keep-alive connection stays on one), and
// a client sent to one replica would get a nth of its rate there; it may get up to n
// times its rate across the replicas, within the cluster's. What is spent here is
// this replica's alone: the first decision Redis makes again replaces the client's
// state with the bucket's real one.
//
// The charges CachedRefusal let through hold their cost against the same state; it
// is not counted here, since each of them comes here too and spends for itself.
func (a *Admitter) spendLocally(c space.Charge) (Decision, bool) {
	now := a.now()
	cost := float64(c.Cost)
	d := Decision{Cluster: BucketState{Rate: a.cluster}}
	var clientKey string
	if c.Rate != nil && c.Key != "" {
		clientKey = a.clientPrefix + string(c.Key)
		left, ok := a.spend(clientKey, *c.Rate, cost, cost, now)
		d.Client = &BucketState{Rate: *c.Rate, Remaining: left}
		if !ok {
			d.Bucket, d.RetryAfter = space.BucketClientActivation, micros((cost-left)/c.Rate.RefillRPS*1e6)
			d.Client.Refill = d.RetryAfter
			return d, true
		}
	}
	share := a.spendShare(c, now)
	d.Cluster.Remaining = share.Cluster.Remaining
	d.Drawn = share.Drawn
	if !share.Admitted {
		if clientKey != "" {
			// Both or neither: the client's tokens back.
			d.Client.Remaining, _ = a.spend(clientKey, *c.Rate, 0, -cost, now)
		}
		d.Bucket, d.RetryAfter = space.BucketClusterActivation, micros(share.RetryAfter)
		d.Cluster.Refill = d.RetryAfter
		return d, true
	}
	return d, false
}

// outageShare is this replica's copy of the cluster side while Redis cannot decide:
// the model's state of the cluster bucket (or the shared remainder and the reserves)
// as spent here, and how many decisions Redis had made when it was last spent.
type outageShare struct {
	mu     sync.Mutex
	state  *model.State
	learnt uint64
}

// spendShare is the cluster side of a charge decided here (spendLocally), by the
// model's rule 12: the tier table in force decides it on this replica's copy of the
// cluster side, its cost taken n times, n the replicas that Options.Replicas counts,
// so that n replicas, each spending its own copy, take the cluster budget about once
// between them. A cost n times over larger than a copy can give is admitted from a
// full copy, into debt, so that more replicas than tokens still admit a nth of the
// rate each.
//
// The copy starts full. Without reserves, a copy of the cluster bucket starts again
// from what this replica last learnt of it whenever Redis has decided since the copy
// was last spent (an outage after a recovery starts from Redis's word, not from the
// last outage's copy); with reserves, the replica knows no bucket apart, and the copy
// goes on from what it spent, refilling as the rules say. The copy is kept apart from
// the state CachedRefusal reads, which stays an upper bound of the buckets (what this
// replica spent n times over is a guess at what the others spent, not a bound), so
// that a refusal from memory stays one Redis would make once it decides again.
func (a *Admitter) spendShare(c space.Charge, now time.Time) model.Decision {
	var res *space.Reservations
	if a.reservations != nil {
		res = a.reservations()
	}
	n := 1
	if a.replicas != nil {
		n = max(a.replicas(), 1)
	}
	at := micro(now)
	s := &a.share
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state == nil {
		s.state = model.NewState()
	}
	if learnt := a.learnt.Load(); learnt != s.learnt && res == nil {
		s.state = model.NewState()
		if k := a.cell(a.clusterKey).Load(); k != nil && k.Rate == a.cluster {
			r := model.RateOf(a.cluster)
			kat := micro(k.At)
			s.state.Cluster = model.Bucket{Written: true, Tokens: k.Tokens, At: kat, Full: model.FullAt(k.Tokens, r, kat)}
		}
	}
	s.learnt = a.learnt.Load()
	out := model.Outage{State: s.state, Replicas: n}
	return out.Decide(model.Limits{Cluster: a.cluster, Reservations: res}, c, at)
}

// micro is t in microseconds, as the model reads time.
func micro(t time.Time) float64 { return float64(t.UnixMicro()) }

// memorySlack is model.MemorySlack as a Duration.
const memorySlack = time.Duration(model.MemorySlack) * time.Microsecond

// spend takes cost from the bucket under key as this replica knows it at now, if it
// holds need, and records what is left as the replica's state of the bucket. It
// returns the tokens left (or held, when short) and whether it took them. A negative
// cost gives tokens back.
func (a *Admitter) spend(key string, rate space.Rate, need, cost float64, now time.Time) (float64, bool) {
	p := a.cell(key)
	for {
		k := p.Load()
		tokens := float64(rate.Burst)
		if k != nil && k.Rate == rate {
			tokens = k.upTo(now)
		}
		if tokens < need {
			return tokens, false
		}
		left := math.Min(tokens-cost, float64(rate.Burst))
		if p.CompareAndSwap(k, &knownBucket{Rate: rate, Tokens: left, At: now}) {
			return left, true
		}
	}
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
