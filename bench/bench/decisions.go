package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// DecisionsCell is one implementation, topology and goroutine count: decisions/s
// from Go, per run.
type DecisionsCell struct {
	Impl, Topology string
	Goroutines     int
	PerSec         []float64
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
					n, elapsed, err := decideFor(ctx, decide, g, sz.decisionsDur)
					if err != nil {
						rdb.Close()
						return nil, fmt.Errorf("%s %s g=%d: %w", c.Impl, topo.name, g, err)
					}
					c.PerSec = append(c.PerSec, float64(n)/elapsed.Seconds())
				}
			}
		}
		rdb.Close()
		env.logf("decisions: %s done", topo.name)
	}
	return res, nil
}

// decideFor runs decide on g goroutines for d (allow path) and returns how many
// decisions were made and in how long.
func decideFor(ctx context.Context, decide decider, g int, d time.Duration) (int64, time.Duration, error) {
	var n atomic.Int64
	var wg sync.WaitGroup
	var firstErr error
	var once sync.Once
	start := time.Now()
	deadline := start.Add(d)
	for range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				ok, err := decide(ctx)
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
	return n.Load(), time.Since(start), firstErr
}
