package dispatcher

import (
	"time"
)

// snoozeDelay is how long an operation turned away by a limit waits before its next
// try, when the rejecting bucket refills after refill (a LimitError's un-jittered
// RetryAfter: the time until it holds the operation's cost) and waiting of its owner's
// lanes (this one included) wait on a limit:
//
//   - at least the refill time, not a backoff grown over repeated refusals: a snooze
//     that ends when a token is there costs one fetch and gets the token;
//   - spread evenly over waiting refill times, so that an owner asks about once per
//     refill however many lanes it has (its other operations wait parked, see
//     lanes.go): an owner's lanes do not outnumber another owner's one operation at
//     a shared bucket, and a snoozed backlog costs the queue about one job update per
//     refill rather than one per lane;
//   - jittered upward by a quarter of the refill (at least jitterFloor), so that
//     lanes turned away together do not all wake in the same instant;
//   - capped at maxDelay, so that a bucket that refills slowly (or never) is still
//     looked at regularly, and a flag raising the client's rate is noticed within
//     maxDelay.
//
// rnd returns a float in [0, 1).
func snoozeDelay(refill time.Duration, waiting int, maxDelay time.Duration, rnd func() float64) time.Duration {
	if refill < 0 {
		refill = 0
	}
	atCap := maxDelay - time.Duration(rnd()*float64(maxDelay/4))
	if refill >= maxDelay {
		return atCap
	}
	spread := float64(max(refill/4, jitterFloor)) + 2*float64(max(waiting-1, 0))*float64(refill)
	if d := float64(refill) + rnd()*spread; d < float64(maxDelay) {
		return time.Duration(d)
	}
	return atCap
}

// jitterFloor is the least spread of a snooze: a bucket that is short by a hair is
// still not retried by every lane at once.
const jitterFloor = 50 * time.Millisecond
