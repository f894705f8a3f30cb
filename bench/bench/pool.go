package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/admission"
	"github.com/space-sandbox/space/internal/pool"
	"github.com/space-sandbox/space/internal/store"
	"github.com/space-sandbox/space/internal/substrate"
	"github.com/space-sandbox/space/internal/testenv"
)

// The warm pool scenario (`-only pool`): a bursty trace of claims replayed against the
// pool and the replenisher, in-process, on the simulated substrate, each arm on a
// database of its own, all arms at once on one private redis-server. Each arm's clock
// runs sizes.compression times faster than the wall: the pool's and the replenisher's
// clock (the demand windows, the cooldown, the warm-up times, the backoffs) is that
// clock, and everything that happens in real time is scaled by it: the substrate's
// latency, the tickers, the cluster bucket's refill (Redis refills in real time). Two
// hours of trace run in about two minutes. The arms' clocks start a moment apart, so
// that no two arms' bursts meet on the machine's cores.
//
// The trace, per simulated second: a quiet baseline (a night); then bursts of 10× the
// baseline for 30s every 5 minutes; then a slow ramp up to 5× and back down; then
// quiet again. Arrivals are a Poisson process of that rate from a fixed seed, so every
// arm replays the very same claims at the very same moments of its clock. A hit adopts
// its slot at once; a miss is a cold start, charged to the cluster bucket.
//
// The arms:
//   - the demand-following pool (min 0, max sizes.max), with an ample cluster bucket;
//   - fixed pools of several sizes on the same trace: the comparison is a fixed pool
//     of the demand-following pool's warm-hit ratio, interpolated between the two
//     sizes that bracket it;
//   - two demand-following pools on a tight cluster bucket that the refills share with
//     the misses' cold starts, one with the refill reserve and one without, over the
//     bursts only (while the main arms are quiet);
//   - two demand-following pools whose every warm-up fails, refused by the substrate
//     or at a ready timeout, for 5 minutes from the first burst.

// PoolArm is one arm's figures.
type PoolArm struct {
	Name string
	// Bounds is the flag's: "fixed n" or "min–max".
	Bounds       string
	Claims, Hits int
	// IdleSlotSeconds is space_pool_idle_slot_seconds_total at the end, in simulated
	// seconds.
	IdleSlotSeconds float64
	// PeakTarget and MeanTarget are the computed targets over the replenisher's rounds.
	PeakTarget int
	MeanTarget float64
	// Refused are users' charges (the misses' cold starts) refused with a 429
	// cluster_activation, InBursts those within a burst; Charged all users' charges.
	Charged, Refused, InBursts int
	// Skipped is space_pool_refills_skipped_total.
	Skipped float64
	// MaxInFlight is the most warm-ups the substrate had in flight at once; Attempts the
	// warm-ups it was asked for; Parallel the batch.
	MaxInFlight, Attempts, Parallel int
	// Errors are claims or charges that failed otherwise (none expected).
	Errors int
	// FailAfter, for an arm whose warm-ups fail, is how long each takes to; NoBackoff
	// the warm-ups it would have asked for in its time without backing off, Parallel
	// at a time.
	FailAfter time.Duration
	NoBackoff int
}

// HitRatio is Hits / Claims.
func (a PoolArm) HitRatio() float64 {
	if a.Claims == 0 {
		return 0
	}
	return float64(a.Hits) / float64(a.Claims)
}

// PoolResult is the warm pool scenario.
type PoolResult struct {
	Compression float64
	// Duration is the simulated length of the trace; Warmup the simulated warm-up time;
	// Baseline the claims per simulated second of the quiet baseline.
	Duration, Warmup time.Duration
	Baseline         float64
	Bursts           int
	Following        PoolArm
	Fixed            []PoolArm
	// Matched is the index in Fixed of the smallest fixed pool whose warm-hit ratio
	// reaches Following's; -1 when none does. Equal is the size and the idle
	// slot-seconds of a fixed pool of exactly Following's ratio, interpolated between
	// Matched and the size below it: what the comparison is judged on, since the sizes
	// tried are a few slots apart.
	Matched              int
	EqualSize, EqualIdle float64
	// Reserved and Unreserved are the tight-bucket arms, with SPACE_POOL_REFILL_RESERVE
	// at ReserveShare and at 0; TightBucket their cluster bucket (per simulated second).
	Reserved, Unreserved PoolArm
	ReserveShare         float64
	TightBucket          space.Rate
	TightWarmup          time.Duration
	// Failing are the arms whose warm-ups fail, over FailingFor: refused by the
	// substrate at once, and pods that never become ready.
	Failing    []PoolArm
	FailingFor time.Duration
	Took       time.Duration
}

