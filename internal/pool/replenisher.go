package pool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
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

// Target bounds how many slots of one shape the pool holds (ready + warming): the
// replenisher follows the shape's demand between Min and Max, and Min == Max is a
// fixed target.
type Target struct {
	Shape    space.Shape
	Min, Max int
}

// Fixed is a target of exactly n slots of shape.
func Fixed(shape space.Shape, n int) Target { return Target{Shape: shape, Min: n, Max: n} }

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
	// Reserve is the tokens a warm-up must leave in the cluster bucket
	// (space.Charge.Floor): the part of it that users may take and refills never do,
	// so that a refill never costs a user a 429. 0 lets refills take the last token.
	// internal/app sets it from SPACE_POOL_REFILL_RESERVE.
	Reserve int64
	// Targets returns the current bounds; it is read every round, so a flag change
	// resizes the pool without a deploy. A shape absent from the targets has target 0.
	Targets func(ctx context.Context) ([]Target, error)
	// Interval between rounds (default 1s).
	Interval time.Duration
	// MinBackoff and MaxBackoff bound the pause after a rejected warm-up, and after a
	// failed one of a shape (defaults 500ms and 30s): it doubles with each rejection
	// (failure) in a row, and a rejection's is never shorter than the refill time the
	// bucket reported.
	MinBackoff, MaxBackoff time.Duration
	// Parallel is how many warm-ups run at once (default 16): the batch by which the
	// slots in flight may exceed a target that has just been lowered, and the bound of
	// the refill rate, Parallel slots per warm-up time.
	Parallel int
	// Cooldown is how long a shape keeps a target after its demand last asked for it
	// (default 5m): a burst that comes back within it finds its slots still there.
	Cooldown time.Duration
	// WarmupGuess is the warm-up time expected of a shape before any warm-up has
	// finished (default: the substrate's timeout, at most 10s).
	WarmupGuess time.Duration
	Registerer  prometheus.Registerer
	Logger      *slog.Logger
	// Now is the clock of the backoffs, the demand windows, the cooldown and the
	// warm-up times (default time.Now).
	Now func() time.Time
}

// Replenisher keeps each shape's ready + warming slots at a target that follows its
// demand (demand.go). Only one replica replenishes at a time: a round runs under a
// Postgres advisory lock and a replica that cannot take it skips the round; every
// replica counts the warming slots of all, so concurrent replicas never overshoot.
type Replenisher struct {
	opts     ReplenisherOptions
	logger   *slog.Logger
	warmups  *prometheus.CounterVec
	refused  prometheus.Counter
	skipped  *prometheus.CounterVec
	idle     *prometheus.CounterVec
	warnings *logs.Throttle
	kick     chan struct{}
	// slots holds a token per warm-up in flight on this replica: at most Parallel.
	slots chan struct{}
	// warming is the warm-ups in flight, for Run to wait for when it ends.
	warming sync.WaitGroup

	mu        sync.Mutex
	rejected  int       // rejections in a row
	nextRound time.Time // no warm-up before this (backoff)
	failures  map[kind]*failures
	warmTime  map[space.Shape]*ewma
	anyWarm   ewma // every shape's: the guess for a shape with none yet
	holds     map[space.Shape]*hold
	seeded    bool // holds read from pool_targets, as the last replenisher left them
	saved     map[space.Shape]computed
	savedAt   time.Time
	purgedAt  time.Time
	lastStep  time.Time // the last round this replica led, for the idle slot-seconds
	lastReady map[space.Shape]int
}

// failures is a kind's failed batches of warm-ups in a row, and when it may be tried
// again.
type failures struct {
	n int
	// grew is when a failure last grew the backoff: a warm-up begun before it was in
	// flight beside that failure, one attempt with it.
	grew  time.Time
	until time.Time
}

