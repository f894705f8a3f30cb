package admission

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/testenv"
)

// limiterBundle is a Limiter on a real Redis under a prefix of its own.
type limiterBundle struct {
	ctx    context.Context
	rdb    redis.UniversalClient
	prefix string
	lim    *Limiter
}

func setupLimiter(t *testing.T, rdb redis.UniversalClient, r space.Rate) *limiterBundle {
	t.Helper()
	b := &limiterBundle{ctx: testenv.Context(t), rdb: rdb, prefix: testenv.Prefix(t) + ":auth_failures"}
	lim, err := NewLimiter(LimiterOptions{Redis: rdb, Prefix: b.prefix, Rate: r, Timeout: testTimeout, PipelineAbove: DefaultPipelineAbove})
	if err != nil {
		t.Fatalf("NewLimiter: %v", err)
	}
	b.lim = lim
	return b
}

func TestLimiter(t *testing.T) {
	t.Parallel()

	t.Run("allow takes tokens until the burst is spent", func(t *testing.T) {
		t.Parallel()
		topologies(t, func(t *testing.T, rdb redis.UniversalClient) {
			r := space.Rate{RefillRPS: 0.01, Burst: 3}
			b := setupLimiter(t, rdb, r)
			// What refilled since the first take, at 0.01/s: a loaded machine takes a
			// tenth of a second between two calls (make test-stress did).
			start := time.Now()
			refilled := func() float64 { return r.RefillRPS*time.Since(start).Seconds() + 1e-6 }
			for i := range 3 {
				ok, st, err := b.lim.Allow(b.ctx, "10.0.0.1")
				if want := float64(2 - i); err != nil || !ok || st.Remaining < want-1e-6 || st.Remaining > want+refilled() || st.Rate != r {
					t.Fatalf("Allow %d = %v, %+v, %v", i, ok, st, err)
				}
			}
			ok, st, err := b.lim.Allow(b.ctx, "10.0.0.1")
			if err != nil || ok || st.Refill < 100*time.Second-time.Since(start)-10*time.Millisecond || st.Refill > 100*time.Second {
				t.Fatalf("Allow past the burst = %v, %+v, %v; want refused, a token in 100 s", ok, st, err)
			}
			if ok, _, err := b.lim.Allow(b.ctx, "10.0.0.2"); err != nil || !ok {
				t.Fatalf("another key: %v, %v; want allowed", ok, err)
			}
		})
	})

	t.Run("peek takes nothing", func(t *testing.T) {
		t.Parallel()
		b := setupLimiter(t, testenv.Redis(t), space.Rate{RefillRPS: neverRefills, Burst: 1})
		for range 3 {
			if ok, st, err := b.lim.Peek(b.ctx, "k"); err != nil || !ok || st.Remaining != 1 {
				t.Fatalf("Peek = %v, %+v, %v; want a full bucket", ok, st, err)
			}
		}
		if n, err := b.rdb.Exists(b.ctx, b.prefix+":k").Result(); err != nil || n != 0 {
			t.Fatalf("Peek wrote the key: %d, %v", n, err)
		}
		if ok, _, _ := b.lim.Allow(b.ctx, "k"); !ok {
			t.Fatal("Allow after Peek refused")
		}
		if ok, _, err := b.lim.Peek(b.ctx, "k"); err != nil || ok {
			t.Fatalf("Peek on an empty bucket = %v, %v; want no token", ok, err)
		}
	})

	t.Run("a peek made after a take emptied the bucket sees it empty, whatever peeks are on their way", func(t *testing.T) {
		t.Parallel()
		topologies(t, func(t *testing.T, rdb redis.UniversalClient) {
			b := setupLimiter(t, rdb, space.Rate{RefillRPS: 0.001, Burst: 3})
			const addr = "10.0.0.9"
			// Peeks of the address all along, so that the ones below find one on its way.
			ctx, stop := context.WithCancel(b.ctx)
			var peekers sync.WaitGroup
			for range 8 {
				peekers.Go(func() {
					for ctx.Err() == nil {
						_, _, _ = b.lim.Peek(ctx, addr)
					}
				})
			}
			defer func() { stop(); peekers.Wait() }()
			for round := range 3 {
				if ok, _, err := b.lim.Peek(b.ctx, addr); err != nil || !ok {
					t.Fatalf("peek before take %d: %v, %v; want a token left", round+1, ok, err)
				}
				if ok, _, err := b.lim.Allow(b.ctx, addr); err != nil || !ok {
					t.Fatalf("take %d: %v, %v; want it taken", round+1, ok, err)
				}
			}
			var after sync.WaitGroup
			for i := range 16 {
				after.Go(func() {
					if ok, st, err := b.lim.Peek(b.ctx, addr); err != nil || ok {
						t.Errorf("peek %d after the last take: %v, %+v, %v; want the bucket empty", i, ok, st, err)
					}
				})
			}
			after.Wait()
		})
	})

	t.Run("a key expires once its bucket is full again", func(t *testing.T) {
		t.Parallel()
		b := setupLimiter(t, testenv.Redis(t), space.Rate{RefillRPS: 0.5, Burst: 10})
		b.lim.Allow(b.ctx, "k")
		// A burst of 10 at 0.5 tokens/s refills completely in 20 s: the key is gone by
		// then, so many distinct keys cannot fill Redis.
		ttl, err := b.rdb.PTTL(b.ctx, b.prefix+":k").Result()
		if err != nil || ttl > 20*time.Second+expiryMargin || ttl < 19*time.Second {
			t.Fatalf("PTTL = %v, %v; want 20 s", ttl, err)
		}
	})

	t.Run("a redis failure is returned as ErrUnavailable", func(t *testing.T) {
		t.Parallel()
		rdb := redis.NewClient(&redis.Options{Addr: testenv.Blackhole(t)})
		t.Cleanup(func() { rdb.Close() })
		lim, err := NewLimiter(LimiterOptions{Redis: rdb, Prefix: "p", Rate: space.Rate{RefillRPS: 1, Burst: 1}, Timeout: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if ok, _, err := lim.Allow(testenv.Context(t), "k"); ok || !errors.Is(err, ErrUnavailable) {
			t.Fatalf("Allow = %v, %v; want refused with ErrUnavailable", ok, err)
		}
		if _, _, err := lim.Peek(testenv.Context(t), "k"); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("Peek = %v, want ErrUnavailable", err)
		}
	})

	t.Run("new refuses a missing prefix or a bad rate", func(t *testing.T) {
		t.Parallel()
		rdb := testenv.Redis(t)
		for name, opts := range map[string]LimiterOptions{
			"no redis":                 {Prefix: "p", Rate: space.Rate{RefillRPS: 1, Burst: 1}, Timeout: testTimeout},
			"no prefix":                {Redis: rdb, Rate: space.Rate{RefillRPS: 1, Burst: 1}, Timeout: testTimeout},
			"no burst":                 {Redis: rdb, Prefix: "p", Rate: space.Rate{RefillRPS: 1}, Timeout: testTimeout},
			"no timeout":               {Redis: rdb, Prefix: "p", Rate: space.Rate{RefillRPS: 1, Burst: 1}},
			"a negative PipelineAbove": {Redis: rdb, Prefix: "p", Rate: space.Rate{RefillRPS: 1, Burst: 1}, Timeout: testTimeout, PipelineAbove: -1},
		} {
			if _, err := NewLimiter(opts); err == nil {
				t.Errorf("%s: NewLimiter succeeded", name)
			}
		}
	})
}
