package pool_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/admission"
	"github.com/space-sandbox/space/internal/pool"
	"github.com/space-sandbox/space/internal/substrate"
	"github.com/space-sandbox/space/internal/testenv"
)

// 20 claims within the short window (15s) count as 20 - √20 = 15.5, 1.04 claims a
// second; a warm-up of 10s keeps 10.4 slots in flight, and the spare (two standard
// deviations, 2√10.4) makes it 16.8: 17 slots. Within the minute but not the last 15s,
// the same claims are 1/3 a second: 3.3 + 3.7, 7 slots.
const short, long = 17, 7

// guess is the warm-up time the demand tests' replenishers expect: their clock does not
// move while a slot warms, so it is never learned otherwise.
const guess = 10 * time.Second

// following makes the bundle's replenisher follow demand between lo and hi.
func (b *bundle) following(lo, hi int) func(*pool.ReplenisherOptions) {
	return func(o *pool.ReplenisherOptions) {
		o.WarmupGuess = guess
		o.Targets = func(context.Context) ([]pool.Target, error) {
			return []pool.Target{{Shape: python, Min: lo, Max: hi}}, nil
		}
	}
}

// demand makes n claims of python on p and adds them to the demand at the clock's
// time, as p's replica does every second.
func (b *bundle) demand(t *testing.T, p *pool.Pool, n int) {
	t.Helper()
	for range n {
		b.claimOf(t, p, python, "")
	}
	if err := p.FlushDemand(b.ctx); err != nil {
		t.Fatal(err)
	}
}

func targetOf(t *testing.T, res pool.RoundResult) int {
	t.Helper()
	n, ok := res.Targets[python]
	if !ok {
		t.Fatalf("the round computed no target for %s: %+v", python, res)
	}
	return n
}

