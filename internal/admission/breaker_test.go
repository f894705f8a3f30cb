package admission

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/testenv"
)

func TestBreaker(t *testing.T) {
	t.Parallel()

	// paused is an Admitter, a ConcurrencyLimiter and a Limiter sharing one breaker on
	// a private Redis that the test pauses (SIGSTOP) and resumes.
	type paused struct {
		srv     *testenv.RedisServer
		reg     *prometheus.Registry
		breaker *Breaker
		adm     *Admitter
		conc    *ConcurrencyLimiter
		lim     *Limiter
	}
	setupPaused := func(t *testing.T, failClosed bool) *paused {
		t.Helper()
		srv := testenv.StartRedis(t)
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
		t.Cleanup(func() { rdb.Close() })
		p := &paused{srv: srv, reg: prometheus.NewRegistry()}
		p.breaker = NewBreaker(BreakerOptions{Failures: 3, OpenFor: 300 * time.Millisecond, Registerer: p.reg})
		// The scripts are loaded first, on a timeout no loaded machine misses, so that
		// the components' first calls are one round trip each; their own timeout is
		// short, since each call of the outage waits for it.
		warm, err := New(Options{Redis: rdb, Prefix: testenv.Prefix(t), Enabled: true, Cluster: space.Rate{RefillRPS: 1, Burst: 100}, Timeout: testTimeout})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := warm.admit(testenv.Context(t), "warm-up", rate(1, 5)); err != nil {
			t.Fatalf("loading the scripts: %v", err)
		}
		warmConc, err := NewConcurrencyLimiter(ConcurrencyOptions{Redis: rdb, Prefix: testenv.Prefix(t), Timeout: testTimeout})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := warmConc.Acquire(testenv.Context(t), "warm-up", 3); err != nil {
			t.Fatalf("loading the scripts: %v", err)
		}
		warmConc.Close()
		const timeout = 200 * time.Millisecond
		p.adm, err = New(Options{Redis: rdb, Prefix: testenv.Prefix(t), Enabled: true, FailClosed: failClosed,
			Cluster: space.Rate{RefillRPS: 1, Burst: 100}, Timeout: timeout, Breaker: p.breaker, Registerer: p.reg})
		if err != nil {
			t.Fatal(err)
		}
		p.conc, err = NewConcurrencyLimiter(ConcurrencyOptions{Redis: rdb, Prefix: testenv.Prefix(t), FailClosed: failClosed,
			Timeout: timeout, Breaker: p.breaker, Registerer: p.reg})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.conc.Close)
		p.lim, err = NewLimiter(LimiterOptions{Redis: rdb, Prefix: testenv.Prefix(t), Rate: space.Rate{RefillRPS: 1, Burst: 5},
			Timeout: timeout, Breaker: p.breaker})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}

	t.Run("after three failures every component fails at once, without a redis call", func(t *testing.T) {
		t.Parallel()
		p := setupPaused(t, true)
		ctx := testenv.Context(t)
		if d, err := p.adm.admit(ctx, "acme", nil); err != nil || !d.Admitted {
			t.Fatalf("before the outage: %+v, %v", d, err)
		}
		p.srv.Pause()
		for i := range 3 {
			if _, err := p.adm.admit(ctx, "acme", nil); !errors.Is(err, ErrUnavailable) || errors.Is(err, gobreaker.ErrOpenState) {
				t.Fatalf("call %d: %v, want a timeout from redis itself", i+1, err)
			}
		}
		if p.breaker.State() != "open" {
			t.Fatalf("breaker %s after three timeouts, want open", p.breaker.State())
		}
		// The failure mode applies at once, for every component on the breaker.
		if _, err := p.adm.admit(ctx, "acme", nil); !errors.Is(err, gobreaker.ErrOpenState) || !errors.Is(err, ErrUnavailable) || space.ErrorCode(err) != space.EUNAVAILABLE {
			t.Fatalf("admit with the breaker open: %v, want an immediate ErrUnavailable", err)
		}
		if _, err := p.conc.Acquire(ctx, "acme", 3); !errors.Is(err, gobreaker.ErrOpenState) {
			t.Fatalf("acquire with the breaker open: %v, want an immediate failure", err)
		}
		if _, _, err := p.lim.Peek(ctx, "1.2.3.4"); !errors.Is(err, gobreaker.ErrOpenState) {
			t.Fatalf("limiter with the breaker open: %v, want an immediate failure", err)
		}
		if got := metricValue(t, p.reg, "space_sandbox_admission_rate_decisions_total", "decision", "error", "bucket", "cluster_activation"); got != 4 {
			t.Fatalf("%v decision errors, want 4: the short-circuited call counts as one", got)
		}
		if got := metricValue(t, p.reg, "space_redis_circuit_breaker_state", "state", "open"); got != 1 {
			t.Fatalf("open state gauge = %v", got)
		}
	})

	t.Run("a probe after redis is back closes the breaker and admission is exact again", func(t *testing.T) {
		t.Parallel()
		p := setupPaused(t, false)
		ctx := testenv.Context(t)
		p.srv.Pause()
		for range 3 {
			if d, err := p.adm.admit(ctx, "acme", nil); err != nil || !d.FailedOpen {
				t.Fatalf("fail-open admit during the outage: %+v, %v", d, err)
			}
		}
		if d, _ := p.adm.admit(ctx, "acme", nil); !d.FailedOpen || p.breaker.State() != "open" {
			t.Fatalf("with the breaker open: %+v, state %s; want admitted unbudgeted", d, p.breaker.State())
		}
		p.srv.Resume()
		testenv.Eventually(t, 5*time.Second, "the breaker to close", func() bool {
			d, err := p.adm.admit(ctx, "globex", nil)
			return err == nil && !d.FailedOpen && p.breaker.State() == "closed"
		})
		peeked, err := p.adm.peekOne(ctx, "acme", nil)
		if err != nil {
			t.Fatal(err)
		}
		// What the cluster bucket refilled between the two reads (up to its burst) is
		// added back: on a loaded machine the admit may come a second after the peek.
		d, err := p.adm.admit(ctx, "acme", nil)
		refilled := d.Cluster.Rate.RefillRPS * (d.redisNow - peeked.redisNow) / 1e6
		if taken := min(float64(d.Cluster.Rate.Burst), peeked.Cluster.Remaining+refilled) - d.Cluster.Remaining; err != nil || d.FailedOpen || !near(taken, 1, 0.01) {
			t.Fatalf("after the outage: %+v, %v; took %.3f tokens (%.3f refilled since the peek), want exactly one", d, err, taken, refilled)
		}
		for _, to := range []string{"open", "half_open", "closed"} {
			if got := metricValue(t, p.reg, "space_redis_circuit_breaker_transitions_total", "to", to); got < 1 {
				t.Errorf("no transition to %s counted", to)
			}
		}
	})
}
