package admission

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/keyed"
	"github.com/space-sandbox/space/internal/metric"
)

var (
	//go:embed concurrency_acquire.lua
	acquireSource string
	//go:embed concurrency_renew.lua
	renewSource string

	acquireScript = redis.NewScript(acquireSource)
	renewScript   = redis.NewScript(renewSource)
)

// leaseTTL is how long a lease outlives its last renewal when
// ConcurrencyOptions.LeaseTTL is zero. A replica renews the leases it holds every
// third of it, so a lease survives two missed renewals, and a crashed replica's places
// come back within this time.
const leaseTTL = 30 * time.Second

// minLeaseTTL keeps the renewal interval meaningful.
const minLeaseTTL = 30 * time.Millisecond

// ErrClosed is returned by Acquire on a ConcurrencyLimiter that was closed.
var ErrClosed = errors.New("concurrency limiter is closed")

// ConcurrencyOptions configures a ConcurrencyLimiter.
type ConcurrencyOptions struct {
	// Redis is required.
	Redis redis.UniversalClient
	// Prefix namespaces the keys (required; SPACE_REDIS_KEY_PREFIX): a client's leases
	// are the sorted set "<prefix>:client_concurrency:<client>".
	Prefix string
	// LeaseTTL is how long a lease lives without renewal, default 30s
	// (30s), at least 30ms. Held leases are renewed every LeaseTTL/3.
	LeaseTTL time.Duration
	// Timeout bounds each Redis call (required; SPACE_REDIS_TIMEOUT).
	Timeout time.Duration
	// Breaker, shared by a replica's Redis components, fails calls at once while Redis
	// is known to be down (see Breaker); nil calls Redis every time.
	Breaker *Breaker
	// PipelineAbove is how many of this component's scripts may be on their way to
	// Redis at once, each on its own, before the ones callers start wait and go
	// together as one pipeline when a round trip comes back
	// (SPACE_REDIS_PIPELINE_ABOVE, whose default is DefaultPipelineAbove, 8): see
	// coalescer. 0, as that variable's 0, never pipelines: every script is a call of
	// its own and nothing waits (NewConcurrencyLimiter refuses a negative number).
	PipelineAbove int
	// MaxKeys bounds the clients whose places this replica remembers for Alongside
	// (keyed.DefaultMax, 100,000, when 0).
	MaxKeys int
	// FailClosed: on a Redis error or timeout, false (the default) lets the request
	// through within the cap as this replica alone counts it (placeLocally); true
	// returns an error wrapping ErrUnavailable. Both are counted as decision="error",
	// and a request the replica's own count refuses as decision="rejected".
	FailClosed bool
	// Registerer receives the metrics; nil registers them nowhere.
	Registerer prometheus.Registerer
	// Logger receives Redis failures (throttled); nil discards.
	Logger *slog.Logger
}

// ConcurrencyLimiter caps each client's in-flight requests across every replica
// (docs/design.md, "The create path"). Each request holds a lease, a member of the
// client's sorted set scored by its expiry in Redis time; acquiring drops expired
// leases, counts and adds in one script. The replica renews the leases it holds, so a
// long request keeps its place, and a crashed replica's leases expire on their own.
type ConcurrencyLimiter struct {
	run        runner
	prefix     string
	ttl        time.Duration
	ttlArg     string
	failClosed bool
	metrics    *concurrencyMetrics
	errLog     *throttledLog
	logger     *slog.Logger

	// Lease ids are "<instance>:<sequence>": unique across replicas without a
	// random read per request.
	instance string
	seq      atomic.Uint64

	// known is what this replica's newest Acquire (by Redis's clock) learnt of each
	// client's places, for Alongside, for at most ConcurrencyOptions.MaxKeys clients
	// (a client with places being taken alongside is kept): a client forgotten takes
	// its next place before its work, as one not asked for recently does.
	known *keyed.Map[knownPlaces]
	now   func() time.Time

	mu   sync.Mutex
	held leaseSets // lease ids held here
	// leaving are the leases being given back here whose ZREM may not have reached
	// Redis yet (lease set key -> lease ids): an Acquire here drops them first, so a
	// request answered before its place was given back (space.Lease.Roomy) never has
	// its place counted against its caller's next request to this replica.
	leaving leaseSets
	// local counts, per lease set key, the places this replica gave out while Redis
	// could not be asked and not yet given back (placeLocally); a key at 0 is not kept.
	local    map[string]int
	renewing bool // a renewer goroutine is running
	closed   bool
	// ctx is cancelled by Close: it stops the renewer and its calls in flight.
	ctx      context.Context
	cancel   context.CancelFunc
	renewers sync.WaitGroup
}

