package bench

import (
	"context"
	"fmt"
	"strconv"
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

	// The quiet client's p99 ms per run, against space-api and against the peer
	// (chi + redis_rate, the same limits per client, the same floods).
	Space, Peer NeighbourArms
	// Success is the quiet client's share of creates answered 201 by space-api, the
	// worst of the three arms, per run.
	Success []float64
	// FixedFloodRPS and SaturatedFloodRPS are the flooder's answers per second from
	// space-api.
	FixedFloodRPS, SaturatedFloodRPS []float64
	// Outcomes are the quiet client's answers from space-api, all arms and runs.
	Outcomes map[string]int
}

// NeighbourArms are one server's quiet-client p99s (ms) per run, by arm.
type NeighbourArms struct {
	Alone, Burst, Fixed, Saturated []float64
}

// runNeighbour measures the quiet neighbour on srv, whose flags give bench-quiet a
// rate far above what it sends and bench-flood the flood scenario's rate, then the
// same arms on the peer (chi + redis_rate on redisAddr, with the same two limits).
func runNeighbour(ctx context.Context, env *Env, srv *apiServer, redisAddr string, runs int, sz sizes) (*NeighbourResult, error) {
	res := &NeighbourResult{QuietSend: sz.quietSend, FixedFlood: sz.fixedFlood, Connections: sz.httpWorkers,
		Duration: sz.floodDur.String(), Settle: sz.floodDur / 8, Outcomes: map[string]int{}}
	limit := func(client string, rate float64) string {
		r := strconv.Itoa(int(rate))
		return "-limit=" + client + ":" + r + ":" + r + ":1s"
	}
	peer, err := env.startPeer(ctx, peerRedisRate, redisAddr, limit("bench-flood", sz.floodRate), limit("bench-quiet", float64(4*sz.quietSend)))
	if err != nil {
		return nil, err
	}
	defer peer.stop()
	for range runs {
		arms, success, fixedRPS, saturatedRPS, err := res.arms(ctx, env, srv, sz, res.Outcomes)
		if err != nil {
			return nil, err
		}
		res.Space.add(arms)
		res.Success = append(res.Success, success)
		res.FixedFloodRPS = append(res.FixedFloodRPS, fixedRPS)
		res.SaturatedFloodRPS = append(res.SaturatedFloodRPS, saturatedRPS)
		arms, _, _, _, err = res.arms(ctx, env, peer, sz, nil)
		if err != nil {
			return nil, err
		}
		res.Peer.add(arms)
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

// neighbourRun is one run's quiet-client p99s, ms.
type neighbourRun struct{ alone, burst, fixed, saturated float64 }

func (a *NeighbourArms) add(r neighbourRun) {
	a.Alone = append(a.Alone, r.alone)
	a.Burst = append(a.Burst, r.burst)
	a.Fixed = append(a.Fixed, r.fixed)
	a.Saturated = append(a.Saturated, r.saturated)
}

// arms runs the three arms once against srv: the quiet client alone, beside the fixed
// flood (the quiet client's creates split at Settle), beside wrk's flood. It returns
// the p99s, the quiet client's worst success (% answered 201) and the flooder's
// answers/s in the two floods, and adds the quiet client's answers to outcomes (when
// not nil).
func (n *NeighbourResult) arms(ctx context.Context, env *Env, srv *apiServer, sz sizes, outcomes map[string]int) (r neighbourRun, success, fixedRPS, saturatedRPS float64, err error) {
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
		return r, 0, 0, 0, wrkErr
	}
	if err := srv.alive(); err != nil {
		return r, 0, 0, 0, err
	}
	if alone.Requests == 0 || fixed.Requests == 0 || saturated.Requests == 0 {
		return r, 0, 0, 0, fmt.Errorf("neighbour: the quiet client sent nothing")
	}
	r = neighbourRun{
		alone:     ms(alone.latency("", 99)),
		burst:     ms(fixed.latencyWithin(0, n.Settle, 99)),
		fixed:     ms(fixed.latencyWithin(n.Settle, 0, 99)),
		saturated: ms(saturated.latency("", 99)),
	}
	success = min(succeeded(alone), succeeded(fixed), succeeded(saturated))
	for _, l := range []*loadResult{alone, fixed, saturated} {
		for k, v := range l.Outcomes {
			if outcomes != nil {
				outcomes[k] += v
			}
		}
	}
	return r, success, flood.rps(""), float64(wrk.Requests) / max(wrk.Elapsed.Seconds(), 1e-9), nil
}

// targets are the quiet neighbour's goals: its p99 within 1.25× of its own alone
// under the fixed flood over its rate, within 2× under the flood as fast as wrk goes,
// and every create answered 201.
func (n *NeighbourResult) targets() []Target {
	fixed, saturated := ratioStats(n.Space.Fixed, n.Space.Alone), ratioStats(n.Space.Saturated, n.Space.Alone)
	success := summarize(n.Success)
	return []Target{
		{fmt.Sprintf("a quiet neighbour's p99 ≤ 1.25× its own alone, beside a %d/s flood", n.FixedFlood), fixed.format("%.2f×"), fixed.Median <= 1.25},
		{"a quiet neighbour's p99 ≤ 2× its own alone, beside a flood as fast as wrk goes", saturated.format("%.2f×"), saturated.Median <= 2},
		{"the quiet neighbour keeps 100% success beside both floods", success.format("%.1f%%"), success.Min >= 100},
	}
}
