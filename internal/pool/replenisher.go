package pool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/logs"
	"github.com/space-sandbox/space/internal/metric"
	"github.com/space-sandbox/space/internal/store"
	"github.com/space-sandbox/space/internal/substrate"
)

// Target is how many slots of one shape the pool should hold (ready + warming).
type Target struct {
	Shape  space.Shape
	Target int
}

// ReplenisherOptions configure a Replenisher.
type ReplenisherOptions struct {
	Pool      *Pool
	Substrate substrate.Substrate
	// Resolve resolves a target's shape as a cold start would (the sandbox flow's
	// Catalog): a target that does not resolve (an unknown template, a shape over a
	// template's cap or a SPACE_MAX_* cap) is refused, counted and logged, and never
	// warmed; its slots are retired.
	Resolve func(space.Shape) (substrate.Template, error)
	// Charger charges each warm-up to the cluster bucket alone (no client rate): a
	// warm-up is a cold start the cluster pays for, but no client asked for it.
	Charger space.Charger
	// Targets returns the current targets; it is read every round, so a flag change
	// resizes the pool without a deploy. A shape absent from the targets has target 0.
	Targets func(ctx context.Context) ([]Target, error)
	// Interval between rounds (default 1s).
	Interval time.Duration
	// MinBackoff and MaxBackoff bound the pause after a rejected warm-up (defaults
	// 500ms and 30s): it doubles with each rejection in a row and is never shorter than
	// the refill time the bucket reported.
	MinBackoff, MaxBackoff time.Duration
	// Parallel is how many warm-ups run at once (default 4).
	Parallel   int
	Registerer prometheus.Registerer
	Logger     *slog.Logger
	// Now is the clock for backoff (default time.Now).
	Now func() time.Time
}

// Replenisher keeps each shape's ready + warming slots at its target. Only one replica
// replenishes at a time: a round runs under a Postgres advisory lock and a replica
// that cannot take it skips the round, so concurrent replicas never overshoot.
type Replenisher struct {
	opts     ReplenisherOptions
	logger   *slog.Logger
	warmups  *prometheus.CounterVec
	refused  prometheus.Counter
	warnings *logs.Throttle
	kick     chan struct{}

	mu        sync.Mutex
	rejected  int       // rejections in a row
	nextRound time.Time // no warm-up before this (backoff)
}

// RoundResult says what one round did.
type RoundResult struct {
	// Leader is false when another replica holds the lock and this round did nothing.
	Leader  bool
	Warmed  int
	Failed  int
	Retired int
	// Rejected is true when the cluster bucket turned a warm-up away; BackoffUntil is
	// when the next warm-up may be tried.
	Rejected     bool
	BackoffUntil time.Time
}

// NewReplenisher returns a Replenisher.
func NewReplenisher(opts ReplenisherOptions) *Replenisher {
	if opts.Interval <= 0 {
		opts.Interval = time.Second
	}
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = 500 * time.Millisecond
	}
	if opts.MaxBackoff <= 0 {
		opts.MaxBackoff = 30 * time.Second
	}
	if opts.Parallel <= 0 {
		opts.Parallel = 4
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	r := &Replenisher{opts: opts, logger: opts.Logger, kick: make(chan struct{}, 1)}
	if r.logger == nil {
		r.logger = slog.New(slog.DiscardHandler)
	}
	r.warmups = metric.Register(opts.Registerer, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "space_pool_warmups_total",
		Help: "Warm pool warm-ups by result: ok, failed (the substrate failed; the slot is replaced), rejected (the cluster bucket was empty), retired (surplus slots, and slots of an older template version or a refused target, stopped).",
	}, []string{"result"}))
	r.refused = metric.Register(opts.Registerer, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "space_pool_targets_refused_total",
		Help: "Warm pool targets refused in a replenishing round because their shape does not resolve as a cold start (unknown template, over a cap): never warmed.",
	}))
	r.warnings = logs.NewThrottle(time.Minute, opts.Now)
	return r
}

