package pool_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/pool"
	"github.com/space-sandbox/space/internal/substrate"
	"github.com/space-sandbox/space/internal/testenv"
)

var python = space.Shape{Template: "python-3.12", CPUMillis: 1000, MemoryMiB: 2048, DiskGiB: 10}

// charger records the charges the replenisher makes and rejects while told to.
type charger struct {
	mu       sync.Mutex
	charges  int
	rejects  int
	reject   bool
	clients  []space.ClientKey
	floors   []int64
	withRate int
}

// CachedRefusal knows nothing ahead: every charge is the test's to decide.
func (c *charger) CachedRefusal(space.Charge) (space.Hold, *space.LimitError) { return nil, nil }

func (c *charger) Charge(_ context.Context, ch space.Charge) (space.Charged, error) {
	client, rate := ch.Key, ch.Rate
	c.mu.Lock()
	defer c.mu.Unlock()
	c.clients = append(c.clients, client)
	c.floors = append(c.floors, ch.Floor)
	if rate != nil {
		c.withRate++
	}
	if c.reject {
		c.rejects++
		return space.Charged{}, &space.LimitError{Bucket: space.BucketClusterActivation, RetryAfter: 2 * time.Second}
	}
	c.charges++
	return space.Charged{}, nil
}

func (c *charger) set(reject bool) {
	c.mu.Lock()
	c.reject = reject
	c.mu.Unlock()
}

type bundle struct {
	ctx     context.Context
	db      *pgxpool.Pool
	sim     *substrate.Simulated
	pool    *pool.Pool
	charger *charger
	clock   *testenv.Clock
	target  atomic.Int64
	fail    atomic.Int64 // warm-ups still to fail
}

func setup(t *testing.T) *bundle {
	t.Helper()
	return setupOn(t, testenv.DB(t))
}

func setupOn(t *testing.T, db *pgxpool.Pool) *bundle {
	t.Helper()
	b := &bundle{ctx: testenv.Context(t), db: db, charger: &charger{}, clock: testenv.NewClock(time.Unix(1_800_000_000, 0))}
	b.sim = substrate.NewSimulated(substrate.SimulatedOptions{Fail: func(c substrate.Call) error {
		if c.Op == substrate.OpWarm && b.fail.Add(-1) >= 0 {
			return errors.New("node out of disk")
		}
		return nil
	}})
	b.pool = pool.New(pool.Options{DB: db, Substrate: b.sim, Now: b.clock.Now})
	return b
}

// resolveIn resolves a shape against templates as the sandbox flow's Catalog does: a
// known template, within its caps.
func resolveIn(templates substrate.Templates) func(space.Shape) (substrate.Template, error) {
	return func(s space.Shape) (substrate.Template, error) {
		t, ok := templates[s.Template]
		if !ok {
			return t, space.FieldError(space.EUNPROCESSABLE, "template", "unknown template %q", s.Template)
		}
		if field, limit, ok := t.Fits(s); !ok {
			return t, space.FieldError(space.EUNPROCESSABLE, field, "over the cap of %d", limit)
		}
		return t, nil
	}
}

func (b *bundle) replenisher(opts func(*pool.ReplenisherOptions)) *pool.Replenisher {
	o := pool.ReplenisherOptions{
		Pool: b.pool, Substrate: b.sim, Charger: b.charger,
		Resolve: resolveIn(substrate.Templates{python.Template: {Name: python.Template, Image: "python", MaxDiskGiB: 50}}),
		Targets: func(context.Context) ([]pool.Target, error) {
			return []pool.Target{pool.Fixed(python, int(b.target.Load()))}, nil
		},
		Now: b.clock.Now,
	}
	if opts != nil {
		opts(&o)
	}
	return pool.NewReplenisher(o)
}