func TestTargetFollowsDemand(t *testing.T) {
	t.Parallel()

	t.Run("the target is the claims of one warm-up time plus a spare, within min and max", func(t *testing.T) {
		t.Parallel()
		for _, c := range []struct {
			name       string
			lo, hi     int
			after      time.Duration
			want, warm int
		}{
			{"claims in the last 15s", 0, 100, 0, short, short},
			{"claims in the last minute", 0, 100, 20 * time.Second, long, long},
			{"over the max", 0, 5, 0, 5, 5},
			{"under the min", 30, 100, 0, 30, 30},
			{"claims older than a minute", 0, 100, 61 * time.Second, 0, 0},
		} {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				b.demand(t, b.pool, 20)
				b.clock.Advance(c.after)
				res := mustRound(t, b.replenisher(b.following(c.lo, c.hi)), b.ctx)
				if got := targetOf(t, res); got != c.want || res.Warmed != c.warm {
					t.Fatalf("target %d, warmed %d; want %d and %d", got, res.Warmed, c.want, c.warm)
				}
			})
		}
	})

	t.Run("a fixed target ignores demand", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.target.Store(3)
		b.demand(t, b.pool, 20)
		if res := mustRound(t, b.replenisher(nil), b.ctx); targetOf(t, res) != 3 || res.Warmed != 3 {
			t.Fatalf("round = %+v, want the flag's 3", res)
		}
	})

	t.Run("claims on every replica count toward the target the replenishing one computes", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		other := pool.New(pool.Options{DB: b.db, Substrate: b.sim, Now: b.clock.Now})
		b.demand(t, b.pool, 10)
		b.demand(t, other, 10)
		// 10 claims alone would be (10 - √10)/15 a second: 4.6 + 4.3, 9 slots.
		if got := targetOf(t, mustRound(t, b.replenisher(b.following(0, 100)), b.ctx)); got != short {
			t.Fatalf("target %d, want %d: the claims of both replicas", got, short)
		}
	})

	t.Run("scale-down waits for the cooldown, so a burst that comes back within it finds its slots", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := b.replenisher(b.following(0, 100))
		b.demand(t, b.pool, 20)
		if got := targetOf(t, mustRound(t, r, b.ctx)); got != short {
			t.Fatalf("target after the burst %d, want %d", got, short)
		}
		b.clock.Advance(4 * time.Minute) // the demand is out of every window
		if res := mustRound(t, r, b.ctx); targetOf(t, res) != short || res.Retired != 0 {
			t.Fatalf("4 minutes after the burst: %+v, want the target held and nothing retired", res)
		}
		hits := 0
		for range 20 { // the burst comes back
			if b.claim(t, python) != nil {
				hits++
			}
		}
		if hits != short {
			t.Fatalf("the burst that came back got %d warm hits, want one from each of the %d slots kept", hits, short)
		}
		if err := b.pool.FlushDemand(b.ctx); err != nil {
			t.Fatal(err)
		}
		mustRound(t, r, b.ctx)
		b.clock.Advance(4*time.Minute + 30*time.Second) // 8m30s after the first burst
		if res := mustRound(t, r, b.ctx); targetOf(t, res) != short {
			t.Fatalf("within the cooldown of the second burst: %+v, want the target held", res)
		}
		b.clock.Advance(31 * time.Second)
		res := mustRound(t, r, b.ctx)
		if targetOf(t, res) != 0 || res.Retired != short || b.slots(t, "ready") != 0 {
			t.Fatalf("a cooldown after the last burst: %+v with %d ready, want the pool drained", res, b.slots(t, "ready"))
		}
	})

	t.Run("a replenisher that takes over keeps the last target until its cooldown has passed", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.demand(t, b.pool, 20)
		mustRound(t, b.replenisher(b.following(0, 100)), b.ctx)
		b.clock.Advance(2 * time.Minute)
		next := b.replenisher(b.following(0, 100)) // another replica, or a restart
		if got := targetOf(t, mustRound(t, next, b.ctx)); got != short {
			t.Fatalf("the new replenisher's target %d, want the last one's %d", got, short)
		}
		b.clock.Advance(3*time.Minute + time.Second)
		if got := targetOf(t, mustRound(t, next, b.ctx)); got != 0 {
			t.Fatalf("a cooldown after the demand: target %d, want 0", got)
		}
	})

	t.Run("a replenisher that takes over starts from the last one's warm-up time", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.sim = substrate.NewSimulated(substrate.SimulatedOptions{Fail: func(c substrate.Call) error {
			if c.Op == substrate.OpWarm {
				b.clock.Advance(4 * time.Second)
			}
			return nil
		}})
		learn := func(o *pool.ReplenisherOptions) {
			b.following(0, 100)(o)
			o.Substrate, o.Parallel = b.sim, 1
		}
		first := b.replenisher(learn)
		b.demand(t, b.pool, 20)
		mustRound(t, first, b.ctx) // warms, learning 4s
		mustRound(t, first, b.ctx) // saves it
		b.clock.Advance(time.Hour) // the demand and the cooldown are long gone
		b.demand(t, b.pool, 20)
		// 1.04 claims a second over the 4s learned, not the 10s guessed: 9, not 17.
		if got := targetOf(t, mustRound(t, b.replenisher(learn), b.ctx)); got != 9 {
			t.Fatalf("the new replenisher's target %d, want 9: the last one's 4s warm-up", got)
		}
	})

	t.Run("the warm-up time is learned from the warm-ups that succeed", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// Each warm-up takes 4s of the clock; one at a time, so that each measures
		// exactly that.
		b.sim = substrate.NewSimulated(substrate.SimulatedOptions{Fail: func(c substrate.Call) error {
			if c.Op == substrate.OpWarm {
				b.clock.Advance(4 * time.Second)
			}
			return nil
		}})
		reg := prometheus.NewRegistry()
		var lo, hi atomic.Int64
		lo.Store(3)
		hi.Store(3)
		targets := func(context.Context) ([]pool.Target, error) {
			return []pool.Target{{Shape: python, Min: int(lo.Load()), Max: int(hi.Load())}}, nil
		}
		b.pool = pool.New(pool.Options{DB: b.db, Substrate: b.sim, Now: b.clock.Now, Targets: targets, Registerer: reg})
		r := b.replenisher(func(o *pool.ReplenisherOptions) {
			o.Substrate, o.Parallel, o.WarmupGuess, o.Targets = b.sim, 1, guess, targets
		})
		if res := mustRound(t, r, b.ctx); res.Warmed != 3 {
			t.Fatalf("round = %+v, want 3 warmed", res)
		}
		lo.Store(0)
		hi.Store(100)
		b.demand(t, b.pool, 20)
		// 1.04 claims a second over 4s: 4.1 slots in flight, plus 2√4.1: 9.
		if got := targetOf(t, mustRound(t, r, b.ctx)); got != 9 {
			t.Fatalf("target %d, want 9: a 4s warm-up", got)
		}
		for name, want := range map[string]float64{
			"space_pool_warmup_seconds":   4,
			"space_pool_demand_slots":     (20 - math.Sqrt(20)) / 15 * 4,
			"space_pool_target_slots":     9,
			"space_pool_target_min_slots": 0,
			"space_pool_target_max_slots": 100,
		} {
			if got := gauge(t, reg, name); !near(got, want) {
				t.Errorf("%s = %v, want %v", name, got, want)
			}
		}
	})
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// gauge is the value of a gauge of python's shape in reg.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "shape" && l.GetValue() == python.String() {
					if m.GetGauge() != nil {
						return m.GetGauge().GetValue()
					}
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("%s{shape=%q} is not in the registry", name, python.String())
	return 0
}