// Kick asks for a round now rather than at the next interval, e.g. after a claim.
func (r *Replenisher) Kick() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Run replenishes every Interval (or on Kick) until ctx ends. onRound, when not nil,
// is told each round's result: tests wait on it instead of sleeping.
func (r *Replenisher) Run(ctx context.Context, onRound func(RoundResult, error)) {
	t := time.NewTicker(r.opts.Interval)
	defer t.Stop()
	for {
		res, err := r.Round(ctx)
		if err != nil && ctx.Err() == nil {
			r.logger.WarnContext(ctx, "replenish round failed", "err", err)
		}
		if onRound != nil {
			onRound(res, err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-r.kick:
		}
	}
}

// Round runs one replenishing pass if this replica can take the lock.
func (r *Replenisher) Round(ctx context.Context) (RoundResult, error) {
	var res RoundResult
	leader, err := store.WhileLocked(ctx, r.opts.Pool.db, store.ReplenishLockID, func(ctx context.Context) error {
		return r.round(ctx, &res)
	})
	res.Leader = leader
	if err != nil {
		return res, fmt.Errorf("replenish: %w", err)
	}
	return res, nil
}

// wanted is a target resolved: how many slots of its shape, warmed from the template
// version in force.
type wanted struct {
	kind
	target int
	tmpl   substrate.Template
}

// resolve turns the flag's targets into wanted kinds, refusing, counting and logging
// (once a minute per shape) the targets whose shape would not resolve cold.
func (r *Replenisher) resolve(ctx context.Context, targets []Target) map[kind]*wanted {
	out := make(map[kind]*wanted, len(targets))
	for _, t := range targets {
		tmpl, err := r.opts.Resolve(t.Shape)
		if err != nil {
			r.refused.Inc()
			if ok, _ := r.warnings.Allow(t.Shape.String()); ok {
				r.logger.WarnContext(ctx, "warm pool target refused: its shape does not resolve as a cold start; it is not warmed and its slots are retired",
					"shape", t.Shape.String(), "err", space.ErrorMessage(err))
			}
			continue
		}
		k := kind{Shape: t.Shape, Version: tmpl.Version}
		if w, ok := out[k]; ok {
			w.target += t.Target
			continue
		}
		out[k] = &wanted{kind: k, target: t.Target, tmpl: tmpl}
	}
	return out
}

func (r *Replenisher) round(ctx context.Context, res *RoundResult) error {
	targets, err := r.opts.Targets(ctx)
	if err != nil {
		return fmt.Errorf("targets: %w", err)
	}
	want := r.resolve(ctx, targets)
	ready, warming, err := r.opts.Pool.counts(ctx)
	if err != nil {
		return err
	}
	// Surplus first: a lowered target retires ready slots; slots of a shape no longer
	// targeted, of a refused target, or of an older template version retire all.
	for k, n := range ready {
		target := 0
		if w, ok := want[k]; ok {
			target = w.target
		}
		if surplus := n + warming[k] - target; surplus > 0 {
			retired, err := r.opts.Pool.retire(ctx, k, min(surplus, n))
			res.Retired += retired
			r.warmups.WithLabelValues("retired").Add(float64(retired))
			if err != nil {
				return err
			}
		}
	}

	if until := r.backoffUntil(); r.opts.Now().Before(until) {
		res.BackoffUntil = until
		return nil
	}
	return r.fill(ctx, want, ready, warming, res)
}

// fill starts warm-ups for every kind below its target, charging the cluster bucket
// the template's activation cost for each, until the bucket turns one away. It returns
// once every warm-up it started has finished, so a round's result is complete. A
// template's new version is thus rolled out as fast as the cluster bucket and
// Parallel allow, never faster.
func (r *Replenisher) fill(ctx context.Context, want map[kind]*wanted, ready, warming map[kind]int, res *RoundResult) error {
	sem := make(chan struct{}, r.opts.Parallel)
	var wg sync.WaitGroup
	var mu sync.Mutex
	defer wg.Wait()
	for _, w := range sortedWanted(want) {
		deficit := w.target - ready[w.kind] - warming[w.kind]
		for range max(deficit, 0) {
			_, err := r.opts.Charger.Charge(ctx, space.Charge{Cost: w.tmpl.ActivationCost()})
			var le *space.LimitError
			if errors.As(err, &le) {
				r.warmups.WithLabelValues("rejected").Inc()
				until := r.backOff(le.RetryAfter)
				mu.Lock()
				res.Rejected, res.BackoffUntil = true, until
				mu.Unlock()
				return nil
			}
			if err != nil {
				return fmt.Errorf("replenish: charge: %w", err)
			}
			r.resetBackoff()
			id, err := r.opts.Pool.insertWarming(ctx, w.kind)
			if err != nil {
				return err
			}
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				ok := r.warm(ctx, id, w.Shape, w.tmpl)
				mu.Lock()
				defer mu.Unlock()
				if ok {
					res.Warmed++
				} else {
					res.Failed++
				}
			}()
		}
	}
	return nil
}

// sortedWanted orders the kinds by shape, so that rounds fill shapes in a stable order.
func sortedWanted(want map[kind]*wanted) []*wanted {
	out := make([]*wanted, 0, len(want))
	for _, w := range want {
		out = append(out, w)
	}
	slices.SortFunc(out, func(a, b *wanted) int { return strings.Compare(a.Shape.String()+a.Version, b.Shape.String()+b.Version) })
	return out
}

// warm starts one slot; a slot that fails to warm is deleted, so the next round
// replaces it. The token it was charged stays spent, like any failed cold start.
func (r *Replenisher) warm(ctx context.Context, id string, shape space.Shape, tmpl substrate.Template) bool {
	ref, err := r.opts.Substrate.Warm(ctx, id, shape, tmpl)
	if err == nil {
		err = r.opts.Pool.markReady(ctx, id, ref)
		if err != nil {
			_ = r.opts.Substrate.Stop(context.WithoutCancel(ctx), ref)
		}
	}
	if err != nil {
		r.warmups.WithLabelValues("failed").Inc()
		r.logger.WarnContext(ctx, "warm-up failed; the slot will be replaced", "shape", shape.String(), "err", err)
		if derr := r.opts.Pool.deleteSlot(context.WithoutCancel(ctx), id); derr != nil {
			r.logger.WarnContext(ctx, "delete failed slot", "slot", id, "err", derr)
		}
		return false
	}
	r.warmups.WithLabelValues("ok").Inc()
	return true
}

func (r *Replenisher) backoffUntil() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.nextRound
}

// backOff records a rejection and returns when to try again: MinBackoff doubled per
// rejection in a row, capped at MaxBackoff, and never before the bucket's refill.
func (r *Replenisher) backOff(refill time.Duration) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	d := r.opts.MinBackoff << min(r.rejected, 16)
	if d > r.opts.MaxBackoff || d <= 0 {
		d = r.opts.MaxBackoff
	}
	d = max(d, refill)
	r.rejected++
	r.nextRound = r.opts.Now().Add(d)
	return r.nextRound
}

func (r *Replenisher) resetBackoff() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rejected = 0
	r.nextRound = time.Time{}
}
