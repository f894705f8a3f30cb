package dispatcher

import (
	"math"
	"time"

	"github.com/space-sandbox/space/internal/admission"
)

// snoozeDelay is how long an operation turned away by a limit waits before its next
// try, for its n-th snooze (n = 0 for the first) when the rejecting bucket refills
// after refill (a LimitError's un-jittered RetryAfter):
//
//   - the refill time grown by growth^n, so that an operation that keeps meeting an
//     empty bucket (its client keeps flooding) tries less and less often;
//   - capped at maxDelay, so that a long refill or a long losing streak still looks
//     again regularly (a flag change raising the client's rate is noticed within
//     maxDelay);
//   - jittered upward like a 429's Retry-After (admission.RetryAfter: whole seconds, at
//     least one), so that operations turned away together do not all return together;
//     where that jitter would pass maxDelay, it is jittered downward from maxDelay
//     instead (by up to a quarter), so that a backlog parked at the cap spreads out too.
//
// rnd returns a float in [0, 1).
func snoozeDelay(refill time.Duration, n int, growth float64, maxDelay time.Duration, rnd func() float64) time.Duration {
	grown := refill.Seconds() * math.Pow(growth, float64(n))
	if math.IsNaN(grown) || grown > maxDelay.Seconds() {
		grown = maxDelay.Seconds()
	}
	d := admission.RetryAfter(time.Duration(grown*float64(time.Second)), rnd)
	if d > maxDelay {
		d = maxDelay - time.Duration(rnd()*float64(maxDelay/4))
	}
	return d
}
