package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/admission"
	"github.com/space-sandbox/space/internal/testenv"
)

// Implementations compared in the script and decisions scenarios.
const (
	implSpace       = "space"         // Admit with a client rate: two keys, one script
	implSpaceOneKey = "space_one_key" // Admit without a client rate: the cluster key alone
	implRedisRate   = "redis_rate"    // redis_rate v10 Limiter.Allow: one key, GCRA
	// The two-bucket decision with a soft limit checked in the same script.
	implSpaceSoft = "space_soft"
	// A charge of a tier with a reserve of the cluster bucket (reserve.lua): the
	// shared remainder, the tier's reserve and the client key.
	implSpaceReserved = "space_reserved"
)

// benchReservations share bigRate out: half for the tier "pro" (half of that
// lendable), half shared.
var benchReservations = &space.Reservations{
	Shared: space.Rate{RefillRPS: bigRate.RefillRPS / 2, Burst: bigRate.Burst / 2},
	Reserves: []space.TierReserve{{Tier: "pro", Reserve: space.Reserve{
		Rate: space.Rate{RefillRPS: bigRate.RefillRPS / 2, Burst: bigRate.Burst / 2}, Lendable: 0.5}}},
}

// chargeDecider is the allow path of a charge as the activation flow makes it, with
// the soft limit (implSpaceSoft) or the tier's reserve (implSpaceReserved) that the
// two-bucket decision lacks, on fresh keys.
func chargeDecider(rdb redis.UniversalClient, impl string) (decider, error) {
	opts := admitterOptions(rdb, "bench"+testenv.RandomID(4), bigRate)
	rate := bigRate
	c := space.Charge{Key: "bench-client", Rate: &rate, Cost: 1}
	switch impl {
	case implSpaceSoft:
		c.Soft = &space.Rate{RefillRPS: bigRate.RefillRPS / 2, Burst: bigRate.Burst / 2}
	case implSpaceReserved:
		opts.Reservations = func() *space.Reservations { return benchReservations }
		c.Tier, c.Reservations = "pro", benchReservations
	}
	a, err := admission.New(opts)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) (bool, error) {
		_, err := a.Charge(ctx, c)
		if space.ErrorCode(err) == space.ELIMITED {
			return false, nil
		}
		return err == nil, err
	}, nil
}

// decider makes one decision and says whether it admitted.
type decider func(ctx context.Context) (bool, error)

// bigRate admits every call of a benchmark: a bucket too large to empty.
var bigRate = space.Rate{RefillRPS: 1e6, Burst: 1e6}

// emptyRate rejects every call after the first: one token that never comes back.
var emptyRate = space.Rate{RefillRPS: 0, Burst: 1}

// newAdmitter is an Admitter as space-api builds it, through a circuit breaker of its
// own, failing closed so that an error shows as an error rather than as a fail-open
// admission.
func newAdmitter(rdb redis.UniversalClient, prefix string, cluster space.Rate) (*admission.Admitter, error) {
	return admission.New(admitterOptions(rdb, prefix, cluster))
}

// admitterOptions are newAdmitter's options, for a caller that adds to them: as
// space-api builds its Admitter, batching at SPACE_REDIS_BATCH_ABOVE's default.
func admitterOptions(rdb redis.UniversalClient, prefix string, cluster space.Rate) admission.Options {
	return admission.Options{Redis: rdb, Prefix: prefix, Enabled: true, FailClosed: true,
		Cluster: cluster, Timeout: time.Second, Breaker: admission.NewBreaker(admission.BreakerOptions{}),
		BatchAbove: admission.DefaultBatchAbove}
}

// charge1 charges one activation of cost 1 to client (rate nil: the cluster bucket
// alone) as the product does, through Charge: admitted, refused (a *space.LimitError,
// not an error here), or an error. The bench's Admitters fail closed, so a Redis
// failure is an error, never counted as an admission.
func charge1(ctx context.Context, a *admission.Admitter, client space.ClientKey, rate *space.Rate) (bool, error) {
	_, err := a.Charge(ctx, space.Charge{Key: client, Rate: rate, Cost: 1})
	if _, refused := errors.AsType[*space.LimitError](err); refused {
		return false, nil
	}
	return err == nil, err
}

// spaceDecider decides on its own fresh keys; allow false empties them first, so
// that every later call takes the reject path.
func spaceDecider(ctx context.Context, rdb redis.UniversalClient, withClient, allow bool) (decider, error) {
	r := bigRate
	if !allow {
		r = emptyRate
	}
	a, err := newAdmitter(rdb, "bench"+testenv.RandomID(4), r)
	if err != nil {
		return nil, err
	}
	var clientRate *space.Rate
	if withClient {
		clientRate = &r
	}
	decide := func(ctx context.Context) (bool, error) {
		return charge1(ctx, a, "bench-client", clientRate)
	}
	if !allow {
		if _, err := decide(ctx); err != nil {
			return nil, err
		}
	}
	return decide, nil
}

// redisRateDecider is the peer: redis_rate's Allow on one fresh key.
func redisRateDecider(ctx context.Context, rdb redis.UniversalClient, allow bool) (decider, error) {
	lim := redis_rate.NewLimiter(rdb)
	key := "bench" + testenv.RandomID(4)
	limit := redis_rate.Limit{Rate: 1e6, Burst: 1e6, Period: time.Second}
	if !allow {
		limit = redis_rate.Limit{Rate: 1, Burst: 1, Period: 1000 * time.Hour}
	}
	decide := func(ctx context.Context) (bool, error) {
		res, err := lim.Allow(ctx, key, limit)
		if err != nil {
			return false, err
		}
		return res.Allowed == 1, nil
	}
	if !allow {
		if _, err := decide(ctx); err != nil {
			return nil, err
		}
	}
	return decide, nil
}

