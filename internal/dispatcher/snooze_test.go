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

	t.Run("the first snooze waits for the refill, jittered upward by up to half", func(t *testing.T) {
		t.Parallel()
		if d := snoozeDelay(4*time.Second, 0, 1.5, time.Minute, low); d != 4*time.Second {
			t.Fatalf("no jitter: %v, want the 4s refill", d)
		}
		if d := snoozeDelay(4*time.Second, 0, 1.5, time.Minute, high); d != 6*time.Second {
			t.Fatalf("most jitter: %v, want 6s", d)
		}
		if d := snoozeDelay(100*time.Millisecond, 0, 1.5, time.Minute, low); d != time.Second {
			t.Fatalf("a short refill: %v, want the one-second floor", d)
		}
	})

	t.Run("repeated snoozes grow by the factor", func(t *testing.T) {
		t.Parallel()
		prev := time.Duration(0)
		for n, want := range []time.Duration{4 * time.Second, 6 * time.Second, 9 * time.Second, 14 * time.Second} {
			d := snoozeDelay(4*time.Second, n, 1.5, time.Minute, low)
			if d != want || d < prev {
				t.Fatalf("snooze %d: %v, want %v", n, d, want)
			}
			prev = d
		}
	})

	t.Run("no snooze passes the cap, and those at the cap are spread below it", func(t *testing.T) {
		t.Parallel()
		for _, refill := range []time.Duration{time.Second, 50 * time.Second, time.Hour, math.MaxInt64} {
			for n := range 40 {
				for _, rnd := range []func() float64{low, high} {
					d := snoozeDelay(refill, n, 2, time.Minute, rnd)
					if d < time.Second || d > time.Minute {
						t.Fatalf("refill %v, snooze %d: %v, want within [1s, 1m]", refill, n, d)
					}
				}
			}
		}
		if d := snoozeDelay(time.Hour, 0, 2, time.Minute, high); d > 46*time.Second {
			t.Fatalf("a snooze at the cap with most jitter is %v, want up to a quarter below the cap", d)
		}
	})

	t.Run("a cap below a second is kept, for tests", func(t *testing.T) {
		t.Parallel()
		if d := snoozeDelay(time.Hour, 3, 2, 200*time.Millisecond, low); d != 200*time.Millisecond {
			t.Fatalf("%v, want the 200ms cap", d)
		}
	})
}
