package admission

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/testenv"
)

// concurrencyBundle is a ConcurrencyLimiter on a real Redis under a prefix of its own.
type concurrencyBundle struct {
	t      *testing.T
	ctx    context.Context
	rdb    redis.UniversalClient
	prefix string
	reg    *prometheus.Registry
	lim    *ConcurrencyLimiter
}

// setupConcurrency builds a limiter on rdb; unset options get a fresh prefix, fail
// closed and testTimeout. It is closed when the test ends.
func setupConcurrency(t *testing.T, rdb redis.UniversalClient, opts ConcurrencyOptions) *concurrencyBundle {
	t.Helper()
	b := &concurrencyBundle{t: t, ctx: testenv.Context(t), rdb: rdb, prefix: opts.Prefix, reg: prometheus.NewRegistry()}
	if b.prefix == "" {
		b.prefix = testenv.Prefix(t)
	}
	opts.Redis, opts.Prefix, opts.Registerer = rdb, b.prefix, b.reg
	if opts.Timeout == 0 {
		opts.Timeout = testTimeout
	}
	// As space-api builds it, at SPACE_REDIS_PIPELINE_ABOVE's default.
	opts.PipelineAbove = DefaultPipelineAbove
	lim, err := NewConcurrencyLimiter(opts)
	if err != nil {
		t.Fatalf("NewConcurrencyLimiter: %v", err)
	}
	t.Cleanup(lim.Close)
	b.lim = lim
	return b
}

// replica is a second limiter on its own connection sharing b's keys.
func (b *concurrencyBundle) replica(rdb redis.UniversalClient, opts ConcurrencyOptions) *concurrencyBundle {
	opts.Prefix = b.prefix
	return setupConcurrency(b.t, rdb, opts)
}

// inFlight counts client's unexpired leases on every replica: the members of its
// lease set scored after Redis's now.
func (b *concurrencyBundle) inFlight(client space.ClientKey) int {
	b.t.Helper()
	now, err := b.rdb.Time(b.ctx).Result()
	if err != nil {
		b.t.Fatalf("TIME: %v", err)
	}
	n, err := b.rdb.ZCount(b.ctx, b.prefix+":client_concurrency:"+string(client), fmt.Sprintf("(%d", now.UnixMilli()), "+inf").Result()
	if err != nil {
		b.t.Fatalf("count %s's leases: %v", client, err)
	}
	return int(n)
}

// acquire acquires and fails the test on anything but success.
func (b *concurrencyBundle) acquire(client space.ClientKey, cap int) func() {
	b.t.Helper()
	lease, err := b.lim.Acquire(b.ctx, client, cap)
	if err != nil {
		b.t.Fatalf("Acquire(%s, %d): %v", client, cap, err)
	}
	return lease.Release
}

// overCap reports whether err is the client_concurrency rejection of client at cap.
func overCap(err error, client space.ClientKey, cap int) bool {
	var le *space.LimitError
	return errors.As(err, &le) && le.Bucket == space.BucketClientConcurrency && le.Client == client &&
		le.Cap == cap && le.RetryAfter == time.Second && space.ErrorCode(err) == space.ELIMITED
}