func newDecider(ctx context.Context, rdb redis.UniversalClient, impl string, allow bool) (decider, error) {
	switch impl {
	case implSpace:
		return spaceDecider(ctx, rdb, true, allow)
	case implSpaceOneKey:
		return spaceDecider(ctx, rdb, false, allow)
	case implSpaceSoft, implSpaceReserved:
		if !allow {
			return nil, fmt.Errorf("%s is measured on the allow path only", impl)
		}
		return chargeDecider(rdb, impl)
	default:
		return redisRateDecider(ctx, rdb, allow)
	}
}

// decideN makes n decisions on g goroutines and fails on an error or a decision off
// the expected path.
func decideN(ctx context.Context, decide decider, n, g int, allow bool) error {
	var wg sync.WaitGroup
	errs := make(chan error, g)
	per := n / g
	for i := range g {
		count := per
		if i == 0 {
			count += n - per*g
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range count {
				ok, err := decide(ctx)
				if err != nil {
					errs <- err
					return
				}
				if ok != allow {
					errs <- fmt.Errorf("admitted = %v on the allow=%v path", ok, allow)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// ScriptCell is one implementation on one path: Redis CPU µs per call, per run.
type ScriptCell struct {
	Impl, Path string
	Usec       []float64
	// CPUUsec is the Redis main thread's CPU time per decision (getrusage, the
	// network handling of each call included), which preemption does not inflate.
	CPUUsec []float64
	// Instructions is what Redis ran per decision under callgrind, the network
	// handling of each call included: the one figure the load does not move.
	Instructions float64
}

// ScriptResult is the script-cost scenario.
type ScriptResult struct {
	Calls int // decisions per cell and run
	// InstructionCalls is the decisions per cell under callgrind (one run: the count
	// does not depend on the load).
	InstructionCalls int
	Cells            []*ScriptCell
	// Batched is the two-bucket allow path from many goroutines under callgrind, where
	// the decisions that wait go to Redis as one batch script call.
	Batched *BatchedInstructions
}

// BatchedInstructions is what Redis ran per decision when Goroutines decide at once
// (the Admitter's coalescer batching the ones that wait), and how many decisions a
// script call carried.
type BatchedInstructions struct {
	Goroutines, Decisions int
	Calls                 int64
	Instructions          float64
}

// Cell returns the cell of impl on path.
func (r *ScriptResult) Cell(impl, path string) *ScriptCell {
	for _, c := range r.Cells {
		if c.Impl == impl && c.Path == path {
			return c
		}
	}
	return &ScriptCell{Impl: impl, Path: path}
}

// runScript measures Redis CPU per decision: for each run, each path and each
// implementation in turn, CONFIG RESETSTAT, n decisions, then usec/calls of
// cmdstat_evalsha (the script and the commands it ran) from INFO commandstats, on a
// private redis-server that nothing else talks to.
func runScript(ctx context.Context, env *Env, runs int, sz sizes) (*ScriptResult, error) {
	srv, err := startRedis(ctx, env.Dir)
	if err != nil {
		return nil, err
	}
	defer srv.Stop()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	defer rdb.Close()

	res := &ScriptResult{Calls: sz.scriptCalls}
	for _, path := range []string{"allow", "reject"} {
		for _, impl := range []string{implSpace, implSpaceOneKey, implRedisRate} {
			res.Cells = append(res.Cells, &ScriptCell{Impl: impl, Path: path})
		}
	}
	// What an admitted activation costs with a soft limit, and for a tier with a
	// reserve, beside the plain two-bucket decision in the same runs.
	for _, impl := range []string{implSpaceSoft, implSpaceReserved} {
		res.Cells = append(res.Cells, &ScriptCell{Impl: impl, Path: "allow"})
	}
	for run := range runs {
		// Each run takes the implementations in another order, so that none always
		// follows the same one.
		for _, c := range rotate(res.Cells, run) {
			allow := c.Path == "allow"
			decide, err := newDecider(ctx, rdb, c.Impl, allow)
			if err != nil {
				return nil, fmt.Errorf("%s/%s: %w", c.Impl, c.Path, err)
			}
			// One call loads the script, so that every measured call is an EVALSHA.
			if _, err := decide(ctx); err != nil {
				return nil, err
			}
			if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
				return nil, fmt.Errorf("CONFIG RESETSTAT: %w", err)
			}
			// One goroutine: Redis is then never preempted by the bench's own callers
			// in the middle of a call, which usec (wall time in Redis) would count.
			cpu, err := redisCPUOf(ctx, rdb, func() error { return decideN(ctx, decide, sz.scriptCalls, 1, allow) })
			if err != nil {
				return nil, fmt.Errorf("%s/%s: %w", c.Impl, c.Path, err)
			}
			stats, err := commandStats(ctx, rdb)
			if err != nil {
				return nil, err
			}
			st := stats["evalsha"]
			if st.Calls < int64(sz.scriptCalls) {
				return nil, fmt.Errorf("%s/%s: EVALSHA ran %d times for %d decisions", c.Impl, c.Path, st.Calls, sz.scriptCalls)
			}
			c.Usec = append(c.Usec, float64(st.Usec)/float64(st.Calls))
			c.CPUUsec = append(c.CPUUsec, float64(cpu.Microseconds())/float64(sz.scriptCalls))
		}
		env.logf("script: run %d/%d done", run+1, runs)
	}
	if err := countInstructions(ctx, env, res, sz.instructionCalls); err != nil {
		return nil, err
	}
	return res, nil
}

// rotate returns s starting at element k mod len(s), wrapping around.
func rotate[T any](s []T, k int) []T {
	if len(s) == 0 {
		return s
	}
	k %= len(s)
	return append(append([]T(nil), s[k:]...), s[:k]...)
}
