package sandbox

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/coalesce"
	"github.com/space-sandbox/space/internal/keyed"
	"github.com/space-sandbox/space/internal/metric"
	"github.com/space-sandbox/space/internal/store"
)

// liveCaps refuses, without a booking, the activations of a budget key that this
// replica last found at its live-sandbox cap, while a count begun after they asked
// still finds it there.
//
// A client at its cap that keeps creating (an agent's retry loop) otherwise costs a
// booking a create: a write transaction that takes the key's advisory lock, so that
// its creates queue one behind another in Postgres, from every replica, for a 429
// each, and Postgres is shared by the whole fleet. Once a booking of a key is refused
// at its cap, this replica counts the key's live sandboxes before each activation of
// it for atCapFor (the refusal's Retry-After): the activations that arrive while a
// count is on its way wait together for the next one (coalesce.Reads), so a flood at
// the cap costs Postgres one read at a time, not a locked write a request. A count at
// the cap refuses at once and keeps the hint; one below it forgets the hint and sends
// the activation on to its booking, which counts again under the lock, as every
// booking does.
//
// A refusal here is never one the booking would not have made: its count began after
// the activation asked, and counts what was committed then, so a sandbox ended before
// (on any replica) is not counted against it, and the key did hold its cap at that
// moment. What it leaves out are bookings not yet committed, which the booking's own
// count under the lock then sees. Nothing is refused from the hint alone.
type liveCaps struct {
	db *store.DB
	// hints hold, per budget key, when a booking or a count last found it at its cap
	// (UnixNano; 0 once a count found it below).
	hints  *keyed.Map[atomic.Int64]
	counts coalesce.Reads[capKey, int]
	now    func() time.Time
	// atCap and below are space_sandbox_live_cap_counts_total's two outcomes.
	atCap, below prometheus.Counter
}

// capKey is what one count reads: a budget key's live sandboxes up to its cap (a
// reload may give the key another cap while a count of the old one is on its way).
type capKey struct {
	key space.ClientKey
	cap int
}

// atCapFor is how long after a refusal at its cap a key's activations are counted
// before their booking: the refusal's Retry-After (liveCapError), within which a
// client that retries is expected back.
const atCapFor = time.Second

// Outcomes of space_sandbox_live_cap_counts_total.
const (
	countAtCap = "at_cap"
	countBelow = "below"
)

func newLiveCaps(db *store.DB, now func() time.Time, reg prometheus.Registerer) *liveCaps {
	counts := metric.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "space_sandbox_live_cap_counts_total",
		Help: "Counts of a budget key's live sandboxes made before an activation's booking because this replica found the key at its live-sandbox cap within the last second, " +
			"by outcome: at_cap refused the activation (429 live_sandbox_cap) without a booking, below sent it on to its booking.",
	}, []string{"outcome"}))
	return &liveCaps{
		db: db,
		// A hint older than atCapFor is worth nothing: idle entries go after a second
		// or two, so the map holds the keys at their cap now, not every key that ever was.
		// Their age is read on the hints' own clock.
		hints: keyed.New(keyed.Options[atomic.Int64]{IdleFor: atCapFor, Now: func() int64 { return now().Unix() }}),
		now:   now,
		atCap: counts.WithLabelValues(countAtCap),
		below: counts.WithLabelValues(countBelow),
	}
}

// refuse is the activation's live_sandbox_cap refusal when caller's key was found at
// its cap within atCapFor and a count now still finds it there; nil sends the
// activation on to its booking. A count that fails is the store's error.
func (l *liveCaps) refuse(ctx context.Context, caller space.Caller) error {
	if caller.LiveSandboxes <= 0 {
		return nil
	}
	hint := l.hints.Load(string(caller.Key))
	if hint == nil {
		return nil
	}
	at := hint.Load()
	if at == 0 || l.now().UnixNano()-at >= int64(atCapFor) {
		return nil
	}
	ck := capKey{caller.Key, caller.LiveSandboxes}
	live, err := l.counts.Do(ctx, ck, func(ctx context.Context) (int, error) { return l.count(ctx, ck) })
	if err != nil {
		return fmt.Errorf("count live sandboxes: %w", store.Classify(err))
	}
	if live >= caller.LiveSandboxes {
		l.atCap.Inc()
		hint.Store(l.now().UnixNano())
		return liveCapError(caller.Key, caller.LiveSandboxes)
	}
	l.below.Inc()
	hint.CompareAndSwap(at, 0)
	return nil
}

// booked records what an activation's booking found: a refusal at the cap starts
// (or renews) the key's hint.
func (l *liveCaps) booked(caller space.Caller, err error) {
	if le, ok := errors.AsType[*space.LimitError](err); ok && le.Bucket == space.BucketLiveSandboxCap {
		l.hints.LoadOrNew(string(caller.Key), nil).Store(l.now().UnixNano())
	}
}

// count reads k's live sandboxes, up to its cap, as the booking counts them, without
// its lock.
func (l *liveCaps) count(ctx context.Context, k capKey) (int, error) {
	var live int
	err := l.db.QueryRow(ctx, `SELECT count(*) FROM (`+liveSQL+`) live`, string(k.key), k.cap).Scan(&live)
	return live, err
}
