package bench

import (
	"context"
	"fmt"
	"maps"
	"sync"

	"github.com/redis/go-redis/v9"
)

// FloodResult is the flood scenario: per run, the well-behaved client's success rate
// and latency, and what the flooding client's requests cost Redis, on space-api and
// on the peer (chi + redis_rate, the same limits per client) in the same run.
type FloodResult struct {
	FloodRate, GoodRate float64 // the clients' refill rates, tokens/s
	FloodSend, GoodSend int     // what each sends, creates/s
	ClusterRate         float64
	Duration            string

	Space, Peer FloodArm
	// Neighbour is the quiet neighbour's latency beside the two floods.
	Neighbour *NeighbourResult
}

// FloodArm is one server's side of the flood, per run.
type FloodArm struct {
	GoodSuccess         []float64 // % of the good client's creates answered 201
	GoodP50, GoodP99    []float64 // ms
	FloodAdmitted       []float64 // the flooder's 201s per second
	FloodRejectP50      []float64 // ms, the flooder's 429s
	CallsPerRequest     []float64 // Redis commands sent per create (both clients)
	EvalshaPerRequest   []float64
	RedisUsecPerRequest []float64 // Redis CPU per create
	// Failed are the decisions that failed, per run: space-api's of the lease and of
	// admission (Redis timed out or refused), let through in failure mode open; the
	// peer's, answered 503.
	Failed               []float64
	GoodOutcomes         map[string]int
	FloodOutcomes        map[string]int
	GoodTotal, FloodSent int
}

// runFlood runs one client at 20× its rate beside another at half its own, on one
// space-api with a private Redis and then on the peer with the same Redis, in each
// run, and counts the Redis commands of each from INFO commandstats.
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
	}
	rates := map[string]*rateEntry{
		"bench-flood": {RefillRPS: sz.floodRate, Burst: int64(sz.floodRate)},
		"bench-good":  {RefillRPS: sz.goodRate, Burst: int64(sz.goodRate)},
		"bench-quiet": {RefillRPS: float64(4 * sz.quietSend), Burst: int64(4 * sz.quietSend)},
	}
	flags, err := flagsFile(
		map[string]quota{"bench-flood": {Concurrency: 50}, "bench-good": {Concurrency: 50}, "bench-quiet": {Concurrency: 50}},
		rates, nil)
	if err != nil {
		return nil, err
	}
	clusterEnv := map[string]string{
		"SPACE_CLUSTER_ACTIVATION_ADMISSION_REFILL_RPS": fmt.Sprint(cluster),
		"SPACE_CLUSTER_ACTIVATION_ADMISSION_BURST":      fmt.Sprint(int64(cluster)),
	}
	srv, err := env.startServer(ctx, serverConfig{Name: "flood", DB: db, RedisAddr: rs.Addr, Flags: flags, Env: clusterEnv})
	if err != nil {
		return nil, err
	}
	defer srv.stop()
	// The peer: each client its own redis_rate limit, its rate and burst as above.
	var limits []string
	for _, client := range []string{"bench-flood", "bench-good", "bench-quiet"} {
		r := rates[client]
		limits = append(limits, fmt.Sprintf("-limit=%s:%d:%d:1s", client, int(r.RefillRPS), r.Burst))
	}
	peer, err := env.startPeer(ctx, peerRedisRate, rs.Addr, limits...)
	if err != nil {
		return nil, err
	}
	defer peer.stop()
	// The quiet neighbour's arms run a third time on space-api in api_key mode, the
	// clients' API keys issued into the same database: there every request's key is
	// read from Postgres before the overload gate, so a flood by one key must not
	// become a flood of reads that the quiet client's own waits behind.
	keyed, err := issueKeys(ctx, db, []string{"bench-flood", "bench-quiet"})
	if err != nil {
		return nil, err
	}
	apiKeys := map[string]string{}
	for i, c := range keyed.clients {
		apiKeys[c] = keyed.secrets[i]
	}
	keyEnv := maps.Clone(clusterEnv)
	keyEnv["SPACE_AUTH_MODE"] = "api_key"
	keySrv, err := env.startServer(ctx, serverConfig{Name: "flood-api-key", DB: db, RedisAddr: rs.Addr, Flags: flags, Env: keyEnv})
	if err != nil {
		return nil, err
	}
	defer keySrv.stop()
	apiKeyed := neighbourServer{srv: keySrv, keys: apiKeys}

	// Unmeasured first: a server that meets 1,000 creates/s cold (no Postgres or Redis
	// connections yet, no prepared statements) falls behind, and an open loop only
	// piles up from there. The peer is warmed alike.
	for _, s := range []neighbourServer{{srv: srv}, {srv: peer}, apiKeyed} {
		warm := load{URL: s.srv.PublicURL, Client: "bench-flood", Key: s.keys["bench-flood"], Body: coldBody, Rate: res.FloodSend / 2, Duration: sz.httpWarmUp}
		warm.run(ctx)
		warm.Rate = res.FloodSend
		warm.run(ctx)
	}
	for range runs {
		if err := res.run(ctx, srv, rdb, sz, &res.Space, func() (float64, error) { return failedDecisions(ctx, srv) }); err != nil {
			return nil, err
		}
		if err := res.run(ctx, peer, rdb, sz, &res.Peer, nil); err != nil {
			return nil, err
		}
	}
	if res.Neighbour, err = runNeighbour(ctx, env, srv, apiKeyed, peer, st.redis.Pid(), runs, sz); err != nil {
		return nil, err
	}
	env.logf("flood: done")
	return res, nil
}

