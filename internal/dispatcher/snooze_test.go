package dispatcher

import (
	"math"
	"testing"
	"time"
)

func TestSnoozeDelay(t *testing.T) {
	t.Parallel()
	low := func() float64 { return 0 }
	high := func() float64 { return 0.999999 }

	t.Run("a snooze waits for the refill, jittered upward by up to a quarter", func(t *testing.T) {
		t.Parallel()
		if d := snoozeDelay(4*time.Second, 1, time.Minute, low); d != 4*time.Second {
			t.Fatalf("no jitter: %v, want the 4s refill", d)
		}
		if d := snoozeDelay(4*time.Second, 1, time.Minute, high); d < 4999*time.Millisecond || d > 5*time.Second {
			t.Fatalf("most jitter: %v, want 5s", d)
		}
	})

	t.Run("a refill short by a hair is still spread over the jitter floor", func(t *testing.T) {
		t.Parallel()
		if d := snoozeDelay(time.Millisecond, 1, time.Minute, high); d < 50*time.Millisecond {
			t.Fatalf("%v, want at least the refill plus most of the 50ms floor", d)
		}
		if d := snoozeDelay(-time.Second, 1, time.Minute, low); d != 0 {
			t.Fatalf("a refill already passed: %v, want no wait", d)
		}
	})

	t.Run("repeated refusals do not grow the wait", func(t *testing.T) {
		t.Parallel()
		first := snoozeDelay(2*time.Second, 1, time.Minute, low)
		for range 10 {
			if d := snoozeDelay(2*time.Second, 1, time.Minute, low); d != first {
				t.Fatalf("%v after %v, want the same refill wait", d, first)
			}
		}
	})

	t.Run("an owner's waiting lanes spread their snoozes over as many refills", func(t *testing.T) {
		t.Parallel()
		if d := snoozeDelay(time.Second, 4, time.Minute, low); d != time.Second {
			t.Fatalf("the earliest of four lanes: %v, want the refill", d)
		}
		if d := snoozeDelay(time.Second, 4, time.Minute, high); d < 7*time.Second || d > 7250*time.Millisecond {
			t.Fatalf("the latest of four lanes: %v, want about 7.25s (a mean of four refills)", d)
		}
		if d := snoozeDelay(time.Second, 100, 5*time.Second, high); d < 3750*time.Millisecond || d > 5*time.Second {
			t.Fatalf("a hundred lanes under a 5s cap: %v, want within the cap's last quarter", d)
		}
	})

	t.Run("no snooze passes the cap, and those at the cap are spread below it", func(t *testing.T) {
		t.Parallel()
		for _, refill := range []time.Duration{time.Second, 50 * time.Second, time.Hour, math.MaxInt64} {
			for _, rnd := range []func() float64{low, high} {
				if d := snoozeDelay(refill, 1, time.Minute, rnd); d < min(refill, 45*time.Second) || d > time.Minute {
					t.Fatalf("refill %v: %v, want within [min(refill, 45s), 1m]", refill, d)
				}
			}
		}
		if d := snoozeDelay(time.Hour, 1, time.Minute, high); d > 46*time.Second {
			t.Fatalf("a snooze at the cap with most jitter is %v, want up to a quarter below the cap", d)
		}
	})

	t.Run("a cap below a second is kept, for tests", func(t *testing.T) {
		t.Parallel()
		if d := snoozeDelay(time.Hour, 1, 200*time.Millisecond, low); d != 200*time.Millisecond {
			t.Fatalf("%v, want the 200ms cap", d)
		}
	})
}
