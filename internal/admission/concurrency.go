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
	// (SPACE_REDIS_PIPELINE_ABOVE): see coalescer. 0 is DefaultPipelineAbove (8);
	// negative sends every script on its own.
	PipelineAbove int
	// FailClosed: on a Redis error or timeout, false (the default) lets the request
	// through with a no-op release; true returns an error wrapping ErrUnavailable.
	// Both are counted as decision="error".
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

	mu       sync.Mutex
	held     map[string]map[string]struct{} // lease set key -> lease ids held here
	renewing bool                           // a renewer goroutine is running
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
	return &ConcurrencyLimiter{
		run:        newRunner(opts.Redis, opts.Timeout, opts.Breaker, opts.PipelineAbove),
		prefix:     prefix + ":client_concurrency:",
		ttl:        ttl,
		ttlArg:     strconv.FormatInt(ttl.Milliseconds(), 10),
		failClosed: opts.FailClosed,
		metrics:    metrics,
		errLog:     newThrottledLog(logger, "concurrency limiter: redis failed"),
		logger:     logger,
		instance:   hex.EncodeToString(id),
		held:       map[string]map[string]struct{}{},
		ctx:        ctx,
		cancel:     cancel,
	}, nil
}

// Acquire takes one of client's cap places until release is called. release gives
// the place back; it is idempotent and safe to call from any goroutine. cap <= 0
// means unlimited: no Redis call, a no-op release.
//
// Over the cap it returns a *space.LimitError for bucket client_concurrency with a
// RetryAfter of one second. On a Redis error or timeout it fails open (a no-op
// release, no error) or, with FailClosed, returns an error wrapping ErrUnavailable.
func (c *ConcurrencyLimiter) Acquire(ctx context.Context, client space.ClientKey, cap int) (release func(), err error) {
	if cap <= 0 {
		return func() {}, nil
	}
	if client == "" {
		return nil, errors.New("acquire: empty client key")
	}
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("acquire: %w", ErrClosed)
	}
	key := c.prefix + string(client)
	lease := c.instance + ":" + strconv.FormatUint(c.seq.Add(1), 10)
	v, err := c.run.run(ctx, func(ctx context.Context) (any, error) {
		return c.run.script(ctx, acquireScript, []string{key}, strconv.Itoa(cap), c.ttlArg, lease).Int64Slice()
	})
	if err != nil {
		// The script may still have run after the timeout: that lease is held by no
		// one, is never renewed, and frees its place after LeaseTTL.
		c.metrics.decisions.WithLabelValues(decisionError).Inc()
		c.errLog.log(err, "client", string(client), "fail_closed", c.failClosed)
		if c.failClosed {
			return nil, fmt.Errorf("acquire: %w", unavailable(err))
		}
		return func() {}, nil
	}
	reply := v.([]int64)
	if len(reply) != 2 {
		return nil, fmt.Errorf("acquire: unexpected reply %v", reply)
	}
	if reply[0] != 1 {
		c.metrics.decisions.WithLabelValues(decisionRejected).Inc()
		return nil, &space.LimitError{
			Bucket:     space.BucketClientConcurrency,
			Client:     client,
			RetryAfter: time.Second,
			Cap:        cap,
		}
	}
	c.metrics.decisions.WithLabelValues(decisionAdmitted).Inc()
	c.hold(key, lease)
	releaseCtx := context.WithoutCancel(ctx)
	var once sync.Once
	return func() { once.Do(func() { c.release(releaseCtx, key, lease) }) }, nil
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
	leases := c.held[key]
	if leases == nil {
		leases = map[string]struct{}{}
		c.held[key] = leases
	}
	leases[lease] = struct{}{}
	if !c.renewing && !c.closed {
		c.renewing = true
		c.renewers.Add(1)
		go c.renew()
	}
}

func (c *ConcurrencyLimiter) forget(key, lease string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.held[key], lease)
	if len(c.held[key]) == 0 {
		delete(c.held, key)
	}
}

func (c *ConcurrencyLimiter) release(ctx context.Context, key, lease string) {
	c.forget(key, lease)
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
// of an error. No client label: the per-client state is in Redis.
type concurrencyMetrics struct {
	decisions *prometheus.CounterVec
	renewals  *prometheus.CounterVec
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
	decisions = metric.Register(reg, decisions)
	renewals = metric.Register(reg, renewals)
	for _, d := range []string{decisionAdmitted, decisionRejected, decisionError} {
		decisions.WithLabelValues(d)
	}
	for _, r := range []string{"renewed", "lost", "error"} {
		renewals.WithLabelValues(r)
	}
	return &concurrencyMetrics{decisions: decisions, renewals: renewals}, nil
}