// NewConcurrencyLimiter returns a ConcurrencyLimiter, or an error naming the option
// that is wrong. Call Close when done with it.
func NewConcurrencyLimiter(opts ConcurrencyOptions) (*ConcurrencyLimiter, error) {
	if opts.Redis == nil {
		return nil, errors.New("concurrency limiter: Redis is required")
	}
	prefix := opts.Prefix
	if prefix == "" {
		return nil, errors.New("concurrency limiter: Prefix is required")
	}
	if err := checkTimeout("concurrency limiter", opts.Timeout); err != nil {
		return nil, err
	}
	if err := checkAbove("concurrency limiter", "PipelineAbove", opts.PipelineAbove); err != nil {
		return nil, err
	}
	ttl := opts.LeaseTTL
	if ttl == 0 {
		ttl = leaseTTL
	}
	if ttl < minLeaseTTL {
		return nil, fmt.Errorf("concurrency limiter: LeaseTTL %v is below %v", ttl, minLeaseTTL)
	}
	metrics, err := newConcurrencyMetrics(opts.Registerer)
	if err != nil {
		return nil, err
	}
	id := make([]byte, 8)
	if _, err := rand.Read(id); err != nil {
		return nil, fmt.Errorf("concurrency limiter: instance id: %w", err)
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &ConcurrencyLimiter{
		run:        newRunner(opts.Redis, opts.Timeout, opts.Breaker, opts.PipelineAbove),
		prefix:     prefix + ":client_concurrency:",
		ttl:        ttl,
		ttlArg:     strconv.FormatInt(ttl.Milliseconds(), 10),
		failClosed: opts.FailClosed,
		metrics:    metrics,
		errLog:     newThrottledLog(logger, "concurrency limiter: redis failed"),
		logger:     logger,
		instance:   hex.EncodeToString(id),
		now:        time.Now,
		held:       leaseSets{},
		leaving:    leaseSets{},
		local:      map[string]int{},
		ctx:        ctx,
		cancel:     cancel,
	}
	c.known = keyed.New(keyed.Options[knownPlaces]{
		Max:     opts.MaxKeys,
		IdleFor: idlePlaces,
		Keep:    func(k *knownPlaces) bool { return k.pending.Load() > 0 },
		Now:     func() int64 { return c.now().Unix() },
	})
	return c, nil
}

// Acquire takes one of client's cap places until the lease's Release, which is
// idempotent and safe to call from any goroutine. The lease is Roomy when at most half
// of cap was held with it. cap <= 0 means unlimited: no Redis call, a no-op release.
//
// Over the cap it returns a *space.LimitError for bucket client_concurrency with a
// RetryAfter of one second. On a Redis error or timeout it fails open, within the cap
// as this replica counts it alone (placeLocally), or, with FailClosed, returns an
// error wrapping ErrUnavailable.
func (c *ConcurrencyLimiter) Acquire(ctx context.Context, client space.ClientKey, cap int) (space.Lease, error) {
	if cap <= 0 {
		return space.Lease{}, nil
	}
	if client == "" {
		return space.Lease{}, errors.New("acquire: empty client key")
	}
	key := c.prefix + string(client)
	lease := c.instance + ":" + strconv.FormatUint(c.seq.Add(1), 10)
	c.mu.Lock()
	closed := c.closed
	// Places this replica gave out while Redis could not be asked are in no count
	// there: until they are given back, they take their part of the cap here.
	local := c.local[key]
	args := []any{strconv.Itoa(max(cap-local, 0)), c.ttlArg, lease}
	for l := range c.leaving[key] {
		args = append(args, l)
	}
	c.mu.Unlock()
	if closed {
		return space.Lease{}, fmt.Errorf("acquire: %w", ErrClosed)
	}
	v, err := c.run.run(ctx, func(ctx context.Context) (any, error) {
		return c.run.script(ctx, acquireScript, []string{key}, args...).Int64Slice()
	})
	known := c.places(client)
	if err != nil {
		// The script may still have run after the timeout: that lease is held by no
		// one, is never renewed, and frees its place after LeaseTTL.
		known.forget()
		c.errLog.log(err, "client", string(client), "fail_closed", c.failClosed)
		if c.failClosed {
			c.metrics.decisions.WithLabelValues(decisionError).Inc()
			return space.Lease{}, fmt.Errorf("acquire: %w", unavailable(err))
		}
		return c.placeLocally(client, key, cap)
	}
	reply := v.([]int64)
	if len(reply) != 3 {
		return space.Lease{}, fmt.Errorf("acquire: unexpected reply %v", reply)
	}
	held := reply[1] + int64(local)
	known.learn(held, reply[2], c.now())
	if reply[0] != 1 {
		c.metrics.decisions.WithLabelValues(decisionRejected).Inc()
		return space.Lease{}, overCapError(client, cap)
	}
	c.metrics.decisions.WithLabelValues(decisionAdmitted).Inc()
	c.hold(key, lease)
	releaseCtx := context.WithoutCancel(ctx)
	var once sync.Once
	release := func() { once.Do(func() { c.release(releaseCtx, key, lease) }) }
	return space.NewLease(release, roomy(held, cap)), nil
}

// placeLocally takes one of client's places that Redis could not be asked for,
// failing open: within cap over this replica's own places, the leases Redis gave it
// that it still holds and the places it gave out itself since Redis stopped
// answering. Before, failing open lifted the cap: a client could start any number of
// requests at once for as long as the outage lasted. Now it keeps its cap on each
// replica, and n replicas let it have at most n times the cap between them. The cap
// is not shared out between replicas as the cluster bucket is (see
// Admitter.spendShare): a client's requests do not spread evenly over the replicas
// (a keep-alive connection stays on one), and a nth of the cap on the one it uses
// would refuse a client that is within it.
//
// A place given here is not in Redis. Once Redis answers again, the replica asks it
// for a place within the cap less its own places from the outage still held
// (Acquire), so that it never holds more than cap between the two counts. Other
// replicas do not see those places: across n replicas a client may hold, for as long
// as its outage places last (a request's length), up to cap plus the places the
// others gave out during the outage and still hold.
func (c *ConcurrencyLimiter) placeLocally(client space.ClientKey, key string, cap int) (space.Lease, error) {
	c.mu.Lock()
	if len(c.held[key])+c.local[key] >= cap {
		c.mu.Unlock()
		c.metrics.decisions.WithLabelValues(decisionRejected).Inc()
		return space.Lease{}, overCapError(client, cap)
	}
	c.local[key]++
	c.mu.Unlock()
	c.metrics.decisions.WithLabelValues(decisionError).Inc()
	var once sync.Once
	return space.NewLease(func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.local[key]--; c.local[key] <= 0 {
				delete(c.local, key)
			}
		})
	}, false), nil
}

