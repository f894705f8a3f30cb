package admission

import (
	"context"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/space-sandbox/space"
)

//go:embed bucket.lua
var bucketSource string

// bucketScript is the one Lua script behind every token bucket here: the Admitter's
// two-bucket decision and the Limiter's single bucket. Run sends EVALSHA and falls
// back to EVAL when the server answers NOSCRIPT (after a restart, a failover or a
// SCRIPT FLUSH).
var bucketScript = redis.NewScript(bucketSource)

// ErrUnavailable is in the chain of the error a fail-closed Admitter, a
// ConcurrencyLimiter or a Limiter returns when Redis fails or does not answer within
// the timeout. The same error is an *space.Error with code space.EUNAVAILABLE, which
// the API answers with 503.
var ErrUnavailable = errors.New("admission store unavailable")

// unavailable wraps a Redis failure so that both errors.Is(err, ErrUnavailable) and
// space.ErrorCode(err) == space.EUNAVAILABLE hold, keeping the cause for logs.
func unavailable(err error) error {
	return space.Unavailable("redis", fmt.Errorf("%w: %w", ErrUnavailable, err))
}

// Take and peek are the cost argument of the script.
const (
	take = "1"
	peek = "0"
)

// runner runs Redis calls with a per-call timeout, through the replica's Breaker; its
// scripts go through a coalescer.
type runner struct {
	rdb       redis.UniversalClient
	scripts   *coalescer
	deadlines *deadlines
	breaker   *Breaker
	// direct is true when rdb applies context deadlines to its socket reads
	// (ContextTimeoutEnabled). Otherwise a call is raced against the deadline in a
	// goroutine, because go-redis would wait for its own ReadTimeout (seconds) on a
	// server that accepts and never answers.
	direct bool
}

// checkTimeout refuses a missing per-call timeout of component's options.
func checkTimeout(component string, timeout time.Duration) error {
	if timeout <= 0 {
		return fmt.Errorf("%s: Timeout must be positive, got %s", component, timeout)
	}
	return nil
}

// checkAbove refuses a negative coalescing threshold (field) of component's options:
// 0 already means that nothing waits.
func checkAbove(component, field string, n int) error {
	if n < 0 {
		return fmt.Errorf("%s: %s must be 0 (every script on its own) or more, got %d", component, field, n)
	}
	return nil
}

// newRunner returns the runner of one component; above is its options' threshold
// (Options.BatchAbove, or a limiter's PipelineAbove): how many scripts go on their own
// at once before the next wait to go together, 0 for never.
func newRunner(rdb redis.UniversalClient, timeout time.Duration, breaker *Breaker, above int) runner {
	return runner{rdb: rdb, scripts: newCoalescer(rdb, above), deadlines: newDeadlines(timeout), breaker: breaker, direct: honoursContext(rdb)}
}

// script runs script through the runner's coalescer: see run for the deadline and the
// breaker.
func (r runner) script(ctx context.Context, script *redis.Script, keys []string, args ...any) *redis.Cmd {
	return r.scripts.run(ctx, script, keys, args...)
}