func TestRetiredVersionsDrain(t *testing.T) {
	t.Parallel()

	t.Run("slots of a retired template version do not count toward the new version's target and are retired", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var version atomic.Value
		version.Store("v1")
		r := b.replenisher(func(o *pool.ReplenisherOptions) {
			b.following(0, 100)(o)
			o.Resolve = func(s space.Shape) (substrate.Template, error) {
				return substrate.Template{Name: s.Template, Image: "python", Version: version.Load().(string)}, nil
			}
		})
		b.demand(t, b.pool, 20)
		if res := mustRound(t, r, b.ctx); res.Warmed != short {
			t.Fatalf("round = %+v", res)
		}
		version.Store("v2")
		b.clock.Advance(time.Minute) // the demand is gone; the cooldown holds the target
		res := mustRound(t, r, b.ctx)
		if targetOf(t, res) != short || res.Warmed != short || res.Retired != short {
			t.Fatalf("after the template changed: %+v, want %d of v2 warmed and the %d of v1 retired", res, short, short)
		}
		var v1, v2 int
		if err := b.db.QueryRow(b.ctx, `SELECT count(*) FILTER (WHERE template_version = 'v1'), count(*) FILTER (WHERE template_version = 'v2')
			FROM pool_slots WHERE state = 'ready'`).Scan(&v1, &v2); err != nil {
			t.Fatal(err)
		}
		if v1 != 0 || v2 != short || b.sim.Running() != short {
			t.Fatalf("ready v1 %d, v2 %d, running %d; want 0, %d, %d", v1, v2, b.sim.Running(), short, short)
		}
		if slot := b.claimOf(t, b.pool, python, "v1"); slot != nil {
			t.Fatalf("a claim of the old version got slot %+v", slot)
		}
	})
}

// inFlight wraps the simulated substrate to count the warm-ups in flight, checking at
// the start of each that they are within the bound the test holds.
type inFlight struct {
	*substrate.Simulated
	now, peak atomic.Int64
	check     func(n int64)
}

func (s *inFlight) Warm(ctx context.Context, slotID string, shape space.Shape, tmpl substrate.Template) (string, error) {
	n := s.now.Add(1)
	defer s.now.Add(-1)
	for {
		p := s.peak.Load()
		if n <= p || s.peak.CompareAndSwap(p, n) {
			break
		}
	}
	s.check(n)
	return s.Simulated.Warm(ctx, slotID, shape, tmpl)
}