// RoundResult says what one round did.
type RoundResult struct {
	// Leader is false when another replica holds the lock and this round did nothing.
	Leader bool
	// Started is the warm-ups the round started; Warmed and Failed are those that
	// finished, each way.
	Started int
	Warmed  int
	Failed  int
	Retired int
	// Rejected is true when the cluster bucket turned a warm-up away; BackoffUntil is
	// when the next warm-up may be tried.
	Rejected     bool
	BackoffUntil time.Time
	// Targets is the target the round computed for each shape it keeps.
	Targets map[space.Shape]int
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
		opts.Parallel = 16
	}
	if opts.Cooldown <= 0 {
		opts.Cooldown = 5 * time.Minute
	}
	if opts.WarmupGuess <= 0 {
		opts.WarmupGuess = 10 * time.Second
		if opts.Substrate != nil {
			if t := opts.Substrate.Timeout(); t > 0 {
				opts.WarmupGuess = min(t, opts.WarmupGuess)
			}
		}
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	r := &Replenisher{opts: opts, logger: opts.Logger, kick: make(chan struct{}, 1), slots: make(chan struct{}, opts.Parallel),
		failures: map[kind]*failures{}, warmTime: map[space.Shape]*ewma{}, holds: map[space.Shape]*hold{}}
	if r.logger == nil {
		r.logger = slog.New(slog.DiscardHandler)
	}
	r.warmups = metric.Register(opts.Registerer, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "space_pool_warmups_total",
		Help: "Warm pool warm-ups by result: ok, failed (the substrate failed; the slot is replaced after a backoff), rejected (the cluster bucket could not pay for it: space_pool_refills_skipped_total says why), retired (surplus slots, and slots of an older template version or a refused target, stopped).",
	}, []string{"result"}))
	r.refused = metric.Register(opts.Registerer, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "space_pool_targets_refused_total",
		Help: "Warm pool targets refused in a replenishing round because their shape does not resolve as a cold start (unknown template, over a cap): never warmed.",
	}))
	r.skipped = metric.Register(opts.Registerer, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "space_pool_refills_skipped_total",
		Help: "Warm pool refills put off because the cluster bucket could not pay for them: reserve (taking the tokens would have left less than SPACE_POOL_REFILL_RESERVE, the users' share), empty (no reserve is set and the bucket was empty) or cost (the template's cost and the reserve are more than a warm-up may ever draw: the shape is never warmed).",
	}, []string{"reason"}))
	for _, reason := range []string{skipReserve, skipEmpty, skipCost} {
		r.skipped.WithLabelValues(reason)
	}
	r.idle = metric.Register(opts.Registerer, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "space_pool_idle_slot_seconds_total",
		Help: "Seconds warm pool slots spent ready and unclaimed, summed over the slots of each shape: its rate is the average idle slots, what the pool costs beyond what it serves. Counted by the replica that replenishes (aggregate with sum).",
	}, []string{"shape"}))
	r.warnings = logs.NewThrottle(time.Minute, opts.Now)
	return r
}

// The reasons of space_pool_refills_skipped_total.
const (
	skipReserve = "reserve"
	skipEmpty   = "empty"
	// skipCost: the shape's cost and the floor are more than a warm-up may ever draw.
	skipCost = "cost"
)

// errNeverFits is start's answer for a warm-up no refill could ever pay for.
var errNeverFits = errors.New("the warm-up can never be paid for")

// Kick asks for a round now rather than at the next interval, e.g. after a claim.
func (r *Replenisher) Kick() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Run replenishes every Interval (or on Kick, and whenever a warm-up finishes) until
// ctx ends. Its rounds do not wait for their warm-ups: each starts what the slots in
// flight leave room for, up to Parallel, so that refills keep pace with a burst of
// claims. onRound, when not nil, is told each round's result once its warm-ups have
// finished, possibly from several goroutines at once: tests wait on it instead of
// sleeping. Run returns once every onRound it began has returned, so that what
// onRound writes can be read after Run without a lock.
func (r *Replenisher) Run(ctx context.Context, onRound func(RoundResult, error)) {
	t := time.NewTicker(r.opts.Interval)
	defer t.Stop()
	// The warm-ups in flight end with ctx; their slots are deleted before Run returns,
	// while Postgres is still open.
	defer r.warming.Wait()
	var told sync.WaitGroup
	defer told.Wait()
	for {
		rs, err := r.round(ctx, false)
		if err != nil && ctx.Err() == nil {
			r.logger.WarnContext(ctx, "replenish round failed", "err", err)
		}
		if onRound != nil {
			told.Go(func() {
				rs.wg.Wait()
				onRound(rs.result(), err)
			})
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-r.kick:
		}
	}
}

