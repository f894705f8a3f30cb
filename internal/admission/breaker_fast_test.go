package admission

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sony/gobreaker/v2"
)

// TestBreakerFastPath checks that the closed breaker's one-load path decides what
// gobreaker alone would: failures in a row open it, a success in between resets the
// count, an abandoned call counts neither way.
func TestBreakerFastPath(t *testing.T) {
	t.Parallel()

	errDown := errors.New("redis down")
	setup := func(t *testing.T) *Breaker {
		t.Helper()
		return NewBreaker(BreakerOptions{Failures: 3, OpenFor: time.Hour})
	}
	fail := func() (any, error) { return nil, errDown }
	ok := func() (any, error) { return "ok", nil }

	t.Run("three failures in a row open it and the next call is not made", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for range 3 {
			if _, err := b.do(fail); !errors.Is(err, errDown) {
				t.Fatalf("do = %v, want the call's own error", err)
			}
		}
		if got := b.State(); got != "open" {
			t.Fatalf("state = %s after 3 failures, want open", got)
		}
		called := false
		if _, err := b.do(func() (any, error) { called = true; return nil, nil }); !errors.Is(err, gobreaker.ErrOpenState) || called {
			t.Fatalf("open breaker: err %v, call made %t; want ErrOpenState and no call", err, called)
		}
	})

	t.Run("a success between failures resets the count", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for _, fn := range []func() (any, error){fail, fail, ok, fail, fail} {
			_, _ = b.do(fn)
		}
		if got := b.State(); got != "closed" {
			t.Fatalf("state = %s after fail fail ok fail fail, want closed", got)
		}
		if _, _ = b.do(fail); b.State() != "open" {
			t.Fatalf("state = %s after a third failure in a row, want open", b.State())
		}
	})

	t.Run("the fast path resumes only after a success", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, _ = b.do(fail)
		if b.healthy.Load() {
			t.Fatal("still on the fast path after a failure")
		}
		if v, err := b.do(ok); err != nil || v != "ok" {
			t.Fatalf("do = %v, %v; want ok", v, err)
		}
		if !b.healthy.Load() {
			t.Fatal("not back on the fast path after a success with the breaker closed")
		}
	})

	t.Run("an abandoned call counts neither way", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for range 5 {
			_, _ = b.do(func() (any, error) { return nil, context.Canceled })
		}
		if b.State() != "closed" || !b.healthy.Load() {
			t.Fatalf("state %s, fast path %t after cancelled calls; want closed, true", b.State(), b.healthy.Load())
		}
	})

	t.Run("many goroutines failing at once open it", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var wg sync.WaitGroup
		var made atomic.Int64
		for range 32 {
			wg.Go(func() {
				for range 10 {
					_, _ = b.do(func() (any, error) { made.Add(1); return nil, errDown })
				}
			})
		}
		wg.Wait()
		if b.State() != "open" {
			t.Fatalf("state = %s after 320 failures, want open", b.State())
		}
		// Every call that found the breaker open was not made: far fewer than 320.
		if n := made.Load(); n >= 320 {
			t.Fatalf("%d calls made of 320: the open breaker let every one through", n)
		}
	})
}