func TestWarmUpsThatFail(t *testing.T) {
	t.Parallel()

	t.Run("while warm-ups fail the slots in flight never exceed the target, nor the target plus one batch when it falls", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		const parallel = 8
		sim := substrate.NewSimulated(substrate.SimulatedOptions{Fail: func(c substrate.Call) error {
			if c.Op == substrate.OpWarm {
				return errors.New("pod never became ready")
			}
			return nil
		}})
		var target atomic.Int64
		target.Store(3)
		sub := &inFlight{Simulated: sim}
		sub.check = func(n int64) {
			// Every replica counts the warming slots of all: a warm-up starts only
			// while those in flight are below the target.
			if tg := target.Load(); n > tg {
				t.Errorf("%d warm-ups in flight, over the target of %d", n, tg)
			}
		}
		r := b.replenisher(func(o *pool.ReplenisherOptions) {
			o.Substrate, o.Parallel = sub, parallel
			// The kind is retried at every step, so that the bound is what holds the
			// warm-ups back, not the backoff (which the next test checks).
			o.MinBackoff, o.MaxBackoff = time.Millisecond, time.Millisecond
			o.Targets = func(context.Context) ([]pool.Target, error) {
				return []pool.Target{pool.Fixed(python, int(target.Load()))}, nil
			}
		})
		step := func() {
			t.Helper()
			b.clock.Advance(time.Second)
			if _, err := r.Step(b.ctx); err != nil {
				t.Fatal(err)
			}
		}
		settle := func() {
			t.Helper()
			testenv.Eventually(t, 10*time.Second, "the failed warm-ups to be deleted", func() bool {
				return sub.now.Load() == 0 && b.slots(t, "warming") == 0
			})
		}
		for cycle := range 20 {
			// The pods of each cycle hang (not ready) over several rounds, then fail.
			release := sim.Gate(substrate.OpWarm)
			if cycle == 10 {
				target.Store(1)
			}
			for range 5 {
				step()
			}
			if cycle == 15 {
				// A target lowered while its warm-ups hang: those in flight finish, and
				// exceed it by at most one batch.
				target.Store(3)
				step()
				testenv.Eventually(t, 10*time.Second, "3 warm-ups in flight", func() bool { return sub.now.Load() == 3 })
				target.Store(0)
				b.clock.Advance(time.Second)
				res, err := r.Step(b.ctx)
				if err != nil {
					t.Fatal(err)
				}
				if n := sub.now.Load(); res.Started != 0 || n > target.Load()+parallel {
					t.Fatalf("%d in flight and %d started after the target fell to %d; want none started and at most one batch of %d over it", n, res.Started, target.Load(), parallel)
				}
				target.Store(1)
			}
			release()
			settle()
		}
		if p := sub.peak.Load(); p < 3 {
			t.Fatalf("at most %d warm-ups were ever in flight: the test did not load the bound", p)
		}
		if calls := len(slices.DeleteFunc(sim.Calls(), func(c substrate.Call) bool { return c.Op != substrate.OpWarm })); calls < 20 {
			t.Fatalf("%d warm-ups in 20 cycles: the failures were not retried", calls)
		}
	})

	t.Run("failed warm-ups back off exponentially up to the cap, and a warm-up that succeeds ends it", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.target.Store(2)
		b.fail.Store(1 << 30)
		r := b.replenisher(nil) // MinBackoff 500ms, MaxBackoff 30s
		var attempts []time.Duration
		start := b.clock.Now()
		for range 5 * 60 { // a round a second for 5 minutes
			res := mustRound(t, r, b.ctx)
			if res.Started > 0 {
				if res.Failed != res.Started {
					t.Fatalf("round = %+v, want every warm-up failed", res)
				}
				attempts = append(attempts, b.clock.Now().Sub(start))
			}
			b.clock.Advance(time.Second)
		}
		want := []time.Duration{0, 1, 2, 4, 8, 16, 32, 62, 92, 122, 152, 182, 212, 242, 272}
		for i := range want {
			want[i] *= time.Second
		}
		if !slices.Equal(attempts, want) {
			t.Fatalf("failing warm-ups tried at %v, want %v: doubling pauses, then one every 30s", attempts, want)
		}
		b.fail.Store(0)
		b.clock.Advance(30 * time.Second)
		if res := mustRound(t, r, b.ctx); res.Warmed != 2 {
			t.Fatalf("after the substrate recovered: %+v, want 2 warmed", res)
		}
		b.fail.Store(1)
		b.claim(t, python)
		if res := mustRound(t, r, b.ctx); res.Failed != 1 {
			t.Fatalf("round = %+v, want the replacement failed", res)
		}
		b.clock.Advance(time.Second)
		if res := mustRound(t, r, b.ctx); res.Warmed != 1 {
			t.Fatalf("a second after a new failure: %+v, want it retried after MinBackoff, not 30s", res)
		}
	})

	t.Run("failures that come one by one, each while a later warm-up is in flight, still back off", func(t *testing.T) {
		t.Parallel()
		// A slow machine spreads a batch's failures out: a slot freed by one failure
		// is warming again (the backoff since that failure has passed) before the next
		// failure of the batch is recorded. Each failure is then of a warm-up that
		// began before the previous failure, and must not keep the backoff from
		// growing: the kind would otherwise be retried at every step.
		b := setup(t)
		b.target.Store(2)
		sub := &heldWarmUps{Simulated: b.sim, started: make(chan chan error)}
		r := b.replenisher(func(o *pool.ReplenisherOptions) { o.Substrate, o.Parallel = sub, 2 }) // MinBackoff 500ms, MaxBackoff 30s
		var held []chan error
		var attempts []time.Duration
		start := b.clock.Now()
		for range 5 * 60 { // a step a second for 5 minutes, one failure each
			res, err := r.Step(b.ctx)
			if err != nil {
				t.Fatal(err)
			}
			for range res.Started {
				select {
				case w := <-sub.started:
					held = append(held, w)
					attempts = append(attempts, b.clock.Now().Sub(start))
				case <-time.After(10 * time.Second):
					t.Fatalf("a warm-up the step started never reached the substrate")
				}
			}
			if len(held) > 0 {
				inFlight := len(held)
				held[0] <- errors.New("pod never became ready")
				held = held[1:]
				testenv.Eventually(t, 10*time.Second, "the failed warm-up's slot to be deleted", func() bool {
					return b.slots(t, "warming") == inFlight-1
				})
			}
			b.clock.Advance(time.Second)
		}
		for _, w := range held {
			w <- errors.New("pod never became ready")
		}
		// The first batch fails one by one (0s, 1s): its slots warm again as they free,
		// one attempt; from then on each pause doubles, a batch of 2 after each, up to
		// 30s. Retried at every step it would be 301 warm-ups, one a second.
		want := []time.Duration{0, 0, 1, 2, 3, 4, 6, 6, 10, 10, 18, 18, 34, 34, 64, 64, 94, 94, 124, 124, 154, 154, 184, 184, 214, 214, 244, 244, 274, 274}
		for i := range want {
			want[i] *= time.Second
		}
		if !slices.Equal(attempts, want) {
			t.Fatalf("%d warm-ups in 5 minutes of failures, at %v; want %v", len(attempts), attempts, want)
		}
	})
}