// IdleRatio is Following's idle slot-seconds over those of a fixed pool of the same
// warm-hit ratio (EqualIdle); +Inf when no fixed pool tried reached it.
func (r *PoolResult) IdleRatio() float64 {
	if r.Matched < 0 || r.EqualIdle <= 0 {
		return math.Inf(1)
	}
	return r.Following.IdleSlotSeconds / r.EqualIdle
}

// match finds the smallest fixed pool reaching Following's warm-hit ratio, and
// interpolates the one of exactly that ratio between it and the next smaller one.
func (r *PoolResult) match() {
	want := r.Following.HitRatio()
	for i, f := range r.Fixed {
		if f.HitRatio() < want {
			continue
		}
		r.Matched = i
		n, idle := float64(f.PeakTarget), f.IdleSlotSeconds
		r.EqualSize, r.EqualIdle = n, idle
		if i > 0 {
			below := r.Fixed[i-1]
			if span := f.HitRatio() - below.HitRatio(); span > 0 {
				x := (want - below.HitRatio()) / span
				r.EqualSize = float64(below.PeakTarget) + x*(n-float64(below.PeakTarget))
				r.EqualIdle = below.IdleSlotSeconds + x*(idle-below.IdleSlotSeconds)
			}
		}
		return
	}
}

// poolSizes are the scenario's durations and rates, in simulated time.
type poolSizes struct {
	compression            float64
	warmup                 time.Duration
	baseline               float64 // claims per second
	quiet, burstGap, burst time.Duration
	bursts                 int
	rampUp, rampDown, tail time.Duration
	rampPeak               float64 // × baseline
	max                    int     // the demand-following pools' max
	fixed                  []int
	parallel               int
	// The tight arms: their cluster bucket, reserve and warm-up time.
	tight       space.Rate
	reserve     float64
	tightWarmup time.Duration
	// The failing arms: how long a warm-up takes to fail, refused and never ready.
	failingFor, refusedAfter, neverReadyAfter time.Duration
	failingParallel, failHi                   int
}

func poolSizesFor(quick bool) poolSizes {
	s := poolSizes{
		compression: 60, warmup: 10 * time.Second, baseline: 0.2,
		quiet: 90 * time.Minute, burstGap: 5 * time.Minute, burst: 30 * time.Second, bursts: 3,
		rampUp: 10 * time.Minute, rampDown: 6 * time.Minute, tail: 8 * time.Minute, rampPeak: 5,
		max: 60, fixed: []int{16, 19, 22, 25, 28, 32}, parallel: 64,
		tight: space.Rate{RefillRPS: 2, Burst: 40}, reserve: 0.75, tightWarmup: 30 * time.Second,
		failingFor: 5 * time.Minute, refusedAfter: 2 * time.Second, neverReadyAfter: 30 * time.Second, failingParallel: 8, failHi: 40,
	}
	if quick {
		s.compression = 60
		s.quiet, s.bursts, s.burstGap = 2*time.Minute, 2, 2*time.Minute
		s.rampUp, s.rampDown, s.tail = time.Minute, 30*time.Second, 30*time.Second
		s.fixed = []int{10, 25}
		s.failingFor = 2 * time.Minute
	}
	return s
}

// trace is the claims of the scenario, and when its bursts are.
type trace struct {
	claims []time.Duration // arrival times
	bursts [][2]time.Duration
	length time.Duration
}