func TestConcurrencyLimiter(t *testing.T) {
	t.Parallel()

	t.Run("n+k concurrent acquires of one client with cap n get exactly k rejections", func(t *testing.T) {
		t.Parallel()
		eachTopology(t, func(t *testing.T, dial func(testing.TB) redis.UniversalClient) {
			const n, k = 5, 3
			one := setupConcurrency(t, dial(t), ConcurrencyOptions{})
			two := one.replica(dial(t), ConcurrencyOptions{}) // a second replica
			var (
				start    = make(chan struct{})
				finished sync.WaitGroup // every goroutine has tried; none releases yet
				mu       sync.Mutex
				rejected int
				releases []func()
				errs     []error
			)
			for i := range n + k {
				b := []*concurrencyBundle{one, two}[i%2]
				finished.Go(func() {
					<-start
					release, err := b.lim.Acquire(b.ctx, "acme", n)
					mu.Lock()
					switch {
					case err == nil:
						releases = append(releases, release.Release)
					case overCap(err, "acme", n):
						rejected++
					default:
						errs = append(errs, err)
					}
					mu.Unlock()
				})
			}
			close(start)
			finished.Wait()
			if len(errs) > 0 {
				t.Fatalf("Acquire: %v", errs)
			}
			if rejected != k || len(releases) != n {
				t.Fatalf("%d acquired, %d rejected; want %d and %d", len(releases), rejected, n, k)
			}
			if got := one.inFlight("acme"); got != n {
				t.Fatalf("InFlight = %d, want %d", got, n)
			}

			// Other clients are unaffected by acme being at its cap.
			release := two.acquire("globex", 1)
			release()

			for _, release := range releases {
				release()
			}
			if got := two.inFlight("acme"); got != 0 {
				t.Fatalf("InFlight after release = %d, want 0", got)
			}
		})
	})

	t.Run("release frees the place and is idempotent", func(t *testing.T) {
		t.Parallel()
		b := setupConcurrency(t, testenv.Redis(t), ConcurrencyOptions{})
		first := b.acquire("acme", 1)
		if _, err := b.lim.Acquire(b.ctx, "acme", 1); !overCap(err, "acme", 1) {
			t.Fatalf("second Acquire at cap 1 = %v, want client_concurrency", err)
		}
		first()
		second := b.acquire("acme", 1)
		first() // again: must not free second's place
		if _, err := b.lim.Acquire(b.ctx, "acme", 1); !overCap(err, "acme", 1) {
			t.Fatalf("a repeated release freed another lease's place: %v", err)
		}
		second()
		if got := b.inFlight("acme"); got != 0 {
			t.Fatalf("InFlight = %d, want 0", got)
		}
	})

	t.Run("a place being given back here is not counted against the next acquire here", func(t *testing.T) {
		t.Parallel()
		b := setupConcurrency(t, testenv.Redis(t), ConcurrencyOptions{})
		other := b.replica(testenv.Redis(t), ConcurrencyOptions{})
		b.acquire("acme", 1)
		key := b.prefix + ":client_concurrency:acme"
		b.lim.mu.Lock()
		var id string
		for l := range b.lim.held[key] {
			id = l
		}
		b.lim.mu.Unlock()
		// Given back, its ZREM not yet on its way: what a release after the answer
		// looks like to a request that comes in meanwhile.
		b.lim.leave(key, id)
		if _, err := other.lim.Acquire(other.ctx, "acme", 1); !overCap(err, "acme", 1) {
			t.Fatalf("another replica's Acquire while the place is still in Redis = %v, want client_concurrency", err)
		}
		lease, err := b.lim.Acquire(b.ctx, "acme", 1)
		if err != nil {
			t.Fatalf("the next Acquire here counted the place being given back: %v", err)
		}
		defer lease.Release()
		b.lim.left(key, id)
		if got := b.inFlight("acme"); got != 1 {
			t.Fatalf("InFlight = %d, want the new lease alone", got)
		}
	})

	t.Run("a lease is roomy while at most half the cap is held, this one counted, on any replica", func(t *testing.T) {
		t.Parallel()
		b := setupConcurrency(t, testenv.Redis(t), ConcurrencyOptions{})
		other := b.replica(testenv.Redis(t), ConcurrencyOptions{})
		var roomy []bool
		for i := range 4 {
			lim := []*concurrencyBundle{b, other}[i%2].lim
			lease, err := lim.Acquire(b.ctx, "acme", 4)
			if err != nil {
				t.Fatalf("Acquire %d of 4: %v", i+1, err)
			}
			t.Cleanup(lease.Release)
			roomy = append(roomy, lease.Roomy)
		}
		if want := []bool{true, true, false, false}; fmt.Sprint(roomy) != fmt.Sprint(want) {
			t.Fatalf("Roomy of four leases under a cap of 4 = %v, want %v", roomy, want)
		}
		if lease, err := b.lim.Acquire(b.ctx, "acme", 4); err == nil || lease.Roomy {
			t.Fatalf("a fifth lease over the cap = %+v, %v; want a refusal", lease, err)
		}
		if lease, err := b.lim.Acquire(b.ctx, "globex", 1); err != nil || lease.Roomy {
			t.Fatalf("the one place of a cap of 1 = %+v, %v; want a lease that is not roomy", lease, err)
		}
	})

	t.Run("leases of a killed process expire", func(t *testing.T) {
		t.Parallel()
		const ttl = 200 * time.Millisecond
		killed := setupConcurrency(t, testenv.Redis(t), ConcurrencyOptions{LeaseTTL: ttl})
		survivor := killed.replica(testenv.Redis(t), ConcurrencyOptions{})
		killed.acquire("acme", 1) // never released
		acquired := time.Now()
		killed.lim.Close() // the process dies: its leases are no longer renewed

		if _, err := survivor.lim.Acquire(survivor.ctx, "acme", 1); !overCap(err, "acme", 1) {
			t.Fatalf("Acquire while the dead lease lives = %v, want client_concurrency", err)
		}
		testenv.Eventually(t, time.Second, "the dead replica's lease to expire", func() bool {
			lease, err := survivor.lim.Acquire(survivor.ctx, "acme", 1)
			if err == nil {
				lease.Release()
			}
			return err == nil
		})
		if took := time.Since(acquired); took < ttl-20*time.Millisecond {
			t.Fatalf("the lease was gone after %v, before its TTL %v", took, ttl)
		}
	})

	t.Run("renewal keeps a long-held lease alive past its ttl", func(t *testing.T) {
		t.Parallel()
		// Renewed every 667ms, the lease survives a renewal late by up to 1.33s: a
		// machine loaded by a first run's build delays a goroutine by hundreds of
		// milliseconds (a TTL of 400ms lost its lease there).
		const ttl = 2 * time.Second
		holder := setupConcurrency(t, testenv.Redis(t), ConcurrencyOptions{LeaseTTL: ttl})
		other := holder.replica(testenv.Redis(t), ConcurrencyOptions{})
		release := holder.acquire("acme", 1)

		time.Sleep(ttl * 3 / 2) // a long request: half as long again as the TTL

		if _, err := other.lim.Acquire(other.ctx, "acme", 1); !overCap(err, "acme", 1) {
			t.Fatalf("Acquire while the lease is held = %v, want client_concurrency", err)
		}
		if got := other.inFlight("acme"); got != 1 {
			t.Fatalf("InFlight = %d, want 1", got)
		}
		if n := metricValue(t, holder.reg, "space_client_concurrency_lease_renewals_total", "result", "renewed"); n < 2 {
			t.Fatalf("renewed %v times, want at least 2", n)
		}
		release()
		other.acquire("acme", 1)()
	})

	t.Run("the lease set expires with its last lease", func(t *testing.T) {
		t.Parallel()
		b := setupConcurrency(t, testenv.Redis(t), ConcurrencyOptions{LeaseTTL: 10 * time.Second})
		short := b.replica(testenv.Redis(t), ConcurrencyOptions{LeaseTTL: time.Second})
		b.acquire("acme", 2)
		short.acquire("acme", 2) // a shorter lease must not shorten the key's life
		ttl, err := b.rdb.PTTL(b.ctx, b.prefix+":client_concurrency:acme").Result()
		if err != nil || ttl < 9*time.Second || ttl > 10*time.Second {
			t.Fatalf("lease set PTTL = %v, %v; want the longest lease's 10 s", ttl, err)
		}
	})

	t.Run("an unlimited cap makes no redis call", func(t *testing.T) {
		t.Parallel()
		rdb := redis.NewClient(&redis.Options{Addr: testenv.Blackhole(t)})
		t.Cleanup(func() { rdb.Close() })
		b := setupConcurrency(t, rdb, ConcurrencyOptions{Timeout: time.Second})
		start := time.Now()
		lease, err := b.lim.Acquire(b.ctx, "acme", 0)
		if err != nil || time.Since(start) > 500*time.Millisecond {
			t.Fatalf("Acquire with cap 0 = %v after %v", err, time.Since(start))
		}
		lease.Release()
		if n := metricValue(t, b.reg, "space_client_concurrency_decisions_total", "decision", "admitted"); n != 0 {
			t.Fatalf("an unlimited acquire was counted: %v", n)
		}
	})

	cuttable(t, "a redis gone fails open within the cap as this replica counts it", func(t *testing.T, dial cuttableDial) {
		cut := dial(t)
		b := setupConcurrency(t, cut.Client, ConcurrencyOptions{FailClosed: false})
		release := b.acquire("acme", 3) // a place Redis gave, still held
		cut.Cut()
		failOpen := func(client space.ClientKey) space.Lease {
			t.Helper()
			lease, err := b.lim.Acquire(b.ctx, client, 3)
			if err != nil || lease.Roomy {
				t.Fatalf("fail-open Acquire(%s) = %+v, %v; want a lease that is not roomy", client, lease, err)
			}
			return lease
		}
		refused := func(client space.ClientKey) {
			t.Helper()
			if _, err := b.lim.Acquire(b.ctx, client, 3); !overCap(err, client, 3) {
				t.Fatalf("Acquire(%s) over the cap during the outage = %v, want a client_concurrency refusal of cap 3", client, err)
			}
		}
		first := failOpen("acme")
		failOpen("acme")
		refused("acme") // the held place and the two given here fill the cap of 3
		failOpen("globex")
		first.Release()
		first.Release() // idempotent: one place back, not two
		failOpen("acme")
		refused("acme")
		release() // its ZREM fails, but the place is no longer held here
		failOpen("acme")
		refused("acme")
		for decision, want := range map[string]float64{"admitted": 1, "error": 5, "rejected": 3} {
			if n := metricValue(t, b.reg, "space_client_concurrency_decisions_total", "decision", decision); n != want {
				t.Errorf("%s decisions = %v, want %v", decision, n, want)
			}
		}
	})

	cuttable(t, "places given during an outage count against the cap once redis answers again, until given back", func(t *testing.T, dial cuttableDial) {
		cut := dial(t)
		b := setupConcurrency(t, cut.Client, ConcurrencyOptions{FailClosed: false})
		cut.Cut()
		var outage []space.Lease
		for range 2 {
			lease, err := b.lim.Acquire(b.ctx, "acme", 3)
			if err != nil {
				t.Fatalf("fail-open Acquire during the outage = %v, want a place", err)
			}
			outage = append(outage, lease)
		}
		cut.Restore()
		acquire := func(client space.ClientKey) space.Lease {
			t.Helper()
			var lease space.Lease
			// The client's connections may still be reconnecting: a place given
			// locally here would hide what this test is about.
			testenv.Eventually(t, 5*time.Second, "a place given by Redis", func() bool {
				before := metricValue(t, b.reg, "space_client_concurrency_decisions_total", "decision", "error")
				l, err := b.lim.Acquire(b.ctx, client, 3)
				if err != nil {
					t.Fatalf("Acquire(%s) after the outage = %v, want a place", client, err)
				}
				if metricValue(t, b.reg, "space_client_concurrency_decisions_total", "decision", "error") == before {
					lease = l
					return true
				}
				l.Release()
				return false
			})
			return lease
		}
		third := acquire("acme")
		if third.Roomy {
			t.Error("a place beside two outage places of a cap of 3 is roomy")
		}
		if _, err := b.lim.Acquire(b.ctx, "acme", 3); !overCap(err, "acme", 3) {
			t.Fatalf("a fourth place with two from the outage still held = %v, want a client_concurrency refusal of cap 3", err)
		}
		if n := b.inFlight("acme"); n != 1 {
			t.Fatalf("Redis holds %d of acme's places, want the 1 it gave", n)
		}
		acquire("globex").Release() // another client's cap owes nothing to acme's outage
		outage[0].Release()
		acquire("acme")
		if _, err := b.lim.Acquire(b.ctx, "acme", 3); !overCap(err, "acme", 3) {
			t.Fatalf("a place past the cap once one outage place was given back = %v, want a refusal", err)
		}
		outage[1].Release()
		third.Release()
		for range 2 {
			acquire("acme")
		}
		if n := b.inFlight("acme"); n != 3 {
			t.Fatalf("Redis holds %d of acme's places once the outage's were given back, want the whole cap of 3", n)
		}
	})

	cuttable(t, "many acquires at once during an outage get exactly the cap", func(t *testing.T, dial cuttableDial) {
		cut := dial(t)
		cut.Cut()
		b := setupConcurrency(t, cut.Client, ConcurrencyOptions{FailClosed: false})
		var mu sync.Mutex
		var leases []space.Lease
		refusals := 0
		var wg sync.WaitGroup
		for range 32 {
			wg.Go(func() {
				lease, err := b.lim.Acquire(b.ctx, "acme", 5)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					leases = append(leases, lease)
				case overCap(err, "acme", 5):
					refusals++
				default:
					t.Error(err)
				}
			})
		}
		wg.Wait()
		if len(leases) != 5 || refusals != 27 {
			t.Fatalf("%d places and %d refusals of 32 acquires at once, want the cap of 5 and 27", len(leases), refusals)
		}
		for _, l := range leases {
			l.Release()
		}
		if _, err := b.lim.Acquire(b.ctx, "acme", 5); err != nil {
			t.Fatalf("Acquire once every place was given back = %v, want a place", err)
		}
	})

	t.Run("a redis that never answers fails closed with ErrUnavailable within the timeout", func(t *testing.T) {
		t.Parallel()
		rdb := redis.NewClient(&redis.Options{Addr: testenv.Blackhole(t)})
		t.Cleanup(func() { rdb.Close() })
		b := setupConcurrency(t, rdb, ConcurrencyOptions{FailClosed: true, Timeout: 50 * time.Millisecond})
		start := time.Now()
		_, err := b.lim.Acquire(b.ctx, "acme", 1)
		if !errors.Is(err, ErrUnavailable) || space.ErrorCode(err) != space.EUNAVAILABLE {
			t.Fatalf("fail-closed Acquire = %v, want ErrUnavailable", err)
		}
		if took := time.Since(start); took > 750*time.Millisecond {
			t.Fatalf("Acquire took %v with a 50ms timeout", took)
		}
		if n := metricValue(t, b.reg, "space_client_concurrency_decisions_total", "decision", "error"); n != 1 {
			t.Fatalf("error decisions = %v, want 1", n)
		}
	})

	t.Run("decisions are counted without a client label", func(t *testing.T) {
		t.Parallel()
		b := setupConcurrency(t, testenv.Redis(t), ConcurrencyOptions{})
		b.acquire("acme", 1)
		b.lim.Acquire(b.ctx, "acme", 1)
		for decision, want := range map[string]float64{"admitted": 1, "rejected": 1, "error": 0} {
			if n := metricValue(t, b.reg, "space_client_concurrency_decisions_total", "decision", decision); n != want {
				t.Errorf("%s = %v, want %v", decision, n, want)
			}
		}
		families, _ := b.reg.Gather()
		for _, f := range families {
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "client" {
						t.Errorf("%s has a client label", f.GetName())
					}
				}
			}
		}
	})

	t.Run("acquire after close is refused and options are checked", func(t *testing.T) {
		t.Parallel()
		b := setupConcurrency(t, testenv.Redis(t), ConcurrencyOptions{})
		b.lim.Close()
		if _, err := b.lim.Acquire(b.ctx, "acme", 1); !errors.Is(err, ErrClosed) {
			t.Fatalf("Acquire after Close = %v, want ErrClosed", err)
		}
		if _, err := NewConcurrencyLimiter(ConcurrencyOptions{}); err == nil {
			t.Fatal("a limiter without Redis was built")
		}
		if _, err := NewConcurrencyLimiter(ConcurrencyOptions{Redis: b.rdb, Prefix: b.prefix, Timeout: testTimeout, LeaseTTL: time.Millisecond}); err == nil || !strings.Contains(err.Error(), "LeaseTTL") {
			t.Fatalf("a 1ms lease TTL: %v, want it refused", err)
		}
		for field, opts := range map[string]ConcurrencyOptions{
			"Prefix":        {Redis: b.rdb, Timeout: testTimeout},
			"Timeout":       {Redis: b.rdb, Prefix: b.prefix},
			"PipelineAbove": {Redis: b.rdb, Prefix: b.prefix, Timeout: testTimeout, PipelineAbove: -1},
		} {
			if _, err := NewConcurrencyLimiter(opts); err == nil || !strings.Contains(err.Error(), field) {
				t.Errorf("a limiter without %s: %v, want an error naming it", field, err)
			}
		}
	})
}