// Round runs one replenishing pass if this replica can take the lock, and returns once
// every warm-up it started has finished, so that its result is complete. Unlike Run's
// rounds it waits for room when Parallel warm-ups are in flight, so that it starts the
// whole deficit. It is for tests and tools; a replica replenishes with Run.
func (r *Replenisher) Round(ctx context.Context) (RoundResult, error) {
	rs, err := r.round(ctx, true)
	rs.wg.Wait()
	return rs.result(), err
}

// Step runs one round as Run runs them: it starts the warm-ups Parallel leaves room
// for and returns without waiting for them, so its result has Started but neither
// Warmed nor Failed. Tests and the bench drive the replenisher step by step with it.
func (r *Replenisher) Step(ctx context.Context) (RoundResult, error) {
	rs, err := r.round(ctx, false)
	return rs.result(), err
}

// roundState is one round's result, filled in by its warm-ups as they finish.
type roundState struct {
	wg  sync.WaitGroup
	mu  sync.Mutex
	res RoundResult
}

func (rs *roundState) result() RoundResult {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.res
}

func (r *Replenisher) round(ctx context.Context, wait bool) (*roundState, error) {
	rs := &roundState{}
	leader, err := store.WhileLocked(ctx, r.opts.Pool.db, store.ReplenishLockID, func(ctx context.Context) error {
		return r.step(ctx, rs, wait)
	})
	rs.mu.Lock()
	rs.res.Leader = leader
	rs.mu.Unlock()
	if !leader {
		// Another replica counts the idle slots meanwhile.
		r.mu.Lock()
		r.lastStep = time.Time{}
		r.mu.Unlock()
	}
	if err != nil {
		return rs, fmt.Errorf("replenish: %w", err)
	}
	return rs, nil
}

// wanted is a target resolved: the bounds of its shape, warmed from the template
// version in force, and the target computed within them.
type wanted struct {
	kind
	lo, hi int
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
			w.lo, w.hi = w.lo+t.Min, w.hi+t.Max
			continue
		}
		out[k] = &wanted{kind: k, lo: t.Min, hi: t.Max, tmpl: tmpl}
	}
	return out
}

// saveEvery is how often the computed targets are written when nothing changed, so
// that pool_targets' updated_at tells a live replenisher from a stalled one.
const saveEvery = 10 * time.Second

func (r *Replenisher) step(ctx context.Context, rs *roundState, wait bool) error {
	now := r.opts.Now()
	// This replica's own claims of the last second count too.
	if err := r.opts.Pool.FlushDemand(ctx); err != nil {
		r.logger.WarnContext(ctx, "record warm pool demand", "err", err)
	}
	targets, err := r.opts.Targets(ctx)
	if err != nil {
		return fmt.Errorf("targets: %w", err)
	}
	want := r.resolve(ctx, targets)
	ready, warming, err := r.opts.Pool.counts(ctx)
	if err != nil {
		return err
	}
	if err := r.size(ctx, now, want, rs); err != nil {
		return err
	}
	r.countIdle(now, ready, want)

	// Surplus first: a lowered target retires ready slots; slots of a shape no longer
	// targeted, of a refused target, or of an older template version retire all.
	for k, n := range ready {
		target := 0
		if w, ok := want[k]; ok {
			target = w.target
		}
		if surplus := n + warming[k] - target; surplus > 0 {
			retired, err := r.opts.Pool.retire(ctx, k, min(surplus, n))
			rs.mu.Lock()
			rs.res.Retired += retired
			rs.mu.Unlock()
			r.warmups.WithLabelValues("retired").Add(float64(retired))
			if err != nil {
				return err
			}
		}
	}

	if until := r.backoffUntil(); now.Before(until) {
		rs.mu.Lock()
		rs.res.BackoffUntil = until
		rs.mu.Unlock()
		return nil
	}
	return r.fill(ctx, want, ready, warming, rs, wait)
}