// honoursContext reports whether the client's own socket deadlines follow the
// caller's context.
func honoursContext(rdb redis.UniversalClient) bool {
	switch c := rdb.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// run calls fn through the breaker with a context bounded by the timeout, and returns
// no later than the deadline, whatever the client does.
func (r runner) run(ctx context.Context, fn func(ctx context.Context) (any, error)) (any, error) {
	return r.breaker.do(func() (any, error) { return r.call(ctx, fn) })
}

func (r runner) call(ctx context.Context, fn func(ctx context.Context) (any, error)) (any, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ctx = r.bound(ctx)
	if r.direct {
		return fn(ctx)
	}
	type result struct {
		v   any
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := fn(ctx)
		done <- result{v, err}
	}()
	select {
	case res := <-done:
		return res.v, res.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// bound is ctx under its time slot's shared deadline (see deadlines), or ctx itself
// when its own deadline comes sooner. The bounded context's Done and Err are the
// slot's: a caller that gives up during a call does not cut it short, which go-redis
// would not do for a socket read anyway; the call still ends by the slot's deadline.
func (r runner) bound(ctx context.Context) context.Context {
	slot := r.deadlines.at(time.Now())
	if own, ok := ctx.Deadline(); ok {
		if shared, _ := slot.Deadline(); own.Before(shared) {
			return ctx
		}
	}
	return slotContext{ctx, slot}
}

// deadlines hands out shared deadline contexts, one per time slot of timeout/8 (at
// least a millisecond): a call starting in a slot gets that slot's context, whose
// deadline is the slot's end plus the timeout, so every call is bounded by a deadline
// between timeout and timeout × 1.125 after it starts (100ms: at most 112.5ms).
// A context.WithTimeout per call is an allocation, a runtime timer armed and stopped,
// and on a busy replica up to a tenth of a decision's client CPU; a slot's context is
// one timer per slot, a hundred a second at the default timeout, whatever the rate.
// Its deadline fires Done, so go-redis's pool wait and retry backoff end at it as they
// would at a deadline of their own.
type deadlines struct {
	slot    time.Duration
	timeout time.Duration
	mu      sync.Mutex
	cur     atomic.Pointer[deadlineSlot]
}

type deadlineSlot struct {
	ctx context.Context
	// ends is the slot's end, in Unix nanoseconds: a call starting later takes the
	// next slot.
	ends int64
	// cancel releases the context's timer; the deadline does it anyway, so it is
	// only kept for the vet check that a cancel is never lost.
	cancel context.CancelFunc
}

func newDeadlines(timeout time.Duration) *deadlines {
	return &deadlines{slot: max(timeout/8, time.Millisecond), timeout: timeout}
}

// at is the context of the slot now falls in.
func (d *deadlines) at(now time.Time) context.Context {
	n := now.UnixNano()
	if s := d.cur.Load(); s != nil && n < s.ends && n >= s.ends-int64(d.slot) {
		return s.ctx
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if s := d.cur.Load(); s != nil && n < s.ends && n >= s.ends-int64(d.slot) {
		return s.ctx
	}
	start := n - n%int64(d.slot)
	ends := start + int64(d.slot)
	ctx, cancel := context.WithDeadline(context.Background(), time.Unix(0, ends).Add(d.timeout))
	d.cur.Store(&deadlineSlot{ctx: ctx, ends: ends, cancel: cancel})
	return ctx
}

// slotContext is a caller's context (its values) under its slot's deadline, Done and
// Err.
type slotContext struct {
	context.Context
	slot context.Context
}

func (c slotContext) Deadline() (time.Time, bool) { return c.slot.Deadline() }
func (c slotContext) Done() <-chan struct{}       { return c.slot.Done() }
func (c slotContext) Err() error                  { return c.slot.Err() }

// bucketArgs is one bucket's rate as the script reads it: refill in tokens per
// microsecond and burst, as two little-endian doubles (struct '<dd').
type bucketArgs string

func argsOf(r space.Rate) bucketArgs {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], math.Float64bits(r.RefillRPS/1e6))
	binary.LittleEndian.PutUint64(b[8:], math.Float64bits(float64(r.Burst)))
	return bucketArgs(b[:])
}

// withFloor is args with the floor a take must leave in the bucket (bucket.lua's
// '<ddd' of a single bucket).
func withFloor(args bucketArgs, floor int64) bucketArgs {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], math.Float64bits(float64(floor)))
	return args + bucketArgs(b[:])
}

// decide runs the script over one bucket (second == "") or two, the second with its
// soft limit when soft is not empty, and returns whether the decision admitted, each
// bucket's state, whether it was a soft breach, and the Redis time it was made at
// (µs).
func (r runner) decide(ctx context.Context, cost string, keys []string, first, second, soft bucketArgs) (admitted bool, states []BucketState, breach bool, now float64, err error) {
	rates := string(first + second + soft)
	v, err := r.run(ctx, func(ctx context.Context) (any, error) {
		return r.script(ctx, bucketScript, keys, cost, rates).Text()
	})
	if err != nil {
		return false, nil, false, 0, err
	}
	return parseReply(v.(string), len(keys))
}

// parseReply reads the script's reply: '<Bddd' for one bucket (admitted, its level
// and the µs until it holds the cost, the time), '<BddddBd' for two (admitted, both
// buckets' level and wait, the soft breach, the time).
func parseReply(reply string, buckets int) (bool, []BucketState, bool, float64, error) {
	want := 1 + 16*buckets + 8
	if buckets == 2 {
		want++
	}
	if len(reply) != want {
		return false, nil, false, 0, fmt.Errorf("bucket script: unexpected reply %q", reply)
	}
	states := make([]BucketState, buckets)
	for i := range states {
		states[i] = BucketState{Remaining: double(reply, 1+16*i), Refill: micros(double(reply, 9+16*i))}
	}
	breach := buckets == 2 && reply[1+16*buckets] == 1
	return reply[0] == 1, states, breach, double(reply, want-8), nil
}

// double reads the little-endian double at offset at of a script's reply.
func double(reply string, at int) float64 {
	return math.Float64frombits(binary.LittleEndian.Uint64([]byte(reply[at : at+8])))
}

// micros converts the script's microseconds to a Duration, rounded up so that a
// retry is never early, and saturating at the longest Duration (about 292 years) for a
// bucket that refills slower than that or never.
func micros(us float64) time.Duration {
	ns := math.Ceil(us * float64(time.Microsecond))
	if !(ns < math.MaxInt64) {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(ns)
}