// overCapError is the refusal of a place over client's cap: a 429 client_concurrency,
// to be retried after a second.
func overCapError(client space.ClientKey, cap int) *space.LimitError {
	return &space.LimitError{Bucket: space.BucketClientConcurrency, Client: client, RetryAfter: time.Second, Cap: cap}
}

// roomy is the one rule of "far from its cap": n places held, this one counted, are
// at most half of cap. A lease is roomy by it (space.Lease.Roomy), and Alongside
// lets a place be taken alongside by it.
func roomy(n int64, cap int) bool { return 2*n <= int64(cap) }

// alongsideFor is how long what an Acquire learnt of a client's places counts for
// Alongside: a key that has taken no place here for that long is asked first again.
const alongsideFor = time.Second

// knownPlaces is what this replica knows of one client's places: the newest of its
// Acquires' counts, and how many places are being taken here alongside other work now.
type knownPlaces struct {
	seen    atomic.Pointer[placesSeen]
	pending atomic.Int64
}

// placesSeen is one Acquire's count: held places after it, redisAt its Redis TIME
// (microseconds), at when this replica learnt it (unix nanoseconds; 0 knows nothing).
type placesSeen struct {
	held, redisAt, at int64
}

// idlePlaces is how long a client's places stay known once no request of it took one
// here (keyed's IdleFor): Alongside uses what it learnt for alongsideFor only, so past
// it an entry knows nothing the next Acquire would not learn. Ten times that, so that
// the sweep, which reads every entry, runs at most every 10 seconds.
const idlePlaces = 10 * alongsideFor

// reorderBound is how far back by Redis's clock a reply may be and still be taken for
// a reordered one (and ignored): replies of one replica are apart by at most a call's
// timeout. A reply older than that is a clock that moved back (a failover to a node
// whose clock is behind), and is learnt, so that what a replica knows never stalls.
const reorderBound = alongsideFor

