package admission

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/admission/model"
	"github.com/space-sandbox/space/internal/testenv"
)

// The differential tests: seeded random configurations and sequences of asks, each
// decided by the scripts on real Redis (standalone and the 3-node cluster) and by the
// reference model (internal/admission/model) at the Redis time the script read, and
// compared: every decision (admitted, the refusing bucket, the soft breach, where the
// cluster tokens came from, what each side reports remaining, the retry), every
// refusal the replica answers from memory (the model refuses too, at that instant),
// and every report (what GET /v1/limits and the RateLimit headers are built from).
//
// SPACE_REFERENCE_SCALE multiplies the configurations (make test-stress sets 10);
// SPACE_REFERENCE_SEED runs the one configuration of that seed. A failure prints its
// seed and the sequence shrunk to the steps it still fails with (Redis's clock is
// real, so a replay can differ in its timing; the shrinking keeps a removal only when
// the failure comes back).

// referenceSizes are make test's: ≥ 1,000 configurations and ≥ 100,000 asks over the
// two topologies.
var referenceSizes = map[string]struct{ configs, steps int }{
	"standalone": {1000, 85},
	"cluster":    {400, 65},
}

func TestAgainstTheModel(t *testing.T) {
	t.Parallel()
	scale := 1
	if v := os.Getenv("SPACE_REFERENCE_SCALE"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("SPACE_REFERENCE_SCALE=%q: want a whole number >= 1", v)
		}
		scale = n
	}
	only := onlySeed(t)
	base := rand.Uint64()
	topologies(t, func(t *testing.T, rdb redis.UniversalClient) {
		size := referenceSizes[t.Name()[strings.LastIndex(t.Name(), "/")+1:]]
		seeds := seedsFor(only, onceFailed, base, size.configs*scale)
		var asks, configs atomic.Int64
		var failed atomic.Bool
		var seen coverage
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for seed := range seeds {
					if failed.Load() {
						continue
					}
					sc := newScenario(seed, size.steps)
					if f := sc.play(t, rdb, sc.steps, &seen); f != nil {
						if failed.Swap(true) {
							continue
						}
						t.Errorf("%s", sc.explain(t, rdb, f))
					}
					configs.Add(1)
					for _, s := range sc.steps {
						if s.table < 0 && s.rates < 0 {
							asks.Add(1)
						}
					}
				}
			})
		}
		wg.Wait()
		t.Logf("%d configurations, %d asks compared with the model: %s", configs.Load(), asks.Load(), &seen)
		// The sequences reach every rule, or the comparison proves little.
		for what, n := range seen.counts() {
			if n == 0 && only == nil {
				t.Errorf("no ask was %s", what)
			}
		}
	})
}

// onlySeed is the seed SPACE_REFERENCE_SEED names, nil when it names none.
func onlySeed(t *testing.T) *uint64 {
	t.Helper()
	v := os.Getenv("SPACE_REFERENCE_SEED")
	if v == "" {
		return nil
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		t.Fatalf("SPACE_REFERENCE_SEED=%q: want a seed", v)
	}
	return &n
}

// seedsFor sends the seeds a run plays, then closes: only, when set, alone; else
// first, then n from base on.
func seedsFor(only *uint64, first []uint64, base uint64, n int) <-chan uint64 {
	seeds := make(chan uint64)
	go func() {
		defer close(seeds)
		if only != nil {
			seeds <- *only
			return
		}
		for _, seed := range first {
			seeds <- seed
		}
		for i := range n {
			seeds <- base + uint64(i)
		}
	}()
	return seeds
}

// onceFailed are seeds that found a mismatch once, played on every run before the
// random ones, each for what it found.
var onceFailed = []uint64{
	// A tier table switched to one that splits the same drawable rate between other
	// sources: the memory refused by the bound the old table left, below what the new
	// one can draw.
	16736947779956560993,
}

