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
//
// A refill beyond what a Duration holds (a bucket that never refills reports the
// longest Duration) gives the longest whole-second Duration, about 292 years, rather
// than overflowing into a negative delay.
func RetryAfter(refill time.Duration, rnd func() float64) time.Duration {
	base := math.Ceil(refill.Seconds())
	if base < 1 {
		base = 1
	}
	spread := math.Max(1, base/2)
	secs := base + math.Floor(rnd()*(spread+1))
	if secs >= maxSeconds {
		return time.Duration(maxWholeSeconds) * time.Second
	}
	return time.Duration(secs) * time.Second
}

// maxWholeSeconds is the longest Duration in whole seconds.
const maxWholeSeconds = math.MaxInt64 / int64(time.Second)

// maxSeconds is maxWholeSeconds as a float, for comparing before converting.
const maxSeconds = float64(maxWholeSeconds)