// size computes the target of every wanted kind from its shape's demand (demand.go):
// the slots the claim rate keeps in flight over a warm-up time, plus a spare, within
// the flag's bounds, held for a cooldown after the demand last asked for it. It saves
// what it computed to pool_targets, for every replica's metrics and for the next
// replenisher, and deletes the demand no window reads any more.
func (r *Replenisher) size(ctx context.Context, now time.Time, want map[kind]*wanted, rs *roundState) error {
	rates, err := r.opts.Pool.demandRates(ctx, now)
	if err != nil {
		return err
	}
	r.mu.Lock()
	seeded := r.seeded
	r.mu.Unlock()
	var last map[space.Shape]computed
	if !seeded {
		// A replica taking over keeps what the last one computed until its cooldown
		// passes, rather than dropping every pool to what the last minute asks for.
		if last, err = r.opts.Pool.loadTargets(ctx); err != nil {
			return err
		}
	}

	r.mu.Lock()
	if !seeded {
		for s, c := range last {
			h := &hold{}
			h.add(c.PeakAt, c.Target, r.opts.Cooldown)
			r.holds[s] = h
			if c.Warmup > 0 && r.warmTime[s] == nil {
				r.warmTime[s] = &ewma{v: c.Warmup}
			}
		}
		r.seeded = true
	}
	out := make(map[space.Shape]computed, len(want))
	targets := make(map[space.Shape]int, len(want))
	for _, w := range want {
		// Both results of a targeted template are exported from the first round, so
		// that its warm-hit ratio reads 0 hits rather than nothing.
		r.opts.Pool.byTmpl.WithLabelValues(w.Shape.Template, "hit")
		r.opts.Pool.byTmpl.WithLabelValues(w.Shape.Template, "miss")
		warmup := r.warmupOf(w.Shape)
		rate := rates[w.Shape]
		h := r.holds[w.Shape]
		if h == nil {
			h = &hold{}
			r.holds[w.Shape] = h
		}
		w.target = min(max(h.add(now, proposed(rate, warmup, w.lo, w.hi), r.opts.Cooldown), w.lo), w.hi)
		out[w.Shape] = computed{Target: w.target, DemandSlots: rate * warmup.Seconds(), Warmup: warmup, PeakAt: h.peak()}
		targets[w.Shape] = w.target
	}
	for s := range r.holds {
		if _, ok := out[s]; !ok {
			delete(r.holds, s)
		}
	}
	save := !sameTargets(out, r.saved) || now.Sub(r.savedAt) >= saveEvery
	purge := now.Sub(r.purgedAt) >= saveEvery
	r.mu.Unlock()

	rs.mu.Lock()
	rs.res.Targets = targets
	rs.mu.Unlock()
	if save {
		if err := r.opts.Pool.saveTargets(ctx, now, out); err != nil {
			return err
		}
		r.mu.Lock()
		r.saved, r.savedAt = out, now
		r.mu.Unlock()
	}
	if purge {
		if err := r.opts.Pool.purgeDemand(ctx, now); err != nil {
			return err
		}
		r.mu.Lock()
		r.purgedAt = now
		r.mu.Unlock()
	}
	return nil
}

// sameTargets is whether a and b hold the same targets, and demands within a hundredth
// of a slot: what is worth a write.
func sameTargets(a, b map[space.Shape]computed) bool {
	if len(a) != len(b) {
		return false
	}
	for s, x := range a {
		y, ok := b[s]
		if !ok || x.Target != y.Target || math.Abs(x.DemandSlots-y.DemandSlots) >= 0.01 || x.Warmup != y.Warmup {
			return false
		}
	}
	return true
}

// warmupOf is the warm-up time expected of shape: its own average, else every shape's,
// else WarmupGuess. r.mu is held.
func (r *Replenisher) warmupOf(shape space.Shape) time.Duration {
	if e := r.warmTime[shape]; e != nil && e.v > 0 {
		return e.v
	}
	if r.anyWarm.v > 0 {
		return r.anyWarm.v
	}
	return r.opts.WarmupGuess
}

// idleGap is the longest time between two rounds over which the idle slots are
// counted: a longer gap is a stalled replica, which cannot say what the pool held.
const idleGap = time.Minute