// newTrace draws the trace of s from a fixed seed.
func newTrace(s poolSizes) trace {
	var tr trace
	rampStart := s.quiet + time.Duration(s.bursts)*s.burstGap
	rampTop := rampStart + s.rampUp
	rampEnd := rampTop + s.rampDown
	tr.length = rampEnd + s.tail
	for i := range s.bursts {
		at := s.quiet + time.Duration(i)*s.burstGap
		tr.bursts = append(tr.bursts, [2]time.Duration{at, at + s.burst})
	}
	rate := func(t time.Duration) float64 {
		if tr.inBurst(t) {
			return 10 * s.baseline
		}
		switch {
		case t >= rampStart && t < rampTop:
			return s.baseline * (1 + (s.rampPeak-1)*float64(t-rampStart)/float64(s.rampUp))
		case t >= rampTop && t < rampEnd:
			return s.baseline * (s.rampPeak - (s.rampPeak-1)*float64(t-rampTop)/float64(s.rampDown))
		}
		return s.baseline
	}
	// A Poisson process of rate(t): candidates at the highest rate, each kept with
	// probability rate(t)/highest.
	rng := rand.New(rand.NewPCG(1, 2))
	top := 10 * s.baseline
	for t := 0.0; ; {
		t += rng.ExpFloat64() / top
		at := time.Duration(t * float64(time.Second))
		if at >= tr.length {
			break
		}
		if rng.Float64() < rate(at)/top {
			tr.claims = append(tr.claims, at)
		}
	}
	return tr
}

func (tr trace) inBurst(t time.Duration) bool {
	for _, b := range tr.bursts {
		if t >= b[0] && t < b[1] {
			return true
		}
	}
	return false
}

// fastClock is an arm's clock: compression simulated seconds per real one, reading
// skip (a point of the trace) at began.
type fastClock struct {
	origin, began time.Time
	skip          time.Duration
	k             float64
}

func (c *fastClock) Now() time.Time {
	return c.origin.Add(c.skip + time.Duration(float64(time.Since(c.began))*c.k))
}

// real is a simulated duration in real time.
func (c *fastClock) real(d time.Duration) time.Duration { return time.Duration(float64(d) / c.k) }

// sleepUntil waits until the clock reads the point t of the trace.
func (c *fastClock) sleepUntil(ctx context.Context, t time.Duration) error {
	return sleepUntil(ctx, c.began.Add(c.real(t-c.skip)))
}

// sleepUntil waits until t or the end of ctx.
func sleepUntil(ctx context.Context, t time.Time) error {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}

var benchShape = space.Shape{Template: "python-3.12", CPUMillis: 1000, MemoryMiB: 2048, DiskGiB: 10}

// poolArmSpec is what an arm runs.
type poolArmSpec struct {
	name     string
	lo, hi   int
	cluster  space.Rate // per simulated second
	reserve  float64
	fail     bool
	warmup   time.Duration // what the replenisher expects before it learns
	latency  time.Duration // what a warm-up takes on the substrate, to succeed or fail
	parallel int
	// The arm replays the claims of [from, till); its clock starts at skip, before
	// from, so that its pool has settled on the baseline when they begin.
	skip, from, till time.Duration
}