// learn takes an Acquire's count when it is the newest this replica has seen by
// Redis's clock (of the same instant, the larger count): the replies of concurrent
// Acquires come back in any order, and the last to come back may be the oldest, with
// a count lower than the client holds now.
func (k *knownPlaces) learn(held, redisAt int64, at time.Time) {
	next := &placesSeen{held: held, redisAt: redisAt, at: at.UnixNano()}
	for {
		cur := k.seen.Load()
		if cur != nil && !cur.replacedBy(held, redisAt) {
			return
		}
		if k.seen.CompareAndSwap(cur, next) {
			return
		}
	}
}

// replacedBy reports whether a reply counting held at redisAt is newer than s: later
// by Redis's clock, of the same instant and no smaller, or earlier past reorderBound.
func (s *placesSeen) replacedBy(held, redisAt int64) bool {
	switch back := time.Duration(s.redisAt-redisAt) * time.Microsecond; {
	case back == 0:
		return held >= s.held
	case back < 0, back > reorderBound:
		return true
	}
	return false
}

// forget makes the replica know nothing of the client (an Acquire failed) until a
// newer reply than the last it learnt.
func (k *knownPlaces) forget() {
	for {
		cur := k.seen.Load()
		if cur == nil || cur.at == 0 {
			return
		}
		if k.seen.CompareAndSwap(cur, &placesSeen{held: cur.held, redisAt: cur.redisAt}) {
			return
		}
	}
}

func (c *ConcurrencyLimiter) places(client space.ClientKey) *knownPlaces {
	return c.known.LoadOrNew(string(client), nil)
}

// Alongside reports whether a request of client may take its place under cap
// alongside other work of its own (a create's reservation: see sandbox.Service.takePlace)
// instead of before it, and if so counts that place as being taken here until done
// is called, which must be once the Acquire it was for has returned.
//
// It may when this replica's newest Acquire of client by Redis's clock (not the last
// reply to come back: see knownPlaces.learn), learnt within alongsideFor (1s), left
// at most half of cap held, with every place being taken alongside here now counted
// and this one: that is, when the Acquire is all but certain to succeed. Whatever
// else, it may not: a client that nears its cap, or that this replica has not asked
// for recently, or whose last Acquire failed, takes its place before any other work,
// so that a client over its cap costs nothing but the refusal, and no more requests
// than half its cap ever go on here before their places are known.
func (c *ConcurrencyLimiter) Alongside(client space.ClientKey, cap int) (done func(), ok bool) {
	if cap <= 0 {
		return nil, false
	}
	k := c.places(client)
	seen := k.seen.Load()
	if seen == nil || seen.at == 0 || c.now().Sub(time.Unix(0, seen.at)) > alongsideFor {
		return nil, false
	}
	held := seen.held
	for {
		pending := k.pending.Load()
		if !roomy(held+pending+1, cap) {
			return nil, false
		}
		if k.pending.CompareAndSwap(pending, pending+1) {
			c.metrics.alongside.Inc()
			var once sync.Once
			return func() { once.Do(func() { k.pending.Add(-1) }) }, true
		}
	}
}

// Close stops renewing the leases this limiter holds; they expire after LeaseTTL,
// as a crashed replica's would. Release functions stay callable; Acquire returns
// ErrClosed. Close the limiter once the requests are drained.
func (c *ConcurrencyLimiter) Close() {
	c.mu.Lock()
	c.closed = true
	c.cancel()
	c.mu.Unlock()
	c.renewers.Wait()
}

// hold records a lease for renewal, starting the renewer if it is not running.
func (c *ConcurrencyLimiter) hold(key, lease string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.held.add(key, lease)
	if !c.renewing && !c.closed {
		c.renewing = true
		c.renewers.Add(1)
		go c.renew()
	}
}

// leave moves a lease from held (no longer renewed) to leaving, until left.
func (c *ConcurrencyLimiter) leave(key, lease string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.held.remove(key, lease)
	c.leaving.add(key, lease)
}

// left forgets a lease whose ZREM has come back, done or failed.
func (c *ConcurrencyLimiter) left(key, lease string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.leaving.remove(key, lease)
}

// leaseSets are lease ids by lease set key; a key without leases is not kept.
type leaseSets map[string]map[string]struct{}

func (s leaseSets) add(key, lease string) {
	if s[key] == nil {
		s[key] = map[string]struct{}{}
	}
	s[key][lease] = struct{}{}
}