// countIdle adds to space_pool_idle_slot_seconds_total the ready slots the previous
// round saw, for the time since it: only over rounds this replica led in a row, so
// that replicas taking turns never count the same seconds twice. A gap over idleGap
// is not counted at all.
func (r *Replenisher) countIdle(now time.Time, ready map[kind]int, want map[kind]*wanted) {
	byShape := map[space.Shape]int{}
	for k, n := range ready {
		byShape[k.Shape] += n
	}
	for _, w := range want {
		r.idle.WithLabelValues(w.Shape.String())
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if dt := now.Sub(r.lastStep); !r.lastStep.IsZero() && dt > 0 && dt <= idleGap {
		for s, n := range r.lastReady {
			if n > 0 {
				r.idle.WithLabelValues(s.String()).Add(float64(n) * dt.Seconds())
			}
		}
	}
	r.lastStep, r.lastReady = now, byShape
}

// fill starts warm-ups for every kind below its target and not backing off after a
// failure, taking turns between kinds, charging the cluster bucket the template's
// activation cost for each (leaving it the reserve), until the bucket turns one away.
// Without wait it starts only as many as Parallel leaves room for; with it, it waits
// for room. A template's new version is thus rolled out as fast as the cluster bucket
// and Parallel allow, never faster.
func (r *Replenisher) fill(ctx context.Context, want map[kind]*wanted, ready, warming map[kind]int, rs *roundState, wait bool) error {
	now := r.opts.Now()
	var kinds []*wanted
	deficit := map[kind]int{}
	for _, w := range sortedWanted(want) {
		if d := w.target - ready[w.kind] - warming[w.kind]; d > 0 && !r.failing(w.kind, now) {
			kinds = append(kinds, w)
			deficit[w.kind] = d
		}
	}
	for len(kinds) > 0 {
		next := kinds[:0]
		for _, w := range kinds {
			if wait {
				select {
				case r.slots <- struct{}{}:
				case <-ctx.Done():
					return ctx.Err()
				}
			} else {
				select {
				case r.slots <- struct{}{}:
				default:
					return nil // Parallel warm-ups in flight: their end kicks a round
				}
			}
			started, err := r.start(ctx, w, rs)
			if errors.Is(err, errNeverFits) {
				<-r.slots
				continue // this kind backs off; the others go on
			}
			if !started || err != nil {
				<-r.slots
				return err
			}
			if deficit[w.kind]--; deficit[w.kind] > 0 {
				next = append(next, w)
			}
		}
		kinds = next
	}
	return nil
}

// start charges one warm-up of w and starts it, holding a token of r.slots that the
// warm-up gives back; false when the cluster bucket refused it (the round ends there).
func (r *Replenisher) start(ctx context.Context, w *wanted, rs *roundState) (bool, error) {
	_, err := r.opts.Charger.Charge(ctx, space.Charge{Cost: w.tmpl.ActivationCost(), Floor: r.opts.Reserve})
	var le *space.LimitError
	if errors.As(err, &le) && le.RetryAfter == time.Duration(math.MaxInt64) {
		// The cost and the floor are more than a warm-up may ever draw (the shared
		// remainder's burst, or the cluster's): no refill makes room, so the kind backs
		// off as a failing one does, and the other kinds are not held up by it.
		r.warmups.WithLabelValues("rejected").Inc()
		r.skipped.WithLabelValues(skipCost).Inc()
		until := r.failed(w.kind, r.opts.Now())
		if ok, _ := r.warnings.Allow("cost:" + w.Shape.String()); ok {
			r.logger.WarnContext(ctx, "a warm-up of this shape costs more than the cluster bucket lets a warm-up draw; it is not warmed",
				"shape", w.Shape.String(), "cost", w.tmpl.ActivationCost(), "floor", r.opts.Reserve, "retry_at", until)
		}
		return false, errNeverFits
	}
	if errors.As(err, &le) {
		r.warmups.WithLabelValues("rejected").Inc()
		reason := skipEmpty
		if r.opts.Reserve > 0 {
			reason = skipReserve
		}
		r.skipped.WithLabelValues(reason).Inc()
		until := r.backOff(le.RetryAfter)
		rs.mu.Lock()
		rs.res.Rejected, rs.res.BackoffUntil = true, until
		rs.mu.Unlock()
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("replenish: charge: %w", err)
	}
	r.resetBackoff()
	id, err := r.opts.Pool.insertWarming(ctx, w.kind)
	if err != nil {
		return false, err
	}
	rs.mu.Lock()
	rs.res.Started++
	rs.mu.Unlock()
	rs.wg.Add(1)
	r.warming.Add(1)
	go func() {
		defer r.warming.Done()
		defer rs.wg.Done()
		ok := r.warm(ctx, id, w.kind, w.tmpl)
		<-r.slots
		rs.mu.Lock()
		if ok {
			rs.res.Warmed++
		} else {
			rs.res.Failed++
		}
		rs.mu.Unlock()
		r.Kick() // room for the next warm-up, or the failure's backoff to start
	}()
	return true, nil
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

// warm starts one slot; a slot that fails to warm is deleted, so that a later round
// replaces it once its kind's backoff has passed. The token it was charged stays
// spent, like any failed cold start. A warm-up that succeeds teaches the warm-up time.
func (r *Replenisher) warm(ctx context.Context, id string, k kind, tmpl substrate.Template) bool {
	began := r.opts.Now()
	ref, err := r.opts.Substrate.Warm(ctx, id, k.Shape, tmpl)
	took := r.opts.Now().Sub(began)
	if err == nil {
		err = r.opts.Pool.markReady(ctx, id, ref)
		if err != nil {
			_ = r.opts.Substrate.Stop(context.WithoutCancel(ctx), ref)
		}
	}
	if err != nil {
		r.warmups.WithLabelValues("failed").Inc()
		until := r.failed(k, began)
		r.logger.WarnContext(ctx, "warm-up failed; the slot will be replaced after a backoff", "shape", k.Shape.String(), "retry_at", until, "err", err)
		if derr := r.opts.Pool.deleteSlot(context.WithoutCancel(ctx), id); derr != nil {
			r.logger.WarnContext(ctx, "delete failed slot", "slot", id, "err", derr)
		}
		return false
	}
	r.warmups.WithLabelValues("ok").Inc()
	r.succeeded(k, took)
	return true
}

// failing is whether kind k is backing off after failed warm-ups at now.
func (r *Replenisher) failing(k kind, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	f := r.failures[k]
	return f != nil && now.Before(f.until)
}

// failed records a failed warm-up of k, begun at began, and returns when k may be
// tried again: MinBackoff doubled per failure in a row, capped at MaxBackoff. A
// substrate that cannot start a template (a bad image, no capacity, pods that never
// become ready) is thus asked ever less often, never in a loop. Warm-ups that were in
// flight together are one attempt: those begun before the failure that last grew the
// backoff do not double it again, so that a batch of Parallel failing at once backs
// off as much as one.
//
// The mark moves only when the backoff grows. Moved by every failure, it let a
// batch whose failures came one by one (a slow machine: each slot freed, warming
// again once the first failure's short pause had passed, before the next failure of
// the batch was recorded) count every later failure as part of the same attempt:
// the backoff stopped growing and the kind was retried at every round.
func (r *Replenisher) failed(k kind, began time.Time) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.opts.Now()
	f := r.failures[k]
	if f == nil {
		f = &failures{}
		r.failures[k] = f
	}
	if f.n == 0 || began.After(f.grew) {
		f.until = maxTime(f.until, now.Add(r.backoff(f.n)))
		f.n++
		f.grew = now
	}
	return f.until
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// succeeded ends k's failures and adds took to the warm-up times: a clock that did not
// move (a test's) teaches nothing.
func (r *Replenisher) succeeded(k kind, took time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.failures, k)
	if took <= 0 {
		return
	}
	e := r.warmTime[k.Shape]
	if e == nil {
		e = &ewma{}
		r.warmTime[k.Shape] = e
	}
	e.add(took)
	r.anyWarm.add(took)
}

// backoff is MinBackoff doubled n times, capped at MaxBackoff.
func (r *Replenisher) backoff(n int) time.Duration {
	d := r.opts.MinBackoff << min(n, 16)
	if d > r.opts.MaxBackoff || d <= 0 {
		d = r.opts.MaxBackoff
	}
	return d
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
	d := max(r.backoff(r.rejected), refill)
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