func TestConcurrencyAlongside(t *testing.T) {
	t.Parallel()

	// setup is a limiter on real Redis whose clock the test moves.
	setup := func(t *testing.T) (*concurrencyBundle, *time.Time) {
		b := setupConcurrency(t, testenv.Redis(t), ConcurrencyOptions{})
		now := time.Now()
		b.lim.now = func() time.Time { return now }
		return b, &now
	}
	alongside := func(b *concurrencyBundle, client space.ClientKey, cap int) (func(), bool) {
		return b.lim.Alongside(client, cap)
	}

	t.Run("a client this replica has not asked for takes its place first", func(t *testing.T) {
		t.Parallel()
		b, _ := setup(t)
		if _, ok := alongside(b, "acme", 100); ok {
			t.Fatal("Alongside allowed a client never asked for")
		}
		if _, ok := alongside(b, "acme", 0); ok {
			t.Fatal("Alongside allowed a client without a cap, which takes no place at all")
		}
	})

	t.Run("while its last place left at most half the cap, as many go alongside as keep it so", func(t *testing.T) {
		t.Parallel()
		b, _ := setup(t)
		b.acquire("acme", 8)() // 1 of 8 held, then given back
		var dones []func()
		for {
			done, ok := alongside(b, "acme", 8)
			if !ok {
				break
			}
			dones = append(dones, done)
		}
		// 1 known held, 3 alongside: 4 of 8.
		if len(dones) != 3 {
			t.Fatalf("%d places alongside under a cap of 8 with 1 known held, want 3", len(dones))
		}
		if n := metricValue(t, b.reg, "space_client_concurrency_alongside_total"); n != 3 {
			t.Fatalf("space_client_concurrency_alongside_total = %v, want 3", n)
		}
		dones[0]()
		dones[0]() // twice counts once
		if _, ok := alongside(b, "acme", 8); !ok {
			t.Fatal("a place done alongside was not counted off")
		}
		if _, ok := alongside(b, "acme", 8); ok {
			t.Fatal("a done called twice counted off two places")
		}
	})

	t.Run("a client near its cap, or whose Redis failed, takes its place first", func(t *testing.T) {
		t.Parallel()
		b, _ := setup(t)
		b.acquire("acme", 4)
		b.acquire("acme", 4)
		if _, ok := alongside(b, "acme", 4); ok {
			t.Fatal("Alongside allowed a client known to hold half its cap")
		}
		b.acquire("globex", 8) // 1 of 8: roomy, but the cap is 2 now
		if _, ok := alongside(b, "globex", 2); ok {
			t.Fatal("Alongside allowed a client whose one place is half its new cap")
		}

		srv, rdb := privateRedis(t)
		// A timeout a loaded machine cannot overrun before the stop (make test-stress
		// did at 100 ms, and the failed-open place taught "Redis failed"); a stopped
		// Redis refuses at once.
		down := setupConcurrency(t, rdb, ConcurrencyOptions{Timeout: 5 * time.Second})
		down.acquire("initech", 100)
		if _, ok := alongside(down, "initech", 100); !ok {
			t.Fatal("Alongside refused a client at 1 of 100")
		}
		srv.Stop()
		if lease, err := down.lim.Acquire(down.ctx, "initech", 100); err != nil || lease.Roomy {
			t.Fatalf("Acquire failing open on a stopped Redis = %+v, %v", lease, err)
		}
		if _, ok := alongside(down, "initech", 100); ok {
			t.Fatal("Alongside allowed a client whose last Acquire failed")
		}
	})

	t.Run("what a place taught counts for a second", func(t *testing.T) {
		t.Parallel()
		b, now := setup(t)
		b.acquire("acme", 8)()
		*now = now.Add(alongsideFor)
		done, ok := alongside(b, "acme", 8)
		if !ok {
			t.Fatal("Alongside refused within alongsideFor of the last place")
		}
		done()
		*now = now.Add(time.Millisecond)
		if _, ok := alongside(b, "acme", 8); ok {
			t.Fatal("Alongside allowed past alongsideFor of the last place")
		}
	})
}

