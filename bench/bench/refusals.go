package bench

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/space-sandbox/space/internal/testenv"
)

// refusalTarget is one server and client of the refusal comparison.
type refusalTarget struct {
	row    *HTTPRow
	srv    *apiServer
	client string
	// bucket is the bucket a refusal must name ("" for the peers, which name none):
	// a 429 for any other reason (a concurrency cap, the cluster bucket) would
	// measure something else.
	bucket string
}

// runRefusals measures the refusal ceiling on the HTTP scenario's
// space-api (on, trusted_header mode, the env client rate of refusalEnv) beside the two
// peers, which it starts on the same private Redis: refused creates/s of a client over
// its rate, closed loop, wrk with 1 thread and sz.httpWorkers connections, the same
// body and duration for all.
func runRefusals(ctx context.Context, env *Env, on *apiServer, rs *testenv.RedisProcess, runs int, sz sizes) (*RefusalResult, error) {
	redisRate, err := env.startPeer(ctx, peerRedisRate, rs.Addr)
	if err != nil {
		return nil, err
	}
	defer redisRate.stop()
	bare, err := env.startPeer(ctx, peerBare, "")
	if err != nil {
		return nil, err
	}
	defer bare.stop()
	constant, err := env.startPeer(ctx, peerBare, "", "-constant")
	if err != nil {
		return nil, err
	}
	defer constant.stop()

	res := &RefusalResult{Threads: wrkThreads, Connections: sz.httpWorkers,
		Duration:  max(time.Second, sz.httpDur.Round(time.Second)),
		NoCaps:    &HTTPRow{Name: "space-api, no caps", Outcome: "429"},
		Full:      &HTTPRow{Name: "space-api, full path", Outcome: "429"},
		RedisRate: &HTTPRow{Name: "chi + redis_rate", Outcome: "429"},
		Bare:      &HTTPRow{Name: "chi, no store", Outcome: "429"},
		Constant:  &HTTPRow{Name: "chi, constant answer", Outcome: "429"},
	}
	targets := []refusalTarget{
		{res.NoCaps, on, "bench-reject-bare", "client_activation"},
		{res.Full, on, "bench-reject", "client_activation"},
		{res.RedisRate, redisRate, "bench-reject-bare", ""},
		{res.Bare, bare, "bench-reject-bare", ""},
		{res.Constant, constant, "bench-reject-bare", ""},
	}
	// Each client's one token goes first; the next create must be refused, by its rate.
	for _, t := range targets {
		if _, _, err := createOnce(ctx, t.srv.PublicURL, t.client, coldBody); err != nil {
			return nil, err
		}
		code, body, err := createOnce(ctx, t.srv.PublicURL, t.client, coldBody)
		if err != nil {
			return nil, err
		}
		if code != http.StatusTooManyRequests || (t.bucket != "" && !bytes.Contains(body, []byte(`"bucket":"`+t.bucket+`"`))) {
			return nil, fmt.Errorf("%s: a create of %s over its rate was answered %d %s, want 429 %s", t.row.Name, t.client, code, bytes.TrimSpace(body), t.bucket)
		}
	}
	load := func(t refusalTarget, d time.Duration) wrkLoad {
		return wrkLoad{Name: t.row.Name, URL: t.srv.PublicURL, Client: t.client, Body: coldBody, Connections: sz.httpWorkers, Duration: d}
	}
	// Unmeasured first, as every HTTP load: connection pools and the Go heap settle.
	// wrk runs whole seconds, so a quick run (a smoke test of the code paths) skips it.
	if sz.httpWarmUp >= time.Second {
		res.WarmUp = sz.httpWarmUp
		for _, t := range targets {
			if _, err := env.runWrk(ctx, load(t, sz.httpWarmUp)); err != nil {
				return nil, err
			}
		}
	}
	for run := range runs {
		for i := range targets {
			t := targets[(run+i)%len(targets)]
			// -profile: space-api's CPU over each of its refusal floods, half a second
			// short of wrk's run at each end.
			var profiled sync.WaitGroup
			if env.ProfileDir != "" && t.srv == on && res.Duration >= 2*time.Second {
				name := fmt.Sprintf("refusals-%s-%d-%s.pprof", map[bool]string{true: "nocaps", false: "full"}[t.row == res.NoCaps], run, time.Now().UTC().Format("150405"))
				profiled.Go(func() {
					if sleepCtx(ctx, 500*time.Millisecond) {
						env.profile(ctx, on, res.Duration-time.Second, name)
					}
				})
			}
			r, err := env.runWrk(ctx, load(t, res.Duration))
			profiled.Wait()
			if err != nil {
				return nil, err
			}
			t.row.addWrk(r)
		}
		for _, s := range []*apiServer{on, redisRate, bare, constant} {
			if err := s.alive(); err != nil {
				return nil, err
			}
		}
	}
	return res, nil
}
