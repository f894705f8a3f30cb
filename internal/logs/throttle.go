// Package logs holds what space-api's components share about logging.
package logs

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Throttle lets one log line per key through per interval, however many goroutines
// ask at once, and counts the lines it held back: under a flood of requests or an
// outage, a repeated warning is one line per interval, not one per request.
type Throttle struct {
	interval time.Duration
	now      func() time.Time
	keys     sync.Map // string -> *throttleEntry
}

type throttleEntry struct {
	last atomic.Int64 // Unix nanoseconds of the last line let through; never for none
	held atomic.Int64 // lines held back since
}

const never = math.MinInt64

// NewThrottle returns a Throttle of one line per key per interval on the clock now
// (default time.Now).
func NewThrottle(interval time.Duration, now func() time.Time) *Throttle {
	if now == nil {
		now = time.Now
	}
	return &Throttle{interval: interval, now: now}
}

// Allow reports whether a line for key may be written now and, when it may, how many
// lines for key were held back since the last one written.
func (t *Throttle) Allow(key string) (bool, int64) {
	v, ok := t.keys.Load(key)
	if !ok {
		fresh := &throttleEntry{}
		fresh.last.Store(never)
		v, _ = t.keys.LoadOrStore(key, fresh)
	}
	e := v.(*throttleEntry)
	now := t.now().UnixNano()
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