func (s leaseSets) remove(key, lease string) {
	delete(s[key], lease)
	if len(s[key]) == 0 {
		delete(s, key)
	}
}

func (c *ConcurrencyLimiter) release(ctx context.Context, key, lease string) {
	c.leave(key, lease)
	defer c.left(key, lease)
	_, err := c.run.run(ctx, func(ctx context.Context) (any, error) {
		return c.run.rdb.ZRem(ctx, key, lease).Result()
	})
	if err != nil {
		// The lease expires on its own within LeaseTTL, now that it is not renewed.
		c.errLog.log(err, "op", "release")
	}
}

// renew runs while leases are held: every LeaseTTL/3 it renews them, one script call
// per client. It exits when no lease is held (hold starts it again) or on Close.
func (c *ConcurrencyLimiter) renew() {
	defer c.renewers.Done()
	ticker := time.NewTicker(c.ttl / 3)
	defer ticker.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-ticker.C:
		}
		batch := c.snapshot()
		if batch == nil {
			return
		}
		for key, leases := range batch {
			c.renewSet(c.ctx, key, leases)
		}
	}
}

// snapshot copies the held leases, or, when none is held, marks the renewer stopped
// and returns nil, under the same lock as hold, so no lease goes unrenewed.
func (c *ConcurrencyLimiter) snapshot() map[string][]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.held) == 0 {
		c.renewing = false
		return nil
	}
	batch := make(map[string][]string, len(c.held))
	for key, leases := range c.held {
		for lease := range leases {
			batch[key] = append(batch[key], lease)
		}
	}
	return batch
}

func (c *ConcurrencyLimiter) renewSet(ctx context.Context, key string, leases []string) {
	args := make([]any, 0, 1+len(leases))
	args = append(args, c.ttlArg)
	for _, l := range leases {
		args = append(args, l)
	}
	v, err := c.run.run(ctx, func(ctx context.Context) (any, error) {
		return c.run.script(ctx, renewScript, []string{key}, args...).Int64()
	})
	if err != nil {
		if c.ctx.Err() != nil {
			return // closed while renewing: nothing failed
		}
		c.metrics.renewals.WithLabelValues("error").Add(float64(len(leases)))
		c.errLog.log(err, "op", "renew")
		return
	}
	renewed := int(v.(int64))
	c.metrics.renewals.WithLabelValues("renewed").Add(float64(renewed))
	if lost := len(leases) - renewed; lost > 0 {
		// A lease expired before it was renewed (Redis unreachable for a whole TTL, or
		// a stalled replica): its request runs on without a place.
		c.metrics.renewals.WithLabelValues("lost").Add(float64(lost))
		c.logger.Warn("concurrency limiter: leases expired before renewal", "key", key, "lost", lost)
	}
}

// concurrencyMetrics: space_client_concurrency_decisions_total{decision} counts each
// Acquire with a cap as admitted, rejected (over the cap) or error (Redis failed or
// timed out, in either failure mode); space_client_concurrency_lease_renewals_total
// {result} counts leases renewed, lost (expired before renewal) or not renewed because
// of an error; space_client_concurrency_alongside_total counts the places Alongside let
// be taken alongside other work (their decisions are counted as any other). No client
// label: the per-client state is in Redis.
type concurrencyMetrics struct {
	decisions *prometheus.CounterVec
	renewals  *prometheus.CounterVec
	alongside prometheus.Counter
}

func newConcurrencyMetrics(reg prometheus.Registerer) (*concurrencyMetrics, error) {
	decisions := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "space_client_concurrency_decisions_total",
		Help: "Client concurrency limiter decisions, by decision (admitted, rejected, error).",
	}, []string{"decision"})
	renewals := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "space_client_concurrency_lease_renewals_total",
		Help: "Concurrency lease renewals, by result (renewed, lost, error).",
	}, []string{"result"})
	alongside := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "space_client_concurrency_alongside_total",
		Help: "Concurrency places taken alongside a create's reservation instead of before it (a client far below its cap).",
	})
	decisions = metric.Register(reg, decisions)
	renewals = metric.Register(reg, renewals)
	alongside = metric.Register(reg, alongside)
	for _, d := range []string{decisionAdmitted, decisionRejected, decisionError} {
		decisions.WithLabelValues(d)
	}
	for _, r := range []string{"renewed", "lost", "error"} {
		renewals.WithLabelValues(r)
	}
	return &concurrencyMetrics{decisions: decisions, renewals: renewals, alongside: alongside}, nil
}
