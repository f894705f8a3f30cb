package admission

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

func TestRetryAfter(t *testing.T) {
	t.Parallel()

	lowest := func() float64 { return 0 }
	highest := func() float64 { return math.Nextafter(1, 0) }

	t.Run("it is whole seconds, at least one and never earlier than the refill", func(t *testing.T) {
		t.Parallel()
		rnd := rand.New(rand.NewPCG(1, 2)).Float64
		for _, refill := range []time.Duration{0, time.Millisecond, 999 * time.Millisecond, time.Second, 1500 * time.Millisecond, 7 * time.Second, time.Hour, 1e8 * time.Second} {
			for range 100 {
				got := RetryAfter(refill, rnd)
				if got%time.Second != 0 || got < time.Second || got < refill {
					t.Fatalf("RetryAfter(%v) = %v", refill, got)
				}
			}
		}
	})

	t.Run("the lowest draw is the refill rounded up to a second", func(t *testing.T) {
		t.Parallel()
		for refill, want := range map[time.Duration]time.Duration{
			0:                       time.Second,
			300 * time.Millisecond:  time.Second,
			time.Second:             time.Second,
			1001 * time.Millisecond: 2 * time.Second,
			10 * time.Second:        10 * time.Second,
		} {
			if got := RetryAfter(refill, lowest); got != want {
				t.Errorf("RetryAfter(%v, 0) = %v, want %v", refill, got, want)
			}
		}
	})

	t.Run("the jitter spreads retries over half the delay, at least a second", func(t *testing.T) {
		t.Parallel()
		for refill, want := range map[time.Duration]time.Duration{
			0:                time.Second + time.Second,
			4 * time.Second:  4*time.Second + 2*time.Second,
			10 * time.Second: 10*time.Second + 5*time.Second,
		} {
			if got := RetryAfter(refill, highest); got != want {
				t.Errorf("RetryAfter(%v, 1) = %v, want %v", refill, got, want)
			}
		}
		seen := map[time.Duration]bool{}
		rnd := rand.New(rand.NewPCG(3, 4)).Float64
		for range 1000 {
			seen[RetryAfter(10*time.Second, rnd)] = true
		}
		if len(seen) != 6 { // 10 s to 15 s
			t.Fatalf("1000 draws for a 10 s refill gave %d distinct delays, want 6", len(seen))
		}
	})

	t.Run("a bucket that never refills does not overflow", func(t *testing.T) {
		t.Parallel()
		for _, rnd := range []func() float64{lowest, highest} {
			if got := RetryAfter(time.Duration(math.MaxInt64), rnd); got < time.Duration(math.MaxInt64)-time.Second {
				t.Fatalf("RetryAfter(longest Duration) = %v", got)
			}
		}
	})
}