func runPool(ctx context.Context, env *Env, quick bool) (*PoolResult, error) {
	began := time.Now()
	sz := poolSizesFor(quick)
	tr := newTrace(sz)
	rs, err := startRedis(ctx, env.Dir)
	if err != nil {
		return nil, err
	}
	defer rs.Stop()
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr})
	defer rdb.Close()

	ample := space.Rate{RefillRPS: 1000, Burst: 10000}
	first, last := tr.bursts[0][0], tr.bursts[len(tr.bursts)-1][1]
	// The main arms replay the whole trace; the tight and the failing arms only the
	// bursts, while the main arms are in their quiet hour, so that fewer arms share the
	// machine at any moment.
	main := func(name string, lo, hi int) poolArmSpec {
		return poolArmSpec{name: name, lo: lo, hi: hi, cluster: ample, reserve: 0.2, warmup: sz.warmup, latency: sz.warmup, parallel: sz.parallel, till: tr.length}
	}
	tight := func(name string, reserve float64) poolArmSpec {
		settle := min(first, 3*time.Minute)
		return poolArmSpec{name: name, lo: 0, hi: sz.max, cluster: sz.tight, reserve: reserve, warmup: sz.tightWarmup, latency: sz.tightWarmup, parallel: sz.parallel,
			skip: first - settle, from: first - settle, till: last + settle}
	}
	specs := []poolArmSpec{
		main("demand-following", 0, sz.max),
		tight("reserve", sz.reserve),
		tight("no reserve", 0),
	}
	for _, f := range []struct {
		name  string
		after time.Duration
	}{{"failing: refused", sz.refusedAfter}, {"failing: not ready", sz.neverReadyAfter}} {
		specs = append(specs, poolArmSpec{name: f.name, lo: 0, hi: sz.failHi, cluster: ample, reserve: 0.2, fail: true, warmup: sz.warmup, latency: f.after, parallel: sz.failingParallel,
			skip: first - min(first, time.Minute), from: first, till: first + sz.failingFor})
	}
	for _, n := range sz.fixed {
		specs = append(specs, main(fmt.Sprintf("fixed %d", n), n, n))
	}
	// Every database is made and migrated before the clock starts, so that the arms
	// replay the trace together.
	arms := make([]*poolArmRun, len(specs))
	defer func() {
		for _, a := range arms {
			if a != nil {
				a.close()
			}
		}
	}()
	for i, spec := range specs {
		if arms[i], err = env.newPoolArm(ctx, spec, sz); err != nil {
			return nil, fmt.Errorf("arm %s: %w", spec.name, err)
		}
	}
	// Each arm has a clock of its own, started a little after the last one's, so that
	// no two arms' bursts meet: the arms share the machine's two cores, and a burst of
	// claims on every arm at once would measure the machine, not the pool.
	env.logf("pool: replaying %s of trace (%d claims, %d bursts) at %.0f× on %d arms", tr.length, len(tr.claims), len(tr.bursts), sz.compression, len(arms))
	start := time.Now()
	stagger := time.Duration(float64(sz.burstGap) / sz.compression / float64(len(arms)))
	results := make([]PoolArm, len(arms))
	errs := make([]error, len(arms))
	var wg sync.WaitGroup
	for i, a := range arms {
		clock := &fastClock{origin: time.Unix(2_000_000_000, 0), began: start.Add(time.Duration(i) * stagger), skip: specs[i].skip, k: sz.compression}
		wg.Go(func() {
			if err := sleepUntil(ctx, clock.began); err != nil {
				errs[i] = err
				return
			}
			results[i], errs[i] = a.run(ctx, clock, rdb, tr)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	res := &PoolResult{Compression: sz.compression, Duration: tr.length, Warmup: sz.warmup, Baseline: sz.baseline, Bursts: len(tr.bursts),
		Following: results[0], Reserved: results[1], Unreserved: results[2], Failing: results[3:5], Fixed: results[5:],
		ReserveShare: sz.reserve, TightBucket: sz.tight, TightWarmup: sz.tightWarmup, FailingFor: sz.failingFor, Matched: -1}
	res.match()
	res.Took = time.Since(began)
	return res, nil
}

// poolArmRun is an arm set up: its database, pool, replenisher and buckets.
type poolArmRun struct {
	spec   poolArmSpec
	sz     poolSizes
	db     *pgxpool.Pool
	drop   func()
	prefix string
}

func (e *Env) newPoolArm(ctx context.Context, spec poolArmSpec, sz poolSizes) (*poolArmRun, error) {
	e.leftovers.Do(func() {
		if err := testenv.DropLeftoverDatabases(ctx, e.AdminURL); err != nil {
			e.logf("dropping leftover databases: %v", err)
		}
	})
	url, drop, err := testenv.CreateDatabase(ctx, e.AdminURL, "")
	if err != nil {
		return nil, fmt.Errorf("bench database: %w", err)
	}
	db, err := store.Open(ctx, url)
	if err != nil {
		drop()
		return nil, err
	}
	if err := store.Migrate(ctx, db, nil); err != nil {
		db.Close()
		drop()
		return nil, err
	}
	return &poolArmRun{spec: spec, sz: sz, db: db, drop: drop, prefix: "bench-pool-" + testenv.RandomID(4)}, nil
}

func (a *poolArmRun) close() {
	a.db.Close()
	a.drop()
}

// countingSubstrate counts the warm-ups in flight on the simulated substrate.
type countingSubstrate struct {
	*substrate.Simulated
	now, peak, calls atomic.Int64
}

func (s *countingSubstrate) Warm(ctx context.Context, slotID string, shape space.Shape, tmpl substrate.Template) (string, error) {
	s.calls.Add(1)
	n := s.now.Add(1)
	defer s.now.Add(-1)
	for p := s.peak.Load(); n > p && !s.peak.CompareAndSwap(p, n); p = s.peak.Load() {
	}
	return s.Simulated.Warm(ctx, slotID, shape, tmpl)
}

// run replays the arm's part of tr on clock and returns its figures.
func (a *poolArmRun) run(ctx context.Context, clock *fastClock, rdb *redis.Client, tr trace) (PoolArm, error) {
	spec := a.spec
	out := PoolArm{Name: spec.name, Bounds: fmt.Sprintf("%d–%d", spec.lo, spec.hi), Parallel: spec.parallel}
	if spec.fail {
		out.FailAfter = spec.latency
		out.NoBackoff = int(float64(spec.parallel) * float64(spec.till-spec.from) / float64(spec.latency))
	}
	if spec.lo == spec.hi {
		out.Bounds = fmt.Sprintf("fixed %d", spec.lo)
	}
	sim := substrate.NewSimulated(substrate.SimulatedOptions{
		Latency: map[substrate.Op]time.Duration{substrate.OpWarm: clock.real(spec.latency)},
		Fail: func(c substrate.Call) error {
			if spec.fail && c.Op == substrate.OpWarm {
				return errors.New("the pod never became ready")
			}
			return nil
		},
	})
	sub := &countingSubstrate{Simulated: sim}
	tick := clock.real(time.Second)
	// The cluster bucket refills in Redis time: its refill is per simulated second.
	adm, err := admission.New(admission.Options{Redis: rdb, Prefix: a.prefix, Enabled: true, FailClosed: true,
		Cluster: space.Rate{RefillRPS: spec.cluster.RefillRPS * clock.k, Burst: spec.cluster.Burst}, Timeout: 5 * time.Second,
		BatchAbove: admission.DefaultBatchAbove})
	if err != nil {
		return out, err
	}
	targets := func(context.Context) ([]pool.Target, error) {
		return []pool.Target{{Shape: benchShape, Min: spec.lo, Max: spec.hi}}, nil
	}
	reg := prometheus.NewRegistry()
	p := pool.New(pool.Options{DB: a.db, Substrate: sub, Targets: targets, Registerer: reg, Now: clock.Now})
	tmpl := substrate.Template{Name: benchShape.Template, Image: "python", Version: "v1"}
	r := pool.NewReplenisher(pool.ReplenisherOptions{
		Pool: p, Substrate: sub, Charger: adm, Targets: targets,
		Resolve:     func(space.Shape) (substrate.Template, error) { return tmpl, nil },
		Reserve:     int64(math.Ceil(spec.reserve * float64(spec.cluster.Burst))),
		Interval:    tick,
		Parallel:    spec.parallel,
		WarmupGuess: spec.warmup,
		Registerer:  reg,
		Now:         clock.Now,
	})

	runCtx, stop := context.WithCancel(ctx)
	var bg sync.WaitGroup
	var mu sync.Mutex
	var targetSum float64
	var rounds int
	bg.Go(func() {
		r.Run(runCtx, func(res pool.RoundResult, _ error) {
			if n, ok := res.Targets[benchShape]; ok {
				mu.Lock()
				out.PeakTarget = max(out.PeakTarget, n)
				targetSum += float64(n)
				rounds++
				mu.Unlock()
			}
		})
	})
	bg.Go(func() { p.RunDemand(runCtx, tick) })

	var claims sync.WaitGroup
	var hits, claimed, charged, refused, inBursts, failures atomic.Int64
	charge := func(at time.Duration, who space.ClientKey) {
		charged.Add(1)
		_, err := adm.Charge(runCtx, space.Charge{Key: who, Cost: tmpl.ActivationCost()})
		var le *space.LimitError
		switch {
		case errors.As(err, &le) && le.Bucket == space.BucketClusterActivation:
			refused.Add(1)
			if tr.inBurst(at) {
				inBursts.Add(1)
			}
		case err != nil:
			failures.Add(1)
		}
	}
	claim := func(at time.Duration) {
		claimed.Add(1)
		slot, err := claimOnce(runCtx, a.db, p, tmpl.Version)
		if err != nil {
			failures.Add(1)
			return
		}
		if slot == nil {
			charge(at, "bench-user") // a miss starts cold
			return
		}
		hits.Add(1)
		r.Kick()
		if err := p.Consume(runCtx, slot); err != nil {
			failures.Add(1)
		}
		_ = sub.Stop(runCtx, slot.Ref)
	}
	for _, at := range tr.claims {
		if at < spec.from || at >= spec.till {
			continue
		}
		if err = clock.sleepUntil(ctx, at); err != nil {
			break
		}
		claims.Go(func() { claim(at) })
	}
	if err == nil {
		err = clock.sleepUntil(ctx, spec.till)
	}
	claims.Wait()
	stop()
	bg.Wait()
	if err != nil {
		return out, err
	}
	out.Claims, out.Hits = int(claimed.Load()), int(hits.Load())
	out.Charged, out.Refused, out.InBursts, out.Errors = int(charged.Load()), int(refused.Load()), int(inBursts.Load()), int(failures.Load())
	out.MaxInFlight, out.Attempts = int(sub.peak.Load()), int(sub.calls.Load())
	if rounds > 0 {
		out.MeanTarget = targetSum / float64(rounds)
	}
	out.IdleSlotSeconds = gathered(reg, "space_pool_idle_slot_seconds_total", "")
	out.Skipped = gathered(reg, "space_pool_refills_skipped_total", "reserve") + gathered(reg, "space_pool_refills_skipped_total", "empty")
	return out, nil
}

// claimOnce claims a ready slot as a create does: inside the transaction that inserts
// its sandbox.
func claimOnce(ctx context.Context, db *pgxpool.Pool, p *pool.Pool, version string) (*pool.Slot, error) {
	var slot *pool.Slot
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		id := uuid.NewString()
		if _, err := tx.Exec(ctx, `INSERT INTO sandboxes (id, client, budget_key, state, template, cpu_millis, memory_mib, disk_gib)
			VALUES ($1, 'bench', 'bench', 'starting', $2, $3, $4, $5)`,
			id, benchShape.Template, benchShape.CPUMillis, benchShape.MemoryMiB, benchShape.DiskGiB); err != nil {
			return err
		}
		var err error
		slot, err = p.Claim(ctx, tx, benchShape, version, id)
		return err
	})
	return slot, err
}

