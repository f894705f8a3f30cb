package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// DecisionsCell is one implementation, topology and goroutine count: decisions/s
// from Go, per run.
type DecisionsCell struct {
	Impl, Topology string
	Goroutines     int
	PerSec         []float64
	// P50 is a decision's median latency in ms, per run; measured at 1 goroutine only,
	// where it is the latency a caller sees with nothing to wait for.
	P50 []float64
	// PerCall is the decisions a script call carried, per run: more than one when the
	// Admitter sent the ones that waited as one batch.
	PerCall []float64
	// ClientCPU is the driver process's CPU time per decision in µs, per run
	// (getrusage, user and system): what a decision costs the replica's side, the
	// go-redis client's system calls included. Redis's side is the script scenario's.
	ClientCPU []float64
	// RedisCPU is the Redis main threads' CPU time per decision in µs, per run
	// (serverCPU): what a decision costs the Redis every replica shares, reading its
	// request and writing its reply included. Its inverse is how many decisions one
	// Redis core serves a second once Redis, not a replica, is what is short.
	RedisCPU []float64
}

// ownCPU is this process's CPU time so far, user and system.
func ownCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// scriptCalls is a go-redis hook counting the script calls a client sends, alone or
// in pipelines.
type scriptCalls struct{ n atomic.Int64 }

func (h *scriptCalls) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *scriptCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.count(cmd)
		return next(ctx, cmd)
	}
}

func (h *scriptCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			h.count(cmd)
		}
		return next(ctx, cmds)
	}
}

func (h *scriptCalls) count(cmd redis.Cmder) {
	if name := cmd.Name(); name == "evalsha" || name == "eval" {
		h.n.Add(1)
	}
}

// DecisionsResult is the decisions/s scenario.
type DecisionsResult struct {
	Duration time.Duration
	Cells    []*DecisionsCell
}

// Cell returns the cell, or an empty one.
func (r *DecisionsResult) Cell(impl, topology string, goroutines int) *DecisionsCell {
	for _, c := range r.Cells {
		if c.Impl == impl && c.Topology == topology && c.Goroutines == goroutines {
			return c
		}
	}
	return &DecisionsCell{Impl: impl, Topology: topology, Goroutines: goroutines}
}

// benchRedisClient is a client built as space-api builds its own (redisconn.Open in
// internal/redisconn), with a generous timeout: a decision that times out on a busy
// machine would be an error here, not a measurement.
func benchRedisClient(addrs []string) redis.UniversalClient {
	return redis.NewUniversalClient(&redis.UniversalOptions{
		Addrs:                 addrs,
		IsClusterMode:         len(addrs) > 1,
		DialTimeout:           time.Second,
		ReadTimeout:           time.Second,
		WriteTimeout:          time.Second,
		ContextTimeoutEnabled: true,
	})
}

// runDecisions measures decisions/s from Go on the allow path (every call admits and
// writes): for each topology and goroutine count, ours and redis_rate back to back in
// each run, on the services' Redis under a fresh key prefix.
func runDecisions(ctx context.Context, env *Env, runs int, sz sizes) (*DecisionsResult, error) {
	topologies := []struct {
		name  string
		addrs []string
	}{{"standalone", []string{env.RedisAddr}}, {"cluster", env.ClusterAddrs}}
	res := &DecisionsResult{Duration: sz.decisionsDur}
	for _, topo := range topologies {
		if len(topo.addrs) == 0 || topo.addrs[0] == "" {
			return nil, fmt.Errorf("no %s Redis address (run `eval \"$(scripts/services.sh env)\"`)", topo.name)
		}
		rdb := benchRedisClient(topo.addrs)
		calls := &scriptCalls{}
		rdb.AddHook(calls)
		if err := rdb.Ping(ctx).Err(); err != nil {
			rdb.Close()
			return nil, fmt.Errorf("%s redis %v: %w", topo.name, topo.addrs, err)
		}
		for _, g := range []int{1, 8, 32} {
			cells := []*DecisionsCell{
				{Impl: implSpace, Topology: topo.name, Goroutines: g},
				{Impl: implRedisRate, Topology: topo.name, Goroutines: g},
			}
			res.Cells = append(res.Cells, cells...)
			for run := range runs {
				for _, c := range rotate(cells, run) {
					decide, err := newDecider(ctx, rdb, c.Impl, true)
					if err != nil {
						rdb.Close()
						return nil, err
					}
					if _, err := decide(ctx); err != nil { // load the script
						rdb.Close()
						return nil, err
					}
					calls.n.Store(0)
					var n int64
					var elapsed, p50 time.Duration
					cpu := ownCPU()
					served, err := redisCPUOf(ctx, rdb, func() (err error) {
						n, elapsed, p50, err = decideFor(ctx, decide, g, sz.decisionsDur)
						return err
					})
					cpu = ownCPU() - cpu
					if err != nil {
						rdb.Close()
						return nil, fmt.Errorf("%s %s g=%d: %w", c.Impl, topo.name, g, err)
					}
					c.PerSec = append(c.PerSec, float64(n)/elapsed.Seconds())
					if sent := calls.n.Load(); sent > 0 {
						c.PerCall = append(c.PerCall, float64(n)/float64(sent))
					}
					if n > 0 {
						c.ClientCPU = append(c.ClientCPU, float64(cpu.Microseconds())/float64(n))
						c.RedisCPU = append(c.RedisCPU, float64(served.Microseconds())/float64(n))
					}
					if g == 1 {
						c.P50 = append(c.P50, ms(p50))
					}
				}
			}
		}
		rdb.Close()
		env.logf("decisions: %s done", topo.name)
	}
	return res, nil
}

// decideFor runs decide on g goroutines for d (allow path) and returns how many
// decisions were made and in how long; with one goroutine, also the median latency
// of a decision (each call timed; the clock read once a call either way).
func decideFor(ctx context.Context, decide decider, g int, d time.Duration) (int64, time.Duration, time.Duration, error) {
	var n atomic.Int64
	var wg sync.WaitGroup
	var firstErr error
	var once sync.Once
	var latencies []time.Duration
	start := time.Now()
	deadline := start.Add(d)
	for range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for t := time.Now(); t.Before(deadline); {
				ok, err := decide(ctx)
				end := time.Now()
				if g == 1 {
					latencies = append(latencies, end.Sub(t))
				}
				t = end
				if err == nil && !ok {
					err = fmt.Errorf("a decision on the allow path rejected")
				}
				if err != nil {
					once.Do(func() { firstErr = err })
					return
				}
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	return n.Load(), time.Since(start), percentile(latencies, 50), firstErr
}