// heldWarmUps holds each warm-up until the test ends it: Warm hands its own result
// channel to started and returns what the test sends on it.
type heldWarmUps struct {
	*substrate.Simulated
	started chan chan error
}

func (s *heldWarmUps) Warm(ctx context.Context, slotID string, shape space.Shape, tmpl substrate.Template) (string, error) {
	result := make(chan error)
	select {
	case s.started <- result:
	case <-ctx.Done():
		return "", ctx.Err()
	}
	select {
	case err := <-result:
		if err != nil {
			return "", err
		}
		return s.Simulated.Warm(ctx, slotID, shape, tmpl)
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

func TestRefillsYieldToUsers(t *testing.T) {
	t.Parallel()

	// A cluster bucket of 20 that never refills; refills (a replenisher that wants 100
	// slots, and three more replicas' worth of raw warm-up charges) and 8 users charge
	// it at once. The users ask for 8 tokens, no more than the reserve: half from the
	// start, half once a refill has been turned away (the bucket is then as low as the
	// refills can take it). By the floor's invariant (docs/design.md, the warm pool)
	// they are never refused; without the reserve the second half is.
	const burst, users = 20, 8
	for _, c := range []struct {
		name    string
		reserve int64
	}{{"with the reserve users are never refused", users}, {"without it the refills take the last tokens", 0}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			for _, topo := range []struct {
				name string
				dial func(testing.TB) redis.UniversalClient
			}{{"standalone", testenv.Redis}, {"cluster", testenv.RedisCluster}} {
				t.Run(topo.name, func(t *testing.T) {
					t.Parallel()
					refused, warmed := refillRace(t, topo.dial(t), burst, c.reserve, users)
					// The refills take what is above the reserve, less what the first users
					// took before them.
					if c.reserve > 0 && (refused != 0 || warmed > burst-users || warmed < burst-users-users/2) {
						t.Fatalf("%d users refused and %d refills admitted; want none refused, and refills taking no more than the %d tokens above the reserve", refused, warmed, burst-users)
					}
					if c.reserve == 0 && refused < users/2 {
						t.Fatalf("%d users refused, want at least the %d who came once a refill was turned away", refused, users/2)
					}
				})
			}
		})
	}
}