// scenario is one configuration of the buckets and a sequence of steps against it.
type scenario struct {
	seed    uint64
	cluster space.Rate
	// tables are the tier tables the steps switch between (nil: no reserves).
	tables  []*space.Reservations
	tiers   []string
	clients []refClient
	steps   []step
}

// refClient is one client key: its rates, switched between by the steps, its tier.
type refClient struct {
	key   space.ClientKey
	rates []*space.Rate // nil: exempt
	soft  []*space.Rate
	tier  string
}

// step is one thing done to the buckets.
type step struct {
	// table switches the tier table in force to tables[table] when >= 0.
	table int
	// rates switches client's rates to its rates[rates] when >= 0.
	client, rates int
	// pause is slept before the step, so that buckets refill.
	pause time.Duration
	// charge is what is asked; take false makes it a report; memory asks the refusal
	// memory first.
	charge       space.Charge
	take, memory bool
}

func (s step) String() string {
	var b strings.Builder
	if s.pause > 0 {
		fmt.Fprintf(&b, "after %v, ", s.pause)
	}
	switch {
	case s.table >= 0:
		fmt.Fprintf(&b, "switch to table %d", s.table)
	case s.rates >= 0:
		fmt.Fprintf(&b, "switch client %d to its rates %d", s.client, s.rates)
	default:
		c := s.charge
		what := "take"
		if !s.take {
			what = "report"
		}
		if s.memory {
			what = "memory, then " + what
		}
		fmt.Fprintf(&b, "%s of cost %d by %q (tier %q, rate %v, soft %v, floor %d)", what, c.Cost, c.Key, c.Tier, c.Rate, c.Soft, c.Floor)
	}
	return b.String()
}

// newScenario draws a configuration and steps steps from seed.
func newScenario(seed uint64, steps int) *scenario {
	r := rand.New(rand.NewPCG(seed, seed^0x5eed))
	sc := &scenario{seed: seed}
	sc.cluster = space.Rate{RefillRPS: float64(100 + r.IntN(4900)), Burst: int64(4 + r.IntN(40))}
	// The tier tables: none, or up to three tiers reserving shares, and a second
	// table to switch to in some scenarios.
	table := func() *space.Reservations {
		if r.IntN(10) < 4 {
			return nil
		}
		k := 1 + r.IntN(3)
		res := &space.Reservations{Shared: sc.cluster}
		for i := range k {
			rps := sc.cluster.RefillRPS * (0.05 + 0.25*r.Float64())
			burst := int64(1 + r.IntN(int(max(1, sc.cluster.Burst/int64(k+1)))))
			if res.Shared.RefillRPS-rps <= 0 || res.Shared.Burst-burst < 1 {
				break
			}
			lendable := []float64{0, 0.25, 0.5, 1, r.Float64()}[r.IntN(5)]
			res.Reserves = append(res.Reserves, space.TierReserve{Tier: fmt.Sprintf("t%d", i), Reserve: space.Reserve{Rate: space.Rate{RefillRPS: rps, Burst: burst}, Lendable: lendable}})
			res.Shared.RefillRPS -= rps
			res.Shared.Burst -= burst
		}
		if len(res.Reserves) == 0 {
			return nil
		}
		return res
	}
	sc.tables = []*space.Reservations{table()}
	if r.IntN(10) < 3 {
		sc.tables = append(sc.tables, table())
	}
	sc.tiers = []string{"", "free", "t0", "t1", "t2"}
	for i := range 1 + r.IntN(4) {
		c := refClient{key: space.ClientKey(fmt.Sprintf("c%d", i)), tier: sc.tiers[r.IntN(len(sc.tiers))]}
		for range 1 + r.IntN(2) {
			var hard, soft *space.Rate
			if r.IntN(100) >= 15 {
				hard = &space.Rate{RefillRPS: float64(50 + r.IntN(3000)), Burst: int64(1 + r.IntN(15))}
				if r.IntN(10) < 3 {
					soft = &space.Rate{RefillRPS: hard.RefillRPS * r.Float64(), Burst: 1 + r.Int64N(hard.Burst)}
				}
			}
			c.rates, c.soft = append(c.rates, hard), append(c.soft, soft)
		}
		sc.clients = append(sc.clients, c)
	}
	current := make([]int, len(sc.clients))
	for range steps {
		s := step{table: -1, rates: -1}
		switch p := r.IntN(100); {
		case p < 30:
			s.pause = time.Duration(r.IntN(1000)) * time.Microsecond
		case p < 38:
			s.pause = time.Duration(1+r.IntN(5)) * time.Millisecond
		}
		switch p := r.IntN(100); {
		case p < 2 && len(sc.tables) > 1:
			s.table = r.IntN(len(sc.tables))
		case p < 4:
			s.client = r.IntN(len(sc.clients))
			s.rates = r.IntN(len(sc.clients[s.client].rates))
			current[s.client] = s.rates
		case p < 9:
			// A warm-up: no client, a floor left in the (shared) cluster bucket.
			s.charge = space.Charge{Cost: 1 + r.IntN(2), Floor: int64(1 + r.IntN(int(sc.cluster.Burst/2)))}
			s.take = true
		default:
			i := r.IntN(len(sc.clients))
			c := sc.clients[i]
			cost := 1
			switch q := r.IntN(100); {
			case q < 10:
				cost = 1 + r.IntN(int(sc.cluster.Burst)) // across sources, or past any
			case q < 30:
				cost = 2 + r.IntN(3)
			}
			s.charge = space.Charge{Key: c.key, Rate: c.rates[current[i]], Soft: c.soft[current[i]], Tier: c.tier, Cost: cost}
			s.take = r.IntN(100) >= 8
			s.memory = s.take && r.IntN(100) < 30
		}
		sc.steps = append(sc.steps, s)
	}
	return sc
}

