package api

import (
	"math"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/space-sandbox/space"
)

func TestLimitHeaders(t *testing.T) {
	t.Parallel()

	retryAfter := func(le *space.LimitError, rnd float64) int {
		h := http.Header{}
		setLimitHeaders(h, le, func() float64 { return rnd })
		n, err := strconv.Atoi(h.Get("Retry-After"))
		if err != nil {
			t.Fatalf("Retry-After %q is not whole seconds", h.Get("Retry-After"))
		}
		return n
	}

	t.Run("Retry-After is never earlier than the refill and at least one second", func(t *testing.T) {
		t.Parallel()
		for _, refill := range []time.Duration{0, time.Millisecond, 999 * time.Millisecond, time.Second, 2500 * time.Millisecond, time.Minute,
			25 * time.Hour, 7 * 24 * time.Hour, 10 * 365 * 24 * time.Hour} {
			for _, rnd := range []float64{0, 0.5, 0.999} {
				got := retryAfter(&space.LimitError{Bucket: space.BucketClientActivation, RetryAfter: refill}, rnd)
				if got < 1 || float64(got) < refill.Seconds() {
					t.Errorf("refill %v, rnd %v: Retry-After %d", refill, rnd, got)
				}
			}
		}
	})

	t.Run("Retry-After is jittered across callers", func(t *testing.T) {
		t.Parallel()
		le := &space.LimitError{Bucket: space.BucketClusterActivation, RetryAfter: 10 * time.Second}
		if lo, hi := retryAfter(le, 0), retryAfter(le, 0.999); lo != 10 || hi <= lo {
			t.Fatalf("Retry-After spans %d..%d, want 10 up to more than 10", lo, hi)
		}
	})

	t.Run("a bucket that refills once a week says at least a week", func(t *testing.T) {
		t.Parallel()
		week := 7 * 24 * time.Hour
		for _, rnd := range []float64{0, 0.999} {
			if got := retryAfter(&space.LimitError{Bucket: space.BucketClientActivation, RetryAfter: week}, rnd); got < int(week/time.Second) {
				t.Fatalf("Retry-After = %d, want at least a week (%d)", got, int(week/time.Second))
			}
		}
	})

	t.Run("a bucket that never refills is told to retry in a day", func(t *testing.T) {
		t.Parallel()
		got := retryAfter(&space.LimitError{Bucket: space.BucketClientActivation, RetryAfter: time.Duration(math.MaxInt64)}, 0.5)
		if got != 86400 {
			t.Fatalf("Retry-After = %d, want 86400", got)
		}
	})

	t.Run("RateLimit fields describe the bucket that refused", func(t *testing.T) {
		t.Parallel()
		h := http.Header{}
		setLimitHeaders(h, &space.LimitError{Bucket: space.BucketClientActivation, RetryAfter: 3 * time.Second,
			Limit: &space.Rate{RefillRPS: 10, Burst: 40}, Remaining: 0.4}, func() float64 { return 0 })
		if got := h.Get("RateLimit-Policy"); got != `"client_activation";q=40;w=4` {
			t.Errorf("RateLimit-Policy = %q", got)
		}
		if got := h.Get("RateLimit"); got != `"client_activation";r=0;t=3` {
			t.Errorf("RateLimit = %q", got)
		}
		h = http.Header{}
		setLimitHeaders(h, &space.LimitError{Bucket: space.BucketLiveSandboxCap, Cap: 50, RetryAfter: time.Second}, func() float64 { return 0 })
		if got := h.Get("RateLimit-Policy"); got != `"live_sandbox_cap";q=50` {
			t.Errorf("RateLimit-Policy = %q", got)
		}
	})
}