// refillRace runs the race of TestRefillsYieldToUsers and returns the users refused and
// the refills admitted.
func refillRace(t *testing.T, rdb redis.UniversalClient, burst, reserve int64, users int) (refused, warmed int) {
	b := setup(t)
	adm, err := admission.New(admission.Options{Redis: rdb, Prefix: testenv.Prefix(t), Enabled: true, FailClosed: true,
		Cluster: space.Rate{RefillRPS: 1e-9, Burst: burst}, Timeout: 5 * time.Second, BatchAbove: admission.DefaultBatchAbove})
	if err != nil {
		t.Fatal(err)
	}
	b.target.Store(100)
	r := b.replenisher(func(o *pool.ReplenisherOptions) {
		o.Charger, o.Reserve, o.Parallel = adm, reserve, 4
		o.MinBackoff, o.MaxBackoff = time.Millisecond, time.Millisecond
	})
	var rejected sync.Once
	turnedAway := make(chan struct{})
	done := make(chan struct{})
	var admittedRefills, refusedUsers atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the replenisher
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			res, err := r.Step(b.ctx)
			if err != nil {
				t.Error(err)
				return
			}
			admittedRefills.Add(int64(res.Started))
			if res.Rejected {
				rejected.Do(func() { close(turnedAway) })
			}
			b.clock.Advance(time.Second) // past any backoff
		}
	}()
	for range 3 { // other replicas' refills
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				_, err := adm.Charge(b.ctx, space.Charge{Cost: 1, Floor: reserve})
				if err == nil {
					admittedRefills.Add(1)
				} else if space.ErrorCode(err) != space.ELIMITED {
					t.Error(err)
					return
				}
			}
		}()
	}
	var userWG sync.WaitGroup
	for i := range users {
		userWG.Add(1)
		go func() {
			defer userWG.Done()
			if i >= users/2 {
				<-turnedAway
			}
			_, err := adm.Charge(b.ctx, space.Charge{Key: space.ClientKey(fmt.Sprint("user-", i)), Cost: 1})
			if space.ErrorCode(err) == space.ELIMITED {
				refusedUsers.Add(1)
			} else if err != nil {
				t.Error(err)
			}
		}()
	}
	userWG.Wait()
	close(done)
	wg.Wait()
	testenv.Eventually(t, 10*time.Second, "the last warm-ups to finish", func() bool { return b.slots(t, "warming") == 0 })
	return int(refusedUsers.Load()), int(admittedRefills.Load())
}

func TestPoolMetrics(t *testing.T) {
	t.Parallel()

	t.Run("claims are counted by template, idle slot-seconds by shape and refills skipped for the reserve", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		reg := prometheus.NewRegistry()
		b.pool = pool.New(pool.Options{DB: b.db, Substrate: b.sim, Now: b.clock.Now, Registerer: reg})
		b.target.Store(2)
		r := b.replenisher(func(o *pool.ReplenisherOptions) { o.Registerer, o.Reserve = reg, 5 })
		mustRound(t, r, b.ctx) // warms 2
		b.clock.Advance(time.Second)
		mustRound(t, r, b.ctx) // sees 2 ready
		b.clock.Advance(3 * time.Second)
		mustRound(t, r, b.ctx) // counts them for 3s
		if got := gauge(t, reg, "space_pool_idle_slot_seconds_total"); got != 6 {
			t.Fatalf("idle slot-seconds %v, want 2 slots × 3s", got)
		}
		b.claim(t, python)
		b.claim(t, python)
		b.claim(t, python)
		b.claim(t, space.Shape{Template: "node-22", CPUMillis: 500, MemoryMiB: 1024, DiskGiB: 5})
		b.charger.set(true)
		mustRound(t, r, b.ctx)
		for _, c := range []struct {
			metric string
			labels []string
			want   float64
		}{
			// Labels in name order: result, template.
			{"space_pool_claims_by_template_total", []string{"hit", "python-3.12"}, 2},
			{"space_pool_claims_by_template_total", []string{"miss", "python-3.12"}, 1},
			{"space_pool_claims_by_template_total", []string{"hit", "node-22"}, 0},
			{"space_pool_claims_by_template_total", []string{"miss", "node-22"}, 1},
			{"space_pool_refills_skipped_total", []string{"reserve"}, 1},
			{"space_pool_refills_skipped_total", []string{"empty"}, 0},
		} {
			if got := counter(t, reg, c.metric, c.labels...); got != c.want {
				t.Errorf("%s%v = %v, want %v", c.metric, c.labels, got, c.want)
			}
		}
		b.charger.mu.Lock()
		defer b.charger.mu.Unlock()
		for _, f := range b.charger.floors {
			if f != 5 {
				t.Fatalf("a warm-up was charged with floor %d, want the reserve of 5", f)
			}
		}
	})
}