func (b *bundle) slots(t *testing.T, state string) int {
	t.Helper()
	var n int
	if err := b.db.QueryRow(b.ctx, "SELECT count(*) FROM pool_slots WHERE state = $1", state).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (b *bundle) claim(t *testing.T, shape space.Shape) *pool.Slot {
	t.Helper()
	return b.claimOf(t, b.pool, shape, "")
}

// claimOf claims a slot of shape and template version through p, as a create on p's
// replica would: inside the transaction that inserts the sandbox.
func (b *bundle) claimOf(t *testing.T, p *pool.Pool, shape space.Shape, version string) *pool.Slot {
	t.Helper()
	var slot *pool.Slot
	err := pgx.BeginFunc(b.ctx, b.db, func(tx pgx.Tx) error {
		var id string
		if err := tx.QueryRow(b.ctx, `INSERT INTO sandboxes (id, client, budget_key, state, template, cpu_millis, memory_mib, disk_gib)
			VALUES (gen_random_uuid(), 'acme', 'acme', 'starting', $1, $2, $3, $4) RETURNING id::text`,
			shape.Template, shape.CPUMillis, shape.MemoryMiB, shape.DiskGiB).Scan(&id); err != nil {
			return err
		}
		var err error
		slot, err = p.Claim(b.ctx, tx, shape, version, id)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return slot
}

func mustRound(t *testing.T, r *pool.Replenisher, ctx context.Context) pool.RoundResult {
	t.Helper()
	res, err := r.Round(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func TestClaim(t *testing.T) {
	t.Parallel()

	t.Run("concurrent claims never get the same slot", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.target.Store(10)
		if res := mustRound(t, b.replenisher(nil), b.ctx); res.Warmed != 10 {
			t.Fatalf("warmed %d, want 10", res.Warmed)
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		seen := map[string]int{}
		misses := 0
		for range 30 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				slot := b.claim(t, python)
				mu.Lock()
				defer mu.Unlock()
				if slot == nil {
					misses++
					return
				}
				seen[slot.ID]++
			}()
		}
		wg.Wait()
		if len(seen) != 10 || misses != 20 {
			t.Fatalf("%d distinct slots claimed and %d misses; want 10 and 20", len(seen), misses)
		}
		for id, n := range seen {
			if n != 1 {
				t.Errorf("slot %s claimed %d times", id, n)
			}
		}
	})

	t.Run("a claim matches the whole shape and nothing else", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.target.Store(1)
		mustRound(t, b.replenisher(nil), b.ctx)
		for _, other := range []space.Shape{
			{Template: "python-3.11", CPUMillis: 1000, MemoryMiB: 2048, DiskGiB: 10},
			{Template: "python-3.12", CPUMillis: 2000, MemoryMiB: 2048, DiskGiB: 10},
			{Template: "python-3.12", CPUMillis: 1000, MemoryMiB: 4096, DiskGiB: 10},
			{Template: "python-3.12", CPUMillis: 1000, MemoryMiB: 2048, DiskGiB: 20},
		} {
			if slot := b.claim(t, other); slot != nil {
				t.Fatalf("shape %s claimed a %s slot", other, python)
			}
		}
		if slot := b.claim(t, python); slot == nil || slot.Ref == "" {
			t.Fatalf("the exact shape missed: %+v", slot)
		}
	})
}

func TestReplenisher(t *testing.T) {
	t.Parallel()

	t.Run("refills to the target after claims, charging only the cluster bucket", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.target.Store(3)
		r := b.replenisher(nil)
		if res := mustRound(t, r, b.ctx); !res.Leader || res.Warmed != 3 {
			t.Fatalf("first round = %+v, want 3 warmed", res)
		}
		b.claim(t, python)
		b.claim(t, python)
		if res := mustRound(t, r, b.ctx); res.Warmed != 2 {
			t.Fatalf("after two claims: %+v, want 2 warmed", res)
		}
		if n := b.slots(t, "ready"); n != 3 {
			t.Fatalf("ready = %d, want 3", n)
		}
		if res := mustRound(t, r, b.ctx); res.Warmed != 0 {
			t.Fatalf("a full pool warmed %d more", res.Warmed)
		}
		b.charger.mu.Lock()
		defer b.charger.mu.Unlock()
		if b.charger.charges != 5 || b.charger.withRate != 0 {
			t.Fatalf("charges = %d (with a client rate: %d); want 5 cluster-only charges", b.charger.charges, b.charger.withRate)
		}
		for _, c := range b.charger.clients {
			if c != "" {
				t.Fatalf("a warm-up was charged to client %q", c)
			}
		}
	})

	t.Run("two replicas replenishing at once never overshoot", func(t *testing.T) {
		t.Parallel()
		url := testenv.DatabaseURL(t)
		one, two := setupOn(t, testenv.Pool(t, url)), setupOn(t, testenv.Pool(t, url))
		const target = 6
		one.target.Store(target)
		two.target.Store(target)
		// Both replicas' rounds meet at the targets read, so that without the lock both
		// would count the same empty pool and fill it twice. With the lock only one
		// gets there; it waits for the other briefly and goes on alone.
		var arrivals atomic.Int32
		met := make(chan struct{})
		slow := func(o *pool.ReplenisherOptions) {
			o.Substrate = substrate.NewSimulated(substrate.SimulatedOptions{Latency: map[substrate.Op]time.Duration{substrate.OpWarm: 20 * time.Millisecond}})
			targets := o.Targets
			o.Targets = func(ctx context.Context) ([]pool.Target, error) {
				if arrivals.Add(1) == 2 {
					close(met)
				}
				select {
				case <-met:
				case <-time.After(100 * time.Millisecond):
				}
				return targets(ctx)
			}
		}
		replicas := []*pool.Replenisher{one.replenisher(slow), two.replenisher(slow)}
		stop := make(chan struct{})
		var max atomic.Int64
		var watch sync.WaitGroup
		watch.Add(1)
		go func() { // watch the pool while both replicas work
			defer watch.Done()
			for {
				var n int64
				if err := one.db.QueryRow(one.ctx, "SELECT count(*) FROM pool_slots WHERE state IN ('ready', 'warming')").Scan(&n); err == nil && n > max.Load() {
					max.Store(n)
				}
				select {
				case <-stop:
					return
				default:
				}
			}
		}()
		var wg sync.WaitGroup
		for _, r := range replicas {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 5 {
					if _, err := r.Round(one.ctx); err != nil {
						t.Error(err)
					}
					one.claim(t, python) // consume as clients would
				}
			}()
		}
		wg.Wait()
		close(stop)
		watch.Wait()
		if max.Load() > target {
			t.Fatalf("the pool reached %d slots, over its target of %d", max.Load(), target)
		}
	})

	t.Run("a rejected warm-up backs off and retries after the backoff", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.target.Store(2)
		r := b.replenisher(nil)
		b.charger.set(true)
		res := mustRound(t, r, b.ctx)
		if !res.Rejected || b.slots(t, "ready")+b.slots(t, "warming") != 0 {
			t.Fatalf("round with an empty bucket = %+v", res)
		}
		if wait := res.BackoffUntil.Sub(b.clock.Now()); wait < 2*time.Second {
			t.Fatalf("backoff %v is shorter than the bucket's 2s refill", wait)
		}
		b.charger.set(false)
		if res := mustRound(t, r, b.ctx); res.Warmed != 0 || b.charger.charges != 0 {
			t.Fatalf("a round inside the backoff warmed %d (charges %d)", res.Warmed, b.charger.charges)
		}
		b.clock.Advance(res.BackoffUntil.Sub(b.clock.Now()))
		if res := mustRound(t, r, b.ctx); res.Warmed != 2 {
			t.Fatalf("after the backoff: %+v, want 2 warmed", res)
		}
	})

	t.Run("the backoff grows with rejections in a row up to its cap", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.target.Store(1)
		r := b.replenisher(func(o *pool.ReplenisherOptions) {
			o.MinBackoff, o.MaxBackoff = 4*time.Second, 10*time.Second
		})
		b.charger.set(true)
		var waits []time.Duration
		for range 4 {
			res := mustRound(t, r, b.ctx)
			waits = append(waits, res.BackoffUntil.Sub(b.clock.Now()))
			b.clock.Advance(waits[len(waits)-1])
		}
		want := []time.Duration{4 * time.Second, 8 * time.Second, 10 * time.Second, 10 * time.Second}
		for i := range want {
			if waits[i] != want[i] {
				t.Fatalf("backoffs = %v, want %v", waits, want)
			}
		}
	})

	t.Run("a lowered target retires the surplus", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.target.Store(4)
		r := b.replenisher(nil)
		mustRound(t, r, b.ctx)
		b.target.Store(1)
		if res := mustRound(t, r, b.ctx); res.Retired != 3 {
			t.Fatalf("retired %d, want 3", res.Retired)
		}
		if n := b.slots(t, "ready"); n != 1 || b.sim.Running() != 1 {
			t.Fatalf("ready = %d, running on the substrate = %d; want 1 and 1", n, b.sim.Running())
		}
	})

	t.Run("a slot that fails to warm while others warm is replaced on the next round", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.target.Store(2)
		b.fail.Store(1)
		r := b.replenisher(nil)
		if res := mustRound(t, r, b.ctx); res.Warmed != 1 || res.Failed != 1 {
			t.Fatalf("first round = %+v, want 1 warmed and 1 failed", res)
		}
		if n := b.slots(t, "warming"); n != 0 {
			t.Fatalf("%d failed slots left warming", n)
		}
		// The substrate warms: the failure is no reason to wait.
		if res := mustRound(t, r, b.ctx); res.Warmed != 1 {
			t.Fatalf("second round = %+v, want the failed slot replaced", res)
		}
	})

	t.Run("Run returns only once the rounds it told have been heard", func(t *testing.T) {
		t.Parallel()
		// What onRound writes is read after Run returns (the bench's figures, a test's
		// counts): a call still running then is a data race.
		b := setup(t)
		r := b.replenisher(func(o *pool.ReplenisherOptions) { o.Interval = time.Hour })
		ctx, cancel := context.WithCancel(b.ctx)
		entered, gate, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
		var once sync.Once
		go func() {
			defer close(done)
			r.Run(ctx, func(pool.RoundResult, error) {
				once.Do(func() { close(entered) })
				<-gate
			})
		}()
		<-entered
		cancel()
		select {
		case <-done:
			t.Fatal("Run returned while the round it told was still being heard")
		case <-time.After(200 * time.Millisecond):
		}
		close(gate)
		<-done
	})

	t.Run("Run tells each round's result and stops with its context", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.target.Store(1)
		r := b.replenisher(func(o *pool.ReplenisherOptions) { o.Interval = time.Hour })
		ctx, cancel := context.WithCancel(b.ctx)
		rounds := make(chan pool.RoundResult, 10)
		done := make(chan struct{})
		go func() {
			defer close(done)
			r.Run(ctx, func(res pool.RoundResult, err error) {
				if err == nil {
					rounds <- res
				}
			})
		}()
		// Each round is told once its warm-ups have finished; the end of a warm-up kicks
		// a round of its own, which finds nothing to do.
		warmed := func(what string) {
			t.Helper()
			for res := range rounds {
				if res.Warmed == 1 {
					return
				}
				if res.Warmed != 0 || res.Failed != 0 {
					t.Fatalf("%s = %+v", what, res)
				}
			}
		}
		warmed("first round")
		b.claim(t, python)
		r.Kick() // without it the next round is an hour away
		warmed("kicked round")
		cancel()
		<-done
	})
}