func TestConcurrencyKnownPlaces(t *testing.T) {
	t.Parallel()

	for name, rdb := range map[string]func(testing.TB) redis.UniversalClient{"standalone": testenv.Redis, "cluster": testenv.RedisCluster} {
		t.Run("what a replica knows is its newest place by Redis's clock, not its last reply/"+name, func(t *testing.T) {
			t.Parallel()
			b := setupConcurrency(t, rdb(t), ConcurrencyOptions{})
			// Sixty-four places taken at once and none given back: the script that ran
			// last in Redis counted all of them. Replies come back in any order over
			// the pool's connections; the count learnt must be the newest one's.
			const n = 64
			var wg sync.WaitGroup
			start := make(chan struct{})
			for range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					if _, err := b.lim.Acquire(b.ctx, "acme", 1000); err != nil {
						t.Errorf("Acquire: %v", err)
					}
				}()
			}
			close(start)
			wg.Wait()
			if held := b.lim.places("acme").seen.Load().held; held != n {
				t.Fatalf("the replica knows %d places held, want %d (the newest reply's count)", held, n)
			}
		})
	}

	t.Run("an older reply teaches nothing; one of the same instant teaches the larger count; a clock moved back is followed", func(t *testing.T) {
		t.Parallel()
		var k knownPlaces
		now := time.Now()
		// learn teaches a reply of held places at redisAt, and wants the replica to
		// know want after it.
		learn := func(held, redisAt, want int64, what string) {
			t.Helper()
			k.learn(held, redisAt, now)
			if got := k.seen.Load().held; got != want {
				t.Fatalf("held %d after %s, want %d", got, what, want)
			}
		}
		learn(5, 1000, 5, "a first reply of 5")
		learn(1, 999, 5, "an older reply of 1")
		learn(3, 1000, 5, "a reply of 3 at the same instant (the larger stays)")
		learn(7, 1000, 7, "a reply of 7 at the same instant")
		learn(2, 1001, 2, "a newer reply of 2")
		k.forget()
		if k.seen.Load().at != 0 {
			t.Fatal("forget left the replica knowing something")
		}
		k.learn(4, 1000, now)
		if k.seen.Load().at != 0 {
			t.Fatal("a reply older than the forgotten one's taught again")
		}
		k.learn(4, 1002, now)
		if got := k.seen.Load(); got.held != 4 || got.at == 0 {
			t.Fatalf("after a newer reply the replica knows %+v, want 4 places", got)
		}
		// Past reorderBound back, a reply is a clock that moved back (a failover), not
		// a reordered reply: learnt, so that what the replica knows does not stall.
		learn(6, 1002-(reorderBound+time.Millisecond).Microseconds(), 6, "a reply from a clock moved back past reorderBound")
	})
}
