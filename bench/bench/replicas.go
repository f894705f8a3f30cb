package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/space-sandbox/space/internal/admission"
	"github.com/space-sandbox/space/internal/config"
)

// ReplicaCounts are the answers of one flood of several servers.
type ReplicaCounts struct {
	Admitted   int   // 201s counted by the load generator, all servers
	PerReplica []int // 201s per server
	Rejected   int   // refusals: space-api's 429 cluster_activation, the peer's 429
	Other      int   // any other answer (none expected; the peer's 503: Redis failed)
	Requests   int   // creates sent
}

// ReplicasRun is one flood of the three replicas.
type ReplicasRun struct {
	ReplicaCounts
	ElapsedLast float64 // s from the first admitted create to the last admission
	ElapsedEnd  float64 // s of Redis TIME from before the flood to after it
	// Expected is floor(burst + refill × ElapsedLast): the whole tokens the cluster
	// bucket could hand out from its first admission to its last.
	Expected int
	// Exact is burst + refill × ElapsedLast − tokens left at the last admission. A
	// bucket's tokens are burst at its first admission, plus what refilled, minus
	// what was taken: Exact equals Admitted but for the refill of the moments between
	// the first admitted create's start (its sandbox's created_at, which is earlier
	// than its charge) and that charge.
	Exact float64
	// Window is burst + refill × ElapsedEnd, the brief's "burst + rate × elapsed" over
	// the whole flood.
	Window float64
	// Errors are decision="error" counts on the replicas' metrics (none expected: a
	// failed decision fails closed here, so it cannot hide an admission).
	Errors float64
	// Peer is the same flood on as many peers (chi + redis_rate, the client's one
	// key of the same burst and refill), run after it.
	Peer PeerReplicasRun
}

// PeerReplicasRun is one flood of the peer replicas. redis_rate keeps no time of its
// last admission, so its count is compared with the whole flood's window only.
type PeerReplicasRun struct {
	ReplicaCounts
	// Window is burst + refill × (t_end − t_start) of this flood, in Redis time.
	Window float64
}

// Diff is Admitted − Expected.
func (r ReplicasRun) Diff() int { return r.Admitted - r.Expected }

// ReplicasResult is the several-replicas scenario.
type ReplicasResult struct {
	Replicas int
	Burst    int64
	Refill   float64
	Duration time.Duration
	Workers  int // closed-loop connections per replica
	Runs     []ReplicasRun
}

// runReplicas floods three space-api processes that share one Postgres database and
// one Redis, and checks that together they admit exactly the cluster burst plus what
// refilled, in Redis time: the global budget holds across replicas.
func runReplicas(ctx context.Context, env *Env, runs int, sz sizes) (*ReplicasResult, error) {
	st, err := env.newStack(ctx)
	if err != nil {
		return nil, err
	}
	defer st.close()
	db, rs, rdb := st.db, st.redis, st.client

	res := &ReplicasResult{Replicas: 3, Burst: sz.replicaBurst, Refill: sz.replicaRefill, Duration: sz.replicaDur, Workers: sz.replicaWorkers}
	// The client's own bucket is far larger than the cluster's, so the cluster bucket
	// is the one that binds, through the two-bucket script.
	flags, err := flagsFile(map[string]quota{"bench-replicas": {Concurrency: 1000}},
		map[string]*rateEntry{"bench-replicas": {RefillRPS: 1e6, Burst: 1e6}}, nil)
	if err != nil {
		return nil, err
	}
	vars := map[string]string{
		"SPACE_CLUSTER_ACTIVATION_ADMISSION_REFILL_RPS": strconv.FormatFloat(sz.replicaRefill, 'g', -1, 64),
		"SPACE_CLUSTER_ACTIVATION_ADMISSION_BURST":      strconv.FormatInt(sz.replicaBurst, 10),
		// A decision that fails must not be admitted unbudgeted (fail open), or the
		// count would be off by it; and a generous timeout keeps a slow moment of the
		// shared machine from failing one at all.
		"SPACE_CLUSTER_ACTIVATION_ADMISSION_FAILURE_MODE": "closed",
		"SPACE_REDIS_TIMEOUT":                             "2s",
	}
	servers := make([]*apiServer, res.Replicas)
	for i := range servers {
		s, err := env.startServer(ctx, serverConfig{Name: fmt.Sprintf("replica-%d", i+1), DB: db, RedisAddr: rs.Addr, Flags: flags, Env: vars})
		if err != nil {
			return nil, err
		}
		defer s.stop()
		servers[i] = s
	}

	// An unmeasured flood first, before the bucket is reset: each replica opens its
	// Postgres and Redis connections and prepares its statements, so that the first
	// measured create does not do it between its reservation and its charge, which
	// would widen the moment the count is compared over.
	floodEach(ctx, servers, sz, sz.httpWarmUp)
	// The peers: each asks redis_rate for the client's one key, the cluster bucket's
	// burst and refill (a whole number of tokens a second), with space-api's timeout.
	peers := make([]*apiServer, res.Replicas)
	for i := range peers {
		p, err := env.startPeer(ctx, peerRedisRate, rs.Addr, "-redis-timeout=2s",
			fmt.Sprintf("-limit=bench-replicas:%d:%d:1s", int(sz.replicaRefill), sz.replicaBurst))
		if err != nil {
			return nil, err
		}
		defer p.stop()
		peers[i] = p
	}
	floodEach(ctx, peers, sz, sz.httpWarmUp)
	clusterKey := admission.ClusterKey(config.Default().Redis.KeyPrefix)
	for range runs {
		// A fresh, full bucket (a missing key is a full one), and no sandbox yet.
		if err := rdb.Del(ctx, clusterKey).Err(); err != nil {
			return nil, fmt.Errorf("DEL %s: %w", clusterKey, err)
		}
		if err := db.exec(ctx, "DELETE FROM sandboxes WHERE client = 'bench-replicas'"); err != nil {
			return nil, err
		}
		errorsBefore := 0.0
		for _, s := range servers {
			v, err := s.metric(ctx, "space_sandbox_admission_rate_decisions_total", "decision", "error")
			if err != nil {
				return nil, err
			}
			errorsBefore += v
		}
		results, start, end, err := timedFlood(ctx, rdb, servers, sz)
		if err != nil {
			return nil, err
		}
		raw, err := rdb.Get(ctx, clusterKey).Result()
		if err != nil {
			return nil, fmt.Errorf("GET %s after the flood: %w", clusterKey, err)
		}
		if len(raw) != 32 {
			return nil, fmt.Errorf("%s holds %d bytes, not bucket.lua's 32", clusterKey, len(raw))
		}
		// bucket.lua's state: the tokens left and the Redis time (µs) of the last
		// decision that wrote, i.e. the last admission (then the key's expiry and
		// when the bucket is full).
		tokens := math.Float64frombits(binary.LittleEndian.Uint64([]byte(raw[:8])))
		lastMicros := math.Float64frombits(binary.LittleEndian.Uint64([]byte(raw[8:16])))

		run := ReplicasRun{ReplicaCounts: tally(results, "429 cluster_activation")}
		// The first admission's time: the bucket was full then. Its create's sandbox
		// row was inserted (created_at, the transaction's start) just before its
		// charge; rows of refused creates are gone (undone, or never made). Postgres
		// and Redis read the same clock on this machine.
		firstMicros, err := db.queryInt(ctx, "SELECT (extract(epoch FROM min(created_at)) * 1000000)::bigint FROM sandboxes WHERE client = 'bench-replicas'")
		if err != nil {
			return nil, err
		}
		if firstMicros < start.UnixMicro() {
			return nil, fmt.Errorf("the first sandbox was created %d µs before the flood began", start.UnixMicro()-firstMicros)
		}
		run.ElapsedLast = (lastMicros - float64(firstMicros)) / 1e6
		run.ElapsedEnd = end.Sub(start).Seconds()
		burst := float64(sz.replicaBurst)
		run.Expected = int(math.Floor(burst + sz.replicaRefill*run.ElapsedLast))
		run.Exact = burst + sz.replicaRefill*run.ElapsedLast - tokens
		run.Window = burst + sz.replicaRefill*run.ElapsedEnd
		errorsAfter := 0.0
		for _, s := range servers {
			if err := s.alive(); err != nil {
				return nil, err
			}
			v, err := s.metric(ctx, "space_sandbox_admission_rate_decisions_total", "decision", "error")
			if err != nil {
				return nil, err
			}
			errorsAfter += v
		}
		run.Errors = errorsAfter - errorsBefore
		if run.Peer, err = floodPeerReplicas(ctx, rdb, peers, sz); err != nil {
			return nil, err
		}
		res.Runs = append(res.Runs, run)
		env.logf("replicas: admitted %d, expected %d (exact %.3f), %d requests", run.Admitted, run.Expected, run.Exact, run.Requests)
	}
	return res, nil
}