// mismatch is where a run of a scenario's steps first disagreed with the model.
type mismatch struct {
	step int
	what string
}

// coverage counts what the compared asks did, so that a test whose sequences never
// reach a rule says so.
type coverage struct {
	admitted, refusedClient, refusedCluster, fromMemory, reports, breaches, across, borrowed, warmUps, never atomic.Int64
}

func (c *coverage) counts() map[string]int64 {
	return map[string]int64{
		"admitted": c.admitted.Load(), "refused by its client bucket": c.refusedClient.Load(),
		"refused by the cluster": c.refusedCluster.Load(), "refused from memory": c.fromMemory.Load(),
		"a report": c.reports.Load(), "a soft breach": c.breaches.Load(),
		"drawn across sources": c.across.Load(), "borrowed": c.borrowed.Load(), "a warm-up": c.warmUps.Load(),
		"refused for ever": c.never.Load(),
	}
}

func (c *coverage) String() string {
	var parts []string
	for what, n := range c.counts() {
		parts = append(parts, fmt.Sprintf("%s %d", what, n))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// observe counts one compared decision.
func (c *coverage) observe(s step, md model.Decision) {
	if c == nil {
		return
	}
	switch {
	case !s.take:
		c.reports.Add(1)
	case md.Admitted:
		c.admitted.Add(1)
	case md.Bucket == space.BucketClientActivation:
		c.refusedClient.Add(1)
	default:
		c.refusedCluster.Add(1)
	}
	if s.take && md.SoftBreach {
		c.breaches.Add(1)
	}
	if sources := btoi(md.Drawn.Own > 0) + btoi(md.Drawn.Shared > 0) + btoi(md.Drawn.Borrowed > 0); sources > 1 {
		c.across.Add(1)
	}
	if md.Drawn.Borrowed > 0 {
		c.borrowed.Add(1)
	}
	if s.charge.Floor > 0 {
		c.warmUps.Add(1)
	}
	if !md.Admitted && math.IsInf(md.RetryAfter, 1) {
		c.never.Add(1)
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// play plays steps on a fresh Admitter on rdb and the model side by side, and returns
// the first disagreement; seen, when not nil, counts what the decisions did.
func (sc *scenario) play(t *testing.T, rdb redis.UniversalClient, steps []step, seen *coverage) *mismatch {
	ctx := testenv.Context(t)
	var table atomic.Pointer[space.Reservations]
	// clock is the first time Now gave the Admitter since a memory step set it to 0,
	// Unix µs: the instant CachedRefusal reads the memory at (its first call; what it
	// calls after, the bounded map's last use among them, reads the clock later).
	var clock atomic.Int64
	adm, err := New(Options{
		Redis: rdb, Prefix: testenv.Prefix(t), Enabled: true, FailClosed: true, Cluster: sc.cluster,
		Timeout: testTimeout, RefusalMaxAge: time.Hour, BatchAbove: 0, // each decision its own call
		Reservations: func() *space.Reservations { return table.Load() },
		Now: func() time.Time {
			now := time.Now()
			clock.CompareAndSwap(0, now.UnixMicro())
			return now
		},
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	table.Store(sc.tables[0])
	state := model.NewState()
	for i, s := range steps {
		if s.pause > 0 {
			time.Sleep(s.pause)
		}
		if s.table >= 0 {
			table.Store(sc.tables[s.table])
			continue
		}
		if s.rates >= 0 {
			continue // the charges carry their client's rates
		}
		lim := model.Limits{Cluster: sc.cluster, Reservations: table.Load()}
		c := s.charge
		if s.memory {
			clock.Store(0)
			hold, le := adm.CachedRefusal(c)
			if hold != nil {
				hold.Release()
			}
			if le != nil {
				// The memory refused at its clock's instant: the model refuses there too.
				md := model.Decide(state.Clone(), lim, c, true, float64(clock.Load()))
				if md.Admitted {
					return &mismatch{i, fmt.Sprintf("refused from memory (%s, %.6f left) while the model admits at that instant: %+v", le.Bucket, le.Remaining, md)}
				}
				if le.Bucket == space.BucketClientActivation && md.Bucket != space.BucketClientActivation {
					return &mismatch{i, fmt.Sprintf("refused from memory naming the client bucket, the model names %s", md.Bucket)}
				}
				if seen != nil {
					seen.fromMemory.Add(1)
				}
				continue
			}
		}
		var d Decision
		if s.take {
			d, err = adm.decide(ctx, c, take)
		} else {
			var e Enforcement
			d, e, err = adm.Report(ctx, c)
			if err == nil && e != Enforced {
				return &mismatch{i, fmt.Sprintf("report says %s", e)}
			}
		}
		if err != nil {
			return &mismatch{i, fmt.Sprintf("error: %v", err)}
		}
		md := model.Decide(state, lim, c, s.take, d.redisNow)
		if what := compare(d, md, c); what != "" {
			return &mismatch{i, what}
		}
		seen.observe(s, md)
	}
	return nil
}

// compare returns how the Admitter's decision d differs from the model's md, "" when
// it does not. Admission, the bucket named and the breach are compared exactly; the
// numbers reported to within a millionth of a token and of a µs (the scripts compute
// some of them by closed forms where the model sweeps).
func compare(d Decision, md model.Decision, c space.Charge) string {
	var diffs []string
	differ := func(what string, got, want any) {
		diffs = append(diffs, fmt.Sprintf("%s %v, model %v", what, got, want))
	}
	if d.Admitted != md.Admitted {
		differ("admitted", d.Admitted, md.Admitted)
	}
	if d.Bucket != md.Bucket {
		differ("bucket", d.Bucket, md.Bucket)
	}
	if d.SoftBreach != md.SoftBreach {
		differ("soft breach", d.SoftBreach, md.SoftBreach)
	}
	tokens := func(what string, got, want float64) {
		if !(math.Abs(got-want) <= 1e-6+1e-9*math.Abs(want)) {
			differ(what, got, want)
		}
	}
	wait := func(what string, got time.Duration, want float64) {
		if math.IsInf(want, 1) || want*1e3 >= math.MaxInt64 {
			if got != time.Duration(math.MaxInt64) {
				differ(what, got, "never")
			}
			return
		}
		if w := time.Duration(math.Ceil(want * 1e3)); got < w-time.Microsecond || got > w+time.Microsecond+time.Duration(1e-6*float64(w)) {
			differ(what, got, w)
		}
	}
	tokens("drawn from the own reserve", d.Drawn.Own, md.Drawn.Own)
	tokens("drawn shared", d.Drawn.Shared, md.Drawn.Shared)
	tokens("borrowed", d.Drawn.Borrowed, md.Drawn.Borrowed)
	tokens("cluster remaining", d.Cluster.Remaining, md.Cluster.Remaining)
	tokens("bound", d.bound, md.Bound)
	wait("cluster wait", d.Cluster.Refill, md.Cluster.Wait)
	if (d.Client == nil) != (md.Client == nil) {
		differ("client side", d.Client, md.Client)
	} else if d.Client != nil {
		tokens("client remaining", d.Client.Remaining, md.Client.Remaining)
		wait("client wait", d.Client.Refill, md.Client.Wait)
	}
	if !d.Admitted {
		wait("retry", d.RetryAfter, md.RetryAfter)
		// What a 429 says (its RateLimit headers) is the refusing side's.
		if le := d.LimitError(c.Key); le == nil {
			differ("limit error", nil, md.Bucket)
		} else {
			want := md.Cluster.Remaining
			if md.Bucket == space.BucketClientActivation {
				want = md.Client.Remaining
			}
			tokens("429's remaining", max(le.Remaining, 0), max(want, 0))
		}
	}
	if len(diffs) == 0 {
		return ""
	}
	return strings.Join(diffs, "; ")
}

// explain describes a failure: the seed, the configuration, the step and how it
// differed, and the steps shrunk to those it still fails with.
func (sc *scenario) explain(t *testing.T, rdb redis.UniversalClient, f *mismatch) string {
	steps := append([]step(nil), sc.steps[:f.step+1]...)
	last := f
	// Drop steps one at a time, from the first, keeping a removal when the failure
	// comes back within three tries.
	fails := func(steps []step) *mismatch {
		for range 3 {
			if m := sc.play(t, rdb, steps, nil); m != nil {
				return m
			}
		}
		return nil
	}
	for i := 0; i < len(steps)-1 && len(steps) > 1; {
		try := append(append([]step(nil), steps[:i]...), steps[i+1:]...)
		if m := fails(try); m != nil {
			steps, last = try[:m.step+1], m
			continue
		}
		i++
	}
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d (SPACE_REFERENCE_SEED=%d runs it alone): step %d of %d: %s\n", sc.seed, sc.seed, f.step, len(sc.steps), f.what)
	fmt.Fprintf(&b, "cluster %+v; tables:", sc.cluster)
	for i, tb := range sc.tables {
		fmt.Fprintf(&b, " %d=%s", i, describeTable(tb))
	}
	fmt.Fprintf(&b, "\nshrunk to %d steps, failing with: %s\n", len(steps), last.what)
	for i, s := range steps {
		fmt.Fprintf(&b, "  %d. %s\n", i, s)
	}
	return b.String()
}

func describeTable(res *space.Reservations) string {
	if res == nil {
		return "none"
	}
	var parts []string
	parts = append(parts, fmt.Sprintf("shared %g/s burst %d", res.Shared.RefillRPS, res.Shared.Burst))
	for _, r := range res.Reserves {
		parts = append(parts, fmt.Sprintf("%s %g/s burst %d lendable %g", r.Tier, r.Rate.RefillRPS, r.Rate.Burst, r.Lendable))
	}
	return "{" + strings.Join(parts, ", ") + "}"
}