func TestPoolSignals(t *testing.T) {
	t.Parallel()

	t.Run("every target shape reports its target and bounds beside its ready and warming counts, 0 before any slot is warm", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		reg := prometheus.NewRegistry()
		b.pool = pool.New(pool.Options{DB: b.db, Substrate: b.sim, Registerer: reg,
			Targets: func(context.Context) ([]pool.Target, error) {
				return []pool.Target{pool.Fixed(python, int(b.target.Load()))}, nil
			}})
		b.target.Store(2)
		names := []string{"space_pool_ready_slots", "space_pool_warming_slots", "space_pool_target_slots", "space_pool_target_min_slots", "space_pool_target_max_slots"}
		want := func(ready int) {
			t.Helper()
			var body strings.Builder
			for _, name := range names {
				mfs, err := reg.Gather()
				if err != nil {
					t.Fatal(err)
				}
				for _, mf := range mfs {
					if mf.GetName() == name {
						fmt.Fprintf(&body, "# HELP %s %s\n# TYPE %s gauge\n", name, mf.GetHelp(), name)
					}
				}
				v := map[string]int{"space_pool_ready_slots": ready, "space_pool_warming_slots": 0}[name]
				if strings.Contains(name, "target") {
					v = 2
				}
				fmt.Fprintf(&body, "%s{shape=\"python-3.12/1000m/2048Mi/10Gi\"} %d\n", name, v)
			}
			if err := testutil.GatherAndCompare(reg, strings.NewReader(body.String()), names...); err != nil {
				t.Fatal(err)
			}
		}
		want(0)
		mustRound(t, b.replenisher(nil), b.ctx)
		want(2)
	})
}
