package admission

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/testenv"
)

// TestFailOpenSharesTheClusterBucket covers the cluster side of what replicas admit
// while Redis cannot decide: each its share, a nth of the bucket for n replicas.
func TestFailOpenSharesTheClusterBucket(t *testing.T) {
	t.Parallel()

	// fleet is n replicas failing open through one cuttable client of the shared Redis
	// (standalone or cluster), which the test cuts and restores: one key prefix (the same buckets), one clock the
	// test moves, each its own breaker opening at the first failure, and a roster
	// that counts replicas (n unless the test changes it).
	type fleet struct {
		replicas []*bundle
		redis    *testenv.CuttableRedis
		clock    *testenv.Clock
		counted  atomic.Int64
	}
	setupFleet := func(t *testing.T, dial cuttableDial, n int, cluster space.Rate) *fleet {
		t.Helper()
		f := &fleet{redis: dial(t), clock: testenv.NewClock(time.Now())}
		f.counted.Store(int64(n))
		rdb := f.redis.Client
		prefix := testenv.Prefix(t)
		for range n {
			f.replicas = append(f.replicas, setup(t, rdb, Options{Prefix: prefix, Enabled: true, Cluster: cluster, Timeout: time.Second,
				RefusalMaxAge: time.Hour, Now: f.clock.Now, Replicas: func() int { return int(f.counted.Load()) },
				Breaker: NewBreaker(BreakerOptions{Failures: 1, OpenFor: 50 * time.Millisecond})}))
		}
		return f
	}
	// local charges one activation on replica b and reports whether it was admitted
	// there; a decision Redis made fails the test.
	local := func(t *testing.T, b *bundle, r *space.Rate) (Decision, bool) {
		t.Helper()
		d, err := b.adm.admit(b.ctx, "acme", r)
		if err != nil {
			t.Fatalf("Admit: %v", err)
		}
		if d.Admitted != d.FailedOpen {
			t.Fatalf("Admit = %+v: want admitted failing open, or refused locally", d)
		}
		return d, d.Admitted
	}
	// admitted charges n activations on replica b, one after the other, and returns
	// how many it admitted locally.
	admitted := func(t *testing.T, b *bundle, n int) int {
		t.Helper()
		got := 0
		for range n {
			if _, ok := local(t, b, nil); ok {
				got++
			}
		}
		return got
	}

	cuttable(t, "three replicas in an outage admit one cluster burst between them, not three", func(t *testing.T, dial cuttableDial) {
		f := setupFleet(t, dial, 3, space.Rate{RefillRPS: neverRefills, Burst: 30})
		f.redis.Cut()
		var admitted, refused atomic.Int64
		var wg sync.WaitGroup
		for _, b := range f.replicas {
			for range 32 {
				wg.Go(func() {
					d, err := b.adm.admit(b.ctx, "acme", nil)
					switch {
					case err != nil:
						t.Error(err)
					case d.Admitted:
						admitted.Add(1)
					case d.Bucket == space.BucketClusterActivation:
						refused.Add(1)
					default:
						t.Errorf("Admit = %+v: want admitted or refused by the cluster bucket", d)
					}
				})
			}
		}
		wg.Wait()
		if admitted.Load() != 30 || refused.Load() != 66 {
			t.Fatalf("admitted %d and refused %d of 96 across 3 replicas, want the burst of 30 and 66", admitted.Load(), refused.Load())
		}
	})

	cuttable(t, "three replicas in an outage with tiers and reserves admit one cluster budget between them, not one per tier", func(t *testing.T, dial cuttableDial) {
		// Cluster 20/s burst 20; pro and enterprise reserve 5/s burst 5 each (free
		// has none); a client of each tier floods each replica for 8 s. One budget is
		// the burst and 8 s of refill: 180. Before the share followed the tier table,
		// each tier spent a copy of its own: 3 budgets (534 of 200 measured).
		cluster := space.Rate{RefillRPS: 20, Burst: 20}
		res := &space.Reservations{
			Shared: space.Rate{RefillRPS: 10, Burst: 10},
			Reserves: []space.TierReserve{
				{Tier: "enterprise", Reserve: space.Reserve{Rate: space.Rate{RefillRPS: 5, Burst: 5}, Lendable: 0.5}},
				{Tier: "pro", Reserve: space.Reserve{Rate: space.Rate{RefillRPS: 5, Burst: 5}, Lendable: 0.5}},
			},
		}
		f := setupFleet(t, dial, 3, cluster)
		for _, b := range f.replicas {
			b.adm.reservations = func() *space.Reservations { return res }
			// Open for the whole test once Redis has failed: the 8 s are the test
			// clock's, and no probe of the cut cluster (a slot refresh, seconds)
			// should stretch them into minutes of the machine's.
			b.adm.run.breaker = NewBreaker(BreakerOptions{Failures: 1, OpenFor: time.Hour})
		}
		f.redis.Cut()
		var admitted atomic.Int64
		byTier := map[string]*atomic.Int64{"free": {}, "pro": {}, "enterprise": {}}
		for range 800 { // 8 s in 10 ms steps, every replica and tier asking at once
			var wg sync.WaitGroup
			for _, b := range f.replicas {
				for tier, n := range byTier {
					wg.Go(func() {
						for range 2 {
							d, err := b.adm.Charge(b.ctx, space.Charge{Key: space.ClientKey(tier), Rate: rate(1000, 1000), Tier: tier, Cost: 1})
							if err == nil && !d.SoftBreach {
								admitted.Add(1)
								n.Add(1)
							}
						}
					})
				}
			}
			wg.Wait()
			f.clock.Advance(10 * time.Millisecond)
		}
		budget := float64(cluster.Burst) + cluster.RefillRPS*8
		if got := float64(admitted.Load()); got > budget+3 || got < 0.9*budget {
			t.Fatalf("admitted %v in 8 s across 3 replicas and 3 tiers (%d free, %d pro, %d enterprise), want the one budget of %v",
				got, byTier["free"].Load(), byTier["pro"].Load(), byTier["enterprise"].Load(), budget)
		}
		// The reserves hold during the outage too: each reserved tier gets at least
		// its reserved rate, whatever free does.
		for _, tier := range []string{"pro", "enterprise"} {
			if n := byTier[tier].Load(); n < 5*8 {
				t.Errorf("%s admitted %d in 8 s, below its reserved 5/s", tier, n)
			}
		}
	})

	cuttable(t, "a replica's share refills at a nth of the cluster rate", func(t *testing.T, dial cuttableDial) {
		f := setupFleet(t, dial, 3, space.Rate{RefillRPS: 3, Burst: 3})
		f.redis.Cut()
		b := f.replicas[0]
		if _, ok := local(t, b, nil); !ok {
			t.Fatal("the first charge of a replica whose share is full was refused")
		}
		d, ok := local(t, b, nil)
		if ok {
			t.Fatal("a second charge within the same instant was admitted: the share is one of three tokens")
		}
		if d.RetryAfter != time.Second {
			t.Fatalf("retry after %v, want 1s: the share refills 1/s", d.RetryAfter)
		}
		f.clock.Advance(999 * time.Millisecond)
		if _, ok := local(t, b, nil); ok {
			t.Fatal("admitted before the share's 1s refill")
		}
		f.clock.Advance(time.Millisecond)
		if _, ok := local(t, b, nil); !ok {
			t.Fatal("refused once the share refilled")
		}
	})

	cuttable(t, "more replicas than tokens still admit the cluster rate between them", func(t *testing.T, dial cuttableDial) {
		// 4 replicas, a burst of 2 refilling 2/s: a share is half a token, half a
		// token a second. Each replica admits one activation every 2s.
		f := setupFleet(t, dial, 4, space.Rate{RefillRPS: 2, Burst: 2})
		f.redis.Cut()
		total := 0
		for range 5 { // 10s in 2s steps
			for _, b := range f.replicas {
				total += admitted(t, b, 3)
			}
			f.clock.Advance(2 * time.Second)
		}
		if total != 20 {
			t.Fatalf("admitted %d in 10s across 4 replicas, want 20 (the rate of 2/s)", total)
		}
	})

	cuttable(t, "the share starts from what the replica last learnt", func(t *testing.T, dial cuttableDial) {
		f := setupFleet(t, dial, 3, space.Rate{RefillRPS: neverRefills, Burst: 30})
		b := f.replicas[0]
		for range 18 {
			if d := b.admit("acme", nil); !d.Admitted {
				t.Fatalf("Admit = %+v before the bucket of 30 ran dry", d)
			}
		}
		f.redis.Cut()
		if n := admitted(t, b, 10); n != 4 {
			t.Fatalf("admitted %d locally of a bucket learnt at 12 tokens, want a third: 4", n)
		}
		// What the share spent stays out of what the replica refuses from memory:
		// the bucket as learnt still holds 12 (an upper bound of it), so a create is
		// let through to Redis, which decides it once it answers again.
		if le := refusal(b.adm, space.Charge{Cost: 1}); le != nil {
			t.Fatalf("refused from memory (%+v) after the outage share ran dry, want the known bucket's 12 tokens to let it through", le)
		}
	})

	cuttable(t, "a decision learnt since starts the share afresh", func(t *testing.T, dial cuttableDial) {
		f := setupFleet(t, dial, 2, space.Rate{RefillRPS: neverRefills, Burst: 20})
		b := f.replicas[0]
		f.redis.Cut()
		if n := admitted(t, b, 11); n != 10 {
			t.Fatalf("admitted %d of a bucket of 20 never learnt, want the share of 10", n)
		}
		f.redis.Restore()
		// Redis was never charged: the bucket holds 20, and this decision takes one.
		testenv.Eventually(t, 5*time.Second, "redis to decide again", func() bool {
			d, err := b.adm.admit(b.ctx, "acme", nil)
			return err == nil && !d.FailedOpen && d.Admitted
		})
		f.redis.Cut()
		if n := admitted(t, b, 12); n != 9 {
			t.Fatalf("admitted %d locally after Redis left 19 tokens, want half: 9", n)
		}
	})

	cuttable(t, "a roster that counts no replica counts this one", func(t *testing.T, dial cuttableDial) {
		f := setupFleet(t, dial, 1, space.Rate{RefillRPS: neverRefills, Burst: 2})
		f.counted.Store(0)
		f.redis.Cut()
		b := f.replicas[0]
		for i := range 2 {
			if _, ok := local(t, b, nil); !ok {
				t.Fatalf("charge %d of a bucket of 2 refused, with the roster at 0", i+1)
			}
		}
		if _, ok := local(t, b, nil); ok {
			t.Fatal("a third charge of a bucket of 2 was admitted")
		}
	})

	cuttable(t, "a client's bucket is not shared out", func(t *testing.T, dial cuttableDial) {
		f := setupFleet(t, dial, 3, space.Rate{RefillRPS: neverRefills, Burst: 300})
		f.redis.Cut()
		b := f.replicas[0]
		r := rate(neverRefills, 6)
		admitted := 0
		for range 8 {
			d, err := b.adm.admit(b.ctx, "acme", r)
			if err != nil {
				t.Fatal(err)
			}
			if d.Admitted {
				admitted++
			} else if d.Bucket != space.BucketClientActivation {
				t.Fatalf("refused by %s, want the client bucket", d.Bucket)
			}
		}
		if admitted != 6 {
			t.Fatalf("admitted %d of a client's burst of 6 on one replica of 3, want all 6", admitted)
		}
	})
}