// floodPeerReplicas floods the peers as runReplicas floods space-api's replicas, on a
// fresh redis_rate key (its own prefix "rate:"), and counts their answers.
func floodPeerReplicas(ctx context.Context, rdb redis.Cmdable, peers []*apiServer, sz sizes) (PeerReplicasRun, error) {
	var run PeerReplicasRun
	if err := rdb.Del(ctx, "rate:bench-replicas").Err(); err != nil {
		return run, fmt.Errorf("DEL the peer's key: %w", err)
	}
	results, start, end, err := timedFlood(ctx, rdb, peers, sz)
	if err != nil {
		return run, err
	}
	for _, p := range peers {
		if err := p.alive(); err != nil {
			return run, err
		}
	}
	run.ReplicaCounts = tally(results, "429")
	run.Window = float64(sz.replicaBurst) + sz.replicaRefill*end.Sub(start).Seconds()
	return run, nil
}

// floodEach floods every server at once for d, each with the scenario's closed loop
// of the one client, and returns each server's answers.
func floodEach(ctx context.Context, servers []*apiServer, sz sizes, d time.Duration) []*loadResult {
	results := make([]*loadResult, len(servers))
	var wg sync.WaitGroup
	for i, s := range servers {
		wg.Go(func() {
			results[i] = load{Name: s.Name, URL: s.PublicURL, Client: "bench-replicas", Body: coldBody, Workers: sz.replicaWorkers, Duration: d}.run(ctx)
		})
	}
	wg.Wait()
	return results
}

// timedFlood is the measured flood of every server (floodEach for the scenario's
// duration) between two readings of Redis TIME, start and end.
func timedFlood(ctx context.Context, rdb redis.Cmdable, servers []*apiServer, sz sizes) (results []*loadResult, start, end time.Time, err error) {
	if start, err = redisTime(ctx, rdb); err != nil {
		return nil, start, end, err
	}
	results = floodEach(ctx, servers, sz, sz.replicaDur)
	end, err = redisTime(ctx, rdb)
	return results, start, end, err
}

// tally counts the answers of one flood per server: the 201s, the refusals (answers
// whose outcome starts with refused), the rest.
func tally(results []*loadResult, refused string) ReplicaCounts {
	c := ReplicaCounts{PerReplica: make([]int, len(results))}
	for i, r := range results {
		c.PerReplica[i] = r.count("201")
		c.Admitted += c.PerReplica[i]
		c.Rejected += r.count(refused)
		c.Requests += r.Requests
	}
	c.Other = c.Requests - c.Admitted - c.Rejected
	return c
}