// gathered is the sum of the counter name in reg whose labels hold label (any when
// empty).
func gathered(reg *prometheus.Registry, name, label string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return math.NaN()
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := label == ""
			for _, l := range m.GetLabel() {
				match = match || l.GetValue() == label
			}
			if match {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// poolTargets are the scenario's targets.
func (r *Report) poolTargets() []Target {
	p := r.Pool
	if p == nil {
		return nil
	}
	f := p.Following
	ts := []Target{{"demand-following warm pool: warm-hit ratio ≥ 90%", fmt.Sprintf("%.1f%%", 100*f.HitRatio()), f.HitRatio() >= 0.9}}
	idle := "no fixed pool tried reached its warm-hit ratio"
	if p.Matched >= 0 {
		m := p.Fixed[p.Matched]
		idle = fmt.Sprintf("%.2f× (%.0f slot-s against %.0f for a fixed pool of %.1f at %.1f%%; the %s tried: %.0f, %.2f×)",
			p.IdleRatio(), f.IdleSlotSeconds, p.EqualIdle, p.EqualSize, 100*f.HitRatio(), m.Bounds, m.IdleSlotSeconds, f.IdleSlotSeconds/m.IdleSlotSeconds)
	}
	ts = append(ts, Target{"≤ 60% of the idle slot-seconds of a fixed pool of the same warm-hit ratio", idle, p.IdleRatio() <= 0.6})
	ts = append(ts, Target{"no user 429 cluster_activation in the bursts that a refill caused (with the refill reserve; without it, beside)",
		fmt.Sprintf("%d with the reserve, %d without", p.Reserved.InBursts, p.Unreserved.InBursts), p.Reserved.InBursts == 0})
	for _, x := range p.Failing {
		ts = append(ts, Target{fmt.Sprintf("warm-ups failing (%s, after %s) for %s: slots in flight ≤ target + batch", strings.TrimPrefix(x.Name, "failing: "), x.FailAfter, p.FailingFor),
			fmt.Sprintf("at most %d in flight, peak target %d, batch %d; %d warm-ups, %d without backing off", x.MaxInFlight, x.PeakTarget, x.Parallel, x.Attempts, x.NoBackoff),
			x.MaxInFlight <= x.PeakTarget+x.Parallel})
	}
	return ts
}

// poolSummary writes the scenario's lines of the plain-text summary.
func (r *Report) poolSummary(b *strings.Builder) {
	p := r.Pool
	if p == nil {
		return
	}
	for _, a := range p.arms() {
		fmt.Fprintf(b, "  pool %-16s %-9s %4d claims, %5.1f%% warm hits, %6.0f idle slot-s, target peak %d mean %.1f, %d/%d users refused (%d in bursts), %.0f refills skipped, %d warm-ups (at most %d at once)\n",
			a.Name, a.Bounds, a.Claims, 100*a.HitRatio(), a.IdleSlotSeconds, a.PeakTarget, a.MeanTarget, a.Refused, a.Charged, a.InBursts, a.Skipped, a.Attempts, a.MaxInFlight)
	}
}

func (p *PoolResult) arms() []PoolArm {
	arms := append([]PoolArm{p.Following, p.Reserved, p.Unreserved}, p.Failing...)
	return append(arms, p.Fixed...)
}

// poolMarkdown writes the scenario's section of docs/benchmarks.md.
func (r *Report) poolMarkdown(b *strings.Builder) {
	p := r.Pool
	if p == nil {
		return
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("### 7. Warm pool: a target that follows demand\n\n")
	w("A trace of %s (simulated) replayed at %.0f× on a fast clock (`-only pool`, bench/bench/pool.go) against the pool and the replenisher, in-process, on the simulated substrate with warm-ups of %s, each arm on a database of its own and a clock of its own, started a moment after the last one's so that no two arms' bursts meet on the machine's cores. ",
		p.Duration, p.Compression, p.Warmup)
	w("The trace: a quiet baseline of %.2g claims/s for an hour and a half (a night), %d bursts of 10× for 30 s every 5 minutes, a slow ramp to 5× and back, quiet again; the same Poisson arrivals (a fixed seed) for every arm. ", p.Baseline, p.Bursts)
	w("A hit adopts its slot at once; a miss charges the cluster bucket as a cold start. Idle slot-seconds are `space_pool_idle_slot_seconds_total`, in simulated seconds. ")
	w("The comparison is a fixed pool of the demand-following pool's warm-hit ratio, interpolated between the two fixed sizes tried that bracket it (the smallest of them reaching it, beside).\n\n")
	w("The tight arms replay the bursts only (from 3 minutes before the first), with warm-ups of %s, on a cluster bucket of burst %d refilling %.3g/s (simulated), with `SPACE_POOL_REFILL_RESERVE` %.2g and 0: ", p.TightWarmup, p.TightBucket.Burst, p.TightBucket.RefillRPS, p.ReserveShare)
	w("the bucket refills as fast as the bursts claim, so that the users alone (every claim a miss) never outrun it and the reserve covers their chance clusters; what refuses a user is the refills' taking tokens ahead of them. ")
	w("The failing arms' warm-ups all fail, for %s from the first burst, their target following the misses: refused by the substrate after %s, or pods that never become ready, failed at a ready timeout of %s.\n\n",
		p.FailingFor, p.Failing[0].FailAfter, p.Failing[1].FailAfter)
	w("| arm | bounds | claims | warm hits | idle slot-s | target peak / mean | users refused (in bursts) | refills skipped | warm-ups (most at once, batch) |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, a := range p.arms() {
		w("| %s | %s | %d | %.1f%% | %.0f | %d / %.1f | %d of %d (%d) | %.0f | %d (%d, %d) |\n", a.Name, a.Bounds, a.Claims, 100*a.HitRatio(), a.IdleSlotSeconds,
			a.PeakTarget, a.MeanTarget, a.Refused, a.Charged, a.InBursts, a.Skipped, a.Attempts, a.MaxInFlight, a.Parallel)
	}
	w("\n")
}