// namedFloodArm is one server's side of the flood under the name the report gives it.
type namedFloodArm struct {
	name string
	arm  *FloodArm
}

// servers are space-api's side and the peer's.
func (f *FloodResult) servers() []namedFloodArm {
	return []namedFloodArm{{"space-api", &f.Space}, {"peer: chi + redis_rate", &f.Peer}}
}

// run is one run of the flood on srv, added to arm. failed counts the server's failed
// decisions so far; nil counts the creates answered 503 instead.
func (f *FloodResult) run(ctx context.Context, srv *apiServer, rdb redis.Cmdable, sz sizes, arm *FloodArm, failed func() (float64, error)) error {
	var failedBefore float64
	if failed != nil {
		var err error
		if failedBefore, err = failed(); err != nil {
			return err
		}
	}
	before, err := commandStats(ctx, rdb)
	if err != nil {
		return err
	}
	var good, flood *loadResult
	var wg sync.WaitGroup
	wg.Go(func() {
		flood = load{Name: "flood", URL: srv.PublicURL, Client: "bench-flood", Body: coldBody, Rate: f.FloodSend, Duration: sz.floodDur}.run(ctx)
	})
	wg.Go(func() {
		good = load{Name: "good", URL: srv.PublicURL, Client: "bench-good", Body: coldBody, Rate: f.GoodSend, Duration: sz.floodDur}.run(ctx)
	})
	wg.Wait()
	after, err := commandStats(ctx, rdb)
	if err != nil {
		return err
	}
	if err := srv.alive(); err != nil {
		return err
	}
	n := float64(good.count("503") + flood.count("503"))
	if failed != nil {
		failedAfter, err := failed()
		if err != nil {
			return err
		}
		n = failedAfter - failedBefore
	}
	arm.Failed = append(arm.Failed, n)
	calls, usec, per := topLevelDelta(before, after)
	total := float64(good.Requests + flood.Requests)
	if total == 0 {
		return fmt.Errorf("the flood sent nothing")
	}
	arm.GoodSuccess = append(arm.GoodSuccess, 100*float64(good.count("201"))/float64(max(good.Requests, 1)))
	arm.GoodP50 = append(arm.GoodP50, ms(good.latency("", 50)))
	arm.GoodP99 = append(arm.GoodP99, ms(good.latency("", 99)))
	arm.FloodAdmitted = append(arm.FloodAdmitted, flood.rps("201"))
	arm.FloodRejectP50 = append(arm.FloodRejectP50, ms(flood.latency("429", 50)))
	arm.CallsPerRequest = append(arm.CallsPerRequest, float64(calls)/total)
	arm.EvalshaPerRequest = append(arm.EvalshaPerRequest, float64(per["evalsha"]+per["eval"])/total)
	arm.RedisUsecPerRequest = append(arm.RedisUsecPerRequest, float64(usec)/total)
	if arm.GoodOutcomes == nil {
		arm.GoodOutcomes, arm.FloodOutcomes = map[string]int{}, map[string]int{}
	}
	for k, v := range good.Outcomes {
		arm.GoodOutcomes[k] += v
	}
	for k, v := range flood.Outcomes {
		arm.FloodOutcomes[k] += v
	}
	arm.GoodTotal += good.Requests
	arm.FloodSent += flood.Requests
	return nil
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
