package admission

import (
	"math"
	"time"
)

// RetryAfter turns the earliest time at which a retry can succeed (a Decision's
// RetryAfter: the refill of whichever empty bucket refills last) into the delay a
// caller is told: whole seconds, at least one, never earlier than refill, and jittered
// upward by up to half of it (at least one second of spread), so that callers turned
// away together do not all return in the same second and meet an empty bucket again.
// rnd returns a float in [0, 1), e.g. math/rand/v2.Float64.
func RetryAfter(refill time.Duration, rnd func() float64) time.Duration {
	base := math.Ceil(refill.Seconds())
	if base < 1 {
		base = 1
	}
	spread := math.Max(1, base/2)
	return time.Duration(base+math.Floor(rnd()*(spread+1))) * time.Second
}
