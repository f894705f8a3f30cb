package bench

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
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
	spaceAnswer, err := env.startPeer(ctx, peerBare, "", "-space-answer")
	if err != nil {
		return nil, err
	}
	defer spaceAnswer.stop()

	res := &RefusalResult{Threads: wrkThreads, Connections: sz.httpWorkers,
		Duration:  max(time.Second, sz.httpDur.Round(time.Second)),
		NoCaps:    &HTTPRow{Name: "space-api, no caps", Outcome: "429"},
		Full:      &HTTPRow{Name: "space-api, full path", Outcome: "429"},
		RedisRate: &HTTPRow{Name: "chi + redis_rate", Outcome: "429"},
		Bare:      &HTTPRow{Name: "chi, no store", Outcome: "429"},
		Same:      &HTTPRow{Name: "chi, space's answer", Outcome: "429"},
		Constant:  &HTTPRow{Name: "chi, constant answer", Outcome: "429"},
	}
	targets := []refusalTarget{
		{res.NoCaps, on, "bench-reject-bare", "client_activation"},
		{res.Full, on, "bench-reject", "client_activation"},
		{res.RedisRate, redisRate, "bench-reject-bare", ""},
		{res.Bare, bare, "bench-reject-bare", ""},
		{res.Same, spaceAnswer, "bench-reject-bare", ""},
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
	// The peer answering space-api's answer must answer it: the same header names and
	// values, the same body, but for the request id's value.
	want, err := createAnswer(ctx, on.PublicURL, "bench-reject-bare", coldBody)
	if err != nil {
		return nil, err
	}
	got, err := createAnswer(ctx, spaceAnswer.PublicURL, "bench-reject-bare", coldBody)
	if err != nil {
		return nil, err
	}
	if err := sameAnswer(want, got); err != nil {
		return nil, fmt.Errorf("%s: %w", res.Same.Name, err)
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
		for _, s := range []*apiServer{on, redisRate, bare, spaceAnswer, constant} {
			if err := s.alive(); err != nil {
				return nil, err
			}
		}
	}
	return res, nil
}

// sameAnswer says how got differs from want, two answers to a create that must be
// alike on the wire: status, header names and values (but Date, and X-Request-Id's
// value), and body, once each answer's own request id is taken out of it.
func sameAnswer(want, got response) error {
	if got.status != want.status {
		return fmt.Errorf("answered %d, space-api %d", got.status, want.status)
	}
	for _, h := range []http.Header{want.header, got.header} {
		if len(h.Values("X-Request-Id")) != 1 || len(h.Get("X-Request-Id")) != 16 {
			return fmt.Errorf("X-Request-Id %q, want 16 characters", h.Values("X-Request-Id"))
		}
	}
	names := func(h http.Header) []string {
		var ns []string
		for k, vs := range h {
			switch k {
			case "Date":
			case "X-Request-Id":
				ns = append(ns, k)
			default:
				ns = append(ns, k+": "+strings.Join(vs, ", "))
			}
		}
		slices.Sort(ns)
		return ns
	}
	if w, g := names(want.header), names(got.header); !slices.Equal(w, g) {
		return fmt.Errorf("headers %q, space-api's %q", g, w)
	}
	strip := func(a response) []byte {
		return bytes.ReplaceAll(a.body, []byte(a.header.Get("X-Request-Id")), nil)
	}
	if w, g := strip(want), strip(got); !bytes.Equal(w, g) {
		return fmt.Errorf("body %s, space-api's %s", bytes.TrimSpace(g), bytes.TrimSpace(w))
	}
	return nil
}
