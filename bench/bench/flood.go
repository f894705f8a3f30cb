package bench

import (
	"context"
	"fmt"
	"sync"
)

// FloodResult is the flood scenario: per run, the well-behaved client's success rate
// and latency, and what the flooding client's requests cost Redis.
type FloodResult struct {
	FloodRate, GoodRate float64 // the clients' refill rates, tokens/s
	FloodSend, GoodSend int     // what each sends, creates/s
	ClusterRate         float64
	Duration            string

	GoodSuccess         []float64 // % of the good client's creates answered 201
	GoodP50, GoodP99    []float64 // ms
	FloodAdmitted       []float64 // the flooder's 201s per second
	FloodRejectP50      []float64 // ms, the flooder's 429s
	CallsPerRequest     []float64 // Redis commands sent per create (both clients)
	EvalshaPerRequest   []float64
	RedisUsecPerRequest []float64 // Redis CPU per create
	// RedisErrors are the decisions of the lease and of admission that failed (Redis
	// timed out or refused) and so were let through (failure mode open), per run.
	RedisErrors          []float64
	GoodOutcomes         map[string]int
	FloodOutcomes        map[string]int
	GoodTotal, FloodSent int
	// Neighbour is the quiet neighbour's latency beside the two floods.
	Neighbour *NeighbourResult
}

// runFlood runs one client at 20× its rate beside another at half its own, both on
// one space-api with a private Redis, and counts the Redis commands of the run from
// INFO commandstats.
func runFlood(ctx context.Context, env *Env, runs int, sz sizes) (*FloodResult, error) {
	st, err := env.newStack(ctx)
	if err != nil {
		return nil, err
	}
	defer st.close()
	db, rs, rdb := st.db, st.redis, st.client

	// The cluster bucket holds more than both clients' rates together, as an operator
	// would set it: what protects the well-behaved client is the flooder's own bucket.
	cluster := 4 * (sz.floodRate + sz.goodRate + float64(sz.quietSend))
	res := &FloodResult{
		FloodRate: sz.floodRate, GoodRate: sz.goodRate,
		FloodSend: int(20 * sz.floodRate), GoodSend: max(1, int(sz.goodRate/2)),
		ClusterRate: cluster, Duration: sz.floodDur.String(),
		GoodOutcomes: map[string]int{}, FloodOutcomes: map[string]int{},
	}
	flags, err := flagsFile(
		map[string]quota{"bench-flood": {Concurrency: 50}, "bench-good": {Concurrency: 50}, "bench-quiet": {Concurrency: 50}},
		map[string]*rateEntry{
			"bench-flood": {RefillRPS: sz.floodRate, Burst: int64(sz.floodRate)},
			"bench-good":  {RefillRPS: sz.goodRate, Burst: int64(sz.goodRate)},
			"bench-quiet": {RefillRPS: float64(4 * sz.quietSend), Burst: int64(4 * sz.quietSend)},
		}, nil)
	if err != nil {
		return nil, err
	}
	srv, err := env.startServer(ctx, serverConfig{Name: "flood", DB: db, RedisAddr: rs.Addr, Flags: flags, Env: map[string]string{
		"SPACE_CLUSTER_ACTIVATION_ADMISSION_REFILL_RPS": fmt.Sprint(cluster),
		"SPACE_CLUSTER_ACTIVATION_ADMISSION_BURST":      fmt.Sprint(int64(cluster)),
	}})
	if err != nil {
		return nil, err
	}
	defer srv.stop()

	// Unmeasured first: a server that meets 1,000 creates/s cold (no Postgres or Redis
	// connections yet, no prepared statements) falls behind, and an open loop only
	// piles up from there.
	warm := load{URL: srv.PublicURL, Client: "bench-flood", Body: coldBody, Rate: res.FloodSend / 2, Duration: sz.httpWarmUp}
	warm.run(ctx)
	warm.Rate = res.FloodSend
	warm.run(ctx)
	for range runs {
		errorsBefore, err := failedDecisions(ctx, srv)
		if err != nil {
			return nil, err
		}
		before, err := commandStats(ctx, rdb)
		if err != nil {
			return nil, err
		}
		var good, flood *loadResult
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			flood = load{Name: "flood", URL: srv.PublicURL, Client: "bench-flood", Body: coldBody, Rate: res.FloodSend, Duration: sz.floodDur}.run(ctx)
		}()
		go func() {
			defer wg.Done()
			good = load{Name: "good", URL: srv.PublicURL, Client: "bench-good", Body: coldBody, Rate: res.GoodSend, Duration: sz.floodDur}.run(ctx)
		}()
		wg.Wait()
		after, err := commandStats(ctx, rdb)
		if err != nil {
			return nil, err
		}
		if err := srv.alive(); err != nil {
			return nil, err
		}
		errorsAfter, err := failedDecisions(ctx, srv)
		if err != nil {
			return nil, err
		}
		res.RedisErrors = append(res.RedisErrors, errorsAfter-errorsBefore)
		calls, usec, per := topLevelDelta(before, after)
		total := float64(good.Requests + flood.Requests)
		if total == 0 {
			return nil, fmt.Errorf("the flood sent nothing")
		}
		res.GoodSuccess = append(res.GoodSuccess, 100*float64(good.count("201"))/float64(max(good.Requests, 1)))
		res.GoodP50 = append(res.GoodP50, ms(good.latency("", 50)))
		res.GoodP99 = append(res.GoodP99, ms(good.latency("", 99)))
		res.FloodAdmitted = append(res.FloodAdmitted, flood.rps("201"))
		res.FloodRejectP50 = append(res.FloodRejectP50, ms(flood.latency("429", 50)))
		res.CallsPerRequest = append(res.CallsPerRequest, float64(calls)/total)
		res.EvalshaPerRequest = append(res.EvalshaPerRequest, float64(per["evalsha"]+per["eval"])/total)
		res.RedisUsecPerRequest = append(res.RedisUsecPerRequest, float64(usec)/total)
		for k, v := range good.Outcomes {
			res.GoodOutcomes[k] += v
		}
		for k, v := range flood.Outcomes {
			res.FloodOutcomes[k] += v
		}
		res.GoodTotal += good.Requests
		res.FloodSent += flood.Requests
	}
	if res.Neighbour, err = runNeighbour(ctx, env, srv, rs.Addr, runs, sz); err != nil {
		return nil, err
	}
	env.logf("flood: done")
	return res, nil
}

// failedDecisions sums the failed concurrency and admission decisions a server has
// counted (decision="error"; failure mode open lets those requests through).
func failedDecisions(ctx context.Context, s *apiServer) (float64, error) {
	body, err := httpGet(ctx, s.InternalURL+"/metrics")
	if err != nil {
		return 0, err
	}
	// Admission counts an error once per bucket it would have charged; the cluster
	// bucket's series counts each failed decision once.
	return sumMetric(body, "space_sandbox_admission_rate_decisions_total", "decision", "error", "bucket", "cluster_activation") +
		sumMetric(body, "space_client_concurrency_decisions_total", "decision", "error"), nil
}
