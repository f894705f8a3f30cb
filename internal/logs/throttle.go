// Package logs holds what space-api's components share about logging.
package logs

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/space-sandbox/space/internal/keyed"
)

// Throttle lets one log line per key through per interval, however many goroutines
// ask at once, and counts the lines it held back: under a flood of requests or an
// outage, a repeated warning is one line per interval, not one per request.
type Throttle struct {
	interval time.Duration
	now      func() time.Time
	// keys are the keys' last lines, bounded (keyed.Map): a key forgotten lets its
	// next line through a little early, which a log can bear.
	keys *keyed.Map[throttleEntry]
}

type throttleEntry struct {
	last atomic.Int64 // Unix nanoseconds of the last line let through; never for none
	held atomic.Int64 // lines held back since
}

const never = math.MinInt64

// throttleKeys bounds the keys a Throttle remembers: one a route and budget key, at
// most, for the refusals' access log.
const throttleKeys = 10_000

// NewThrottle returns a Throttle of one line per key per interval on the clock now
// (default time.Now).
func NewThrottle(interval time.Duration, now func() time.Time) *Throttle {
	if now == nil {
		now = time.Now
	}
	return &Throttle{interval: interval, now: now, keys: keyed.New(keyed.Options[throttleEntry]{
		Max: throttleKeys,
		Now: func() int64 { return now().Unix() },
	})}
}

// Allow reports whether a line for key may be written now and, when it may, how many
// lines for key were held back since the last one written.
func (t *Throttle) Allow(key string) (bool, int64) {
	at := t.now() // once: a read of the clock costs as much as the key's lookup
	e := t.keys.LoadOrNewAt(key, func(e *throttleEntry) { e.last.Store(never) }, at.Unix())
	now := at.UnixNano()
	prev := e.last.Load()
	if prev != never && now-prev < int64(t.interval) {
		e.held.Add(1)
		return false, 0
	}
	// One of the goroutines that saw the same prev wins; the others are held back.
	if !e.last.CompareAndSwap(prev, now) {
		e.held.Add(1)
		return false, 0
	}
	return true, e.held.Swap(0)
}