// counter is the value of metric with the label values labels, in the order of the
// label names.
func counter(t *testing.T, reg *prometheus.Registry, metric string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != metric {
			continue
		}
		for _, m := range mf.GetMetric() {
			var got []string
			for _, l := range m.GetLabel() {
				got = append(got, l.GetValue())
			}
			if slices.Equal(got, labels) {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("%s%v is not in the registry", metric, labels)
	return 0
}

func TestAWarmUpNoRefillCanPayFor(t *testing.T) {
	t.Parallel()

	t.Run("a shape whose cost and floor are more than a warm-up may ever draw backs off alone, and the others are warmed", func(t *testing.T) {
		t.Parallel()
		// Tiers reserve half of a cluster bucket of 20: the shared remainder, all a
		// warm-up may draw on, holds 10, and the floor keeps 4. A gpu slot costs 8:
		// 8 + 4 > 10, so no refill ever pays for it; python costs 1.
		res := &space.Reservations{
			Shared:   space.Rate{RefillRPS: 5, Burst: 10},
			Reserves: []space.TierReserve{{Tier: "pro", Reserve: space.Reserve{Rate: space.Rate{RefillRPS: 5, Burst: 10}, Lendable: 1}}},
		}
		b := setup(t)
		reg := prometheus.NewRegistry()
		adm, err := admission.New(admission.Options{Redis: testenv.Redis(t), Prefix: testenv.Prefix(t), Enabled: true, FailClosed: true,
			Cluster: space.Rate{RefillRPS: 10, Burst: 20}, Timeout: 5 * time.Second, BatchAbove: admission.DefaultBatchAbove,
			Reservations: func() *space.Reservations { return res }})
		if err != nil {
			t.Fatal(err)
		}
		gpu := space.Shape{Template: "gpu", CPUMillis: 4000, MemoryMiB: 16384, DiskGiB: 20}
		r := b.replenisher(func(o *pool.ReplenisherOptions) {
			o.Charger, o.Reserve, o.Registerer = adm, 4, reg
			o.Resolve = resolveIn(substrate.Templates{
				python.Template: {Name: python.Template, Image: "python", MaxDiskGiB: 50},
				gpu.Template:    {Name: gpu.Template, Image: "cuda", MaxDiskGiB: 50, Cost: 8},
			})
			o.Targets = func(context.Context) ([]pool.Target, error) {
				// gpu sorts first: it is asked before python in every round.
				return []pool.Target{pool.Fixed(gpu, 2), pool.Fixed(python, 3)}, nil
			}
		})
		res1 := mustRound(t, r, b.ctx)
		if res1.Warmed != 3 || res1.Rejected {
			t.Fatalf("first round = %+v, want python's 3 warmed and no backoff of the whole pool", res1)
		}
		if got := counterValue(t, reg, "space_pool_refills_skipped_total", "cost"); got != 1 {
			t.Fatalf("refills skipped for their cost = %v, want the one gpu warm-up tried", got)
		}
		// The next round does not ask for gpu again while it backs off.
		if res2 := mustRound(t, r, b.ctx); res2.Warmed != 0 || res2.Rejected {
			t.Fatalf("second round = %+v, want nothing to do", res2)
		}
		if got := counterValue(t, reg, "space_pool_refills_skipped_total", "cost"); got != 1 {
			t.Fatalf("refills skipped for their cost = %v after a second round, want gpu still backing off", got)
		}
	})
}

// counterValue is the value of the counter vector name's series with the one label
// value; the test fails when there is none.
func counterValue(t *testing.T, reg *prometheus.Registry, name, value string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			if f.GetName() == name && len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == value {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no series %s{%q}", name, value)
	return 0
}
