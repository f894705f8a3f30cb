package bench

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// NeighbourResult is the flood scenario's second part: the create latency of a quiet
// client alone, beside a flood at a fixed rate (open loop) and beside a flood as fast
// as wrk goes (closed loop), each run's three arms back to back on the same server.
// The flooder is over its rate throughout, so nearly all its creates are refused.
type NeighbourResult struct {
	QuietSend   int // the quiet client's creates/s, well within its rate
	FixedFlood  int // the fixed flood's creates/s
	Connections int // wrk's connections for the flood as fast as it goes
	Duration    string

	AloneP99, FixedP99, SaturatedP99 []float64 // the quiet client's p99 ms per run
	// Success is the quiet client's share of creates answered 201, the worst of the
	// three arms, per run.
	Success []float64
	// FixedFloodRPS and SaturatedFloodRPS are the flooder's answers per second.
	FixedFloodRPS, SaturatedFloodRPS []float64
}

// runNeighbour measures the quiet neighbour on srv, whose flags give bench-quiet a
// rate far above what it sends and bench-flood the flood scenario's rate.
func runNeighbour(ctx context.Context, env *Env, srv *apiServer, runs int, sz sizes) (*NeighbourResult, error) {
	res := &NeighbourResult{QuietSend: sz.quietSend, FixedFlood: sz.fixedFlood, Connections: sz.httpWorkers, Duration: sz.floodDur.String()}
	quiet := load{Name: "quiet", URL: srv.PublicURL, Client: "bench-quiet", Body: coldBody, Rate: sz.quietSend, Duration: sz.floodDur}
	success := func(l *loadResult) float64 { return 100 * float64(l.count("201")) / float64(max(l.Requests, 1)) }
	for range runs {
		alone := quiet.run(ctx)

		var fixed, flood *loadResult
		var wg sync.WaitGroup
		wg.Go(func() {
			flood = load{Name: "fixed flood", URL: srv.PublicURL, Client: "bench-flood", Body: coldBody, Rate: sz.fixedFlood, Duration: sz.floodDur}.run(ctx)
		})
		wg.Go(func() { fixed = quiet.run(ctx) })
		wg.Wait()

		var saturated *loadResult
		var wrk *wrkResult
		var wrkErr error
		wg.Go(func() {
			wrk, wrkErr = env.runWrk(ctx, wrkLoad{Name: "saturating flood", URL: srv.PublicURL, Client: "bench-flood", Body: coldBody,
				Connections: sz.httpWorkers, Duration: max(sz.floodDur, time.Second)})
		})
		wg.Go(func() {
			// wrk connects first; the quiet client starts once the flood is on.
			time.Sleep(100 * time.Millisecond)
			saturated = quiet.run(ctx)
		})
		wg.Wait()
		if wrkErr != nil {
			return nil, wrkErr
		}
		if err := srv.alive(); err != nil {
			return nil, err
		}
		if alone.Requests == 0 || fixed.Requests == 0 || saturated.Requests == 0 {
			return nil, fmt.Errorf("neighbour: the quiet client sent nothing")
		}
		res.AloneP99 = append(res.AloneP99, ms(alone.latency("", 99)))
		res.FixedP99 = append(res.FixedP99, ms(fixed.latency("", 99)))
		res.SaturatedP99 = append(res.SaturatedP99, ms(saturated.latency("", 99)))
		res.Success = append(res.Success, min(success(alone), success(fixed), success(saturated)))
		res.FixedFloodRPS = append(res.FixedFloodRPS, flood.rps(""))
		res.SaturatedFloodRPS = append(res.SaturatedFloodRPS, float64(wrk.Requests)/max(wrk.Elapsed.Seconds(), 1e-9))
	}
	env.logf("flood: quiet neighbour done")
	return res, nil
}

// neighbourTargets are the quiet neighbour's goals: its p99 within 1.25× of its own
// alone under the fixed flood, within 2× under the flood as fast as wrk goes, and
// every create answered 201.
func (n *NeighbourResult) targets() []Target {
	fixed, saturated := ratioStats(n.FixedP99, n.AloneP99), ratioStats(n.SaturatedP99, n.AloneP99)
	success := summarize(n.Success)
	return []Target{
		{fmt.Sprintf("a quiet neighbour's p99 ≤ 1.25× its own alone, beside a %d/s flood", n.FixedFlood), fixed.format("%.2f×"), fixed.Median <= 1.25},
		{"a quiet neighbour's p99 ≤ 2× its own alone, beside a flood as fast as wrk goes", saturated.format("%.2f×"), saturated.Median <= 2},
		{"the quiet neighbour keeps 100% success beside both floods", success.format("%.1f%%"), success.Min >= 100},
	}
}
