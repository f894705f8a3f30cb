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
//
// The fixed flood starts with the flooder's bucket full (it refilled while the quiet
// client ran alone): its first creates are admitted, cold, as its burst allows, and
// only then is it a flood over its rate. The quiet client's creates sent in the
// flood's first Settle are its p99 beside that burst (BurstP99, reported, no target);
// FixedP99 is those sent after, beside the flood over its rate.
type NeighbourResult struct {
	QuietSend   int // the quiet client's creates/s, well within its rate
	FixedFlood  int // the fixed flood's creates/s
	Connections int // wrk's connections for the flood as fast as it goes
	Duration    string
	Settle      time.Duration

	// What space-api and the peer (chi + redis_rate, the same limits per client, the
	// same floods) did.
	Space, Peer NeighbourArms
}

// NeighbourArms are one server's figures per run: the quiet client's p99 (ms) by arm,
// its worst success, the flooder's answers per second.
type NeighbourArms struct {
	Alone, Burst, Fixed, Saturated []float64
	// Success is the quiet client's share of creates answered 201, the worst of the
	// three arms.
	Success []float64
	// FixedFloodRPS and SaturatedFloodRPS are the flooder's answers per second.
	FixedFloodRPS, SaturatedFloodRPS []float64
	// Outcomes are the quiet client's answers, all arms and runs.
	Outcomes map[string]int
}

// runNeighbour measures the quiet neighbour on srv, whose flags give bench-quiet a
// rate far above what it sends and bench-flood the flood scenario's rate, then the
// same arms on peer (chi + redis_rate, with the same limits).
func runNeighbour(ctx context.Context, env *Env, srv, peer *apiServer, runs int, sz sizes) (*NeighbourResult, error) {
	res := &NeighbourResult{QuietSend: sz.quietSend, FixedFlood: sz.fixedFlood, Connections: sz.httpWorkers,
		Duration: sz.floodDur.String(), Settle: sz.floodDur / 8}
	for range runs {
		if err := res.arms(ctx, env, srv, sz, &res.Space); err != nil {
			return nil, err
		}
		if err := res.arms(ctx, env, peer, sz, &res.Peer); err != nil {
			return nil, err
		}
	}
	env.logf("flood: quiet neighbour done")
	return res, nil
}

// namedArms are one server's arms under the name the report gives it.
type namedArms struct {
	name string
	arms NeighbourArms
}

// servers are space-api's arms and the peer's.
func (n *NeighbourResult) servers() []namedArms {
	return []namedArms{{"space-api", n.Space}, {"peer: chi + redis_rate", n.Peer}}
}

// arms runs the three arms once against srv: the quiet client alone, beside the fixed
// flood (the quiet client's creates split at Settle), beside wrk's flood; and adds the
// run's figures to to.
func (n *NeighbourResult) arms(ctx context.Context, env *Env, srv *apiServer, sz sizes, to *NeighbourArms) error {
	quiet := load{Name: "quiet", URL: srv.PublicURL, Client: "bench-quiet", Body: coldBody, Rate: sz.quietSend, Duration: sz.floodDur}
	succeeded := func(l *loadResult) float64 { return 100 * float64(l.count("201")) / float64(max(l.Requests, 1)) }
	alone := quiet.run(ctx)

	// The fixed flood and the quiet client start together; the quiet client runs
	// Settle longer, so that as many of its creates as alone are sent beside the
	// flood over its rate.
	var fixed, flood *loadResult
	var wg sync.WaitGroup
	wg.Go(func() {
		flood = load{Name: "fixed flood", URL: srv.PublicURL, Client: "bench-flood", Body: coldBody, Rate: sz.fixedFlood, Duration: n.Settle + sz.floodDur}.run(ctx)
	})
	wg.Go(func() {
		q := quiet
		q.Duration += n.Settle
		fixed = q.run(ctx)
	})
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
		return wrkErr
	}
	if err := srv.alive(); err != nil {
		return err
	}
	if alone.Requests == 0 || fixed.Requests == 0 || saturated.Requests == 0 {
		return fmt.Errorf("neighbour: the quiet client sent nothing")
	}
	to.Alone = append(to.Alone, ms(alone.latency("", 99)))
	to.Burst = append(to.Burst, ms(fixed.latencyWithin(0, n.Settle, 99)))
	to.Fixed = append(to.Fixed, ms(fixed.latencyWithin(n.Settle, 0, 99)))
	to.Saturated = append(to.Saturated, ms(saturated.latency("", 99)))
	to.Success = append(to.Success, min(succeeded(alone), succeeded(fixed), succeeded(saturated)))
	to.FixedFloodRPS = append(to.FixedFloodRPS, flood.rps(""))
	to.SaturatedFloodRPS = append(to.SaturatedFloodRPS, float64(wrk.Requests)/max(wrk.Elapsed.Seconds(), 1e-9))
	if to.Outcomes == nil {
		to.Outcomes = map[string]int{}
	}
	for _, l := range []*loadResult{alone, fixed, saturated} {
		for k, v := range l.Outcomes {
			to.Outcomes[k] += v
		}
	}
	return nil
}

// targets are the quiet neighbour's goals: its p99 within 1.25× of its own alone
// under the fixed flood over its rate, within 2× under the flood as fast as wrk goes,
// and every create answered 201.
func (n *NeighbourResult) targets() []Target {
	fixed, saturated := ratioStats(n.Space.Fixed, n.Space.Alone), ratioStats(n.Space.Saturated, n.Space.Alone)
	success := summarize(n.Space.Success)
	return []Target{
		{fmt.Sprintf("a quiet neighbour's p99 ≤ 1.25× its own alone, beside a %d/s flood", n.FixedFlood), fixed.format("%.2f×"), fixed.Median <= 1.25},
		{"a quiet neighbour's p99 ≤ 2× its own alone, beside a flood as fast as wrk goes", saturated.format("%.2f×"), saturated.Median <= 2},
		{"the quiet neighbour keeps 100% success beside both floods", success.format("%.1f%%"), success.Min >= 100},
	}
}
