package admission

import (
	"math"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/admission/model"
	"github.com/space-sandbox/space/internal/testenv"
)

// TestComposed holds the features of admission together where each was right alone
// and the composition was not: each subtest failed before the reference model's rules
// were the scripts' (internal/admission/model).
func TestComposed(t *testing.T) {
	t.Parallel()

	// docs/tiers.md's layout: cluster 100/s burst 200; pro reserves 20/s burst 40
	// (lendable 0.5), enterprise 40/s burst 80 (lendable 0.25); shared 40/s burst 80.
	docsLayout := &space.Reservations{
		Shared: space.Rate{RefillRPS: 40, Burst: 80},
		Reserves: []space.TierReserve{
			{Tier: "enterprise", Reserve: space.Reserve{Rate: space.Rate{RefillRPS: 40, Burst: 80}, Lendable: 0.25}},
			{Tier: "pro", Reserve: space.Reserve{Rate: space.Rate{RefillRPS: 20, Burst: 40}, Lendable: 0.5}},
		},
	}
	tiered := func(t *testing.T, rdb redis.UniversalClient, cluster space.Rate, res func() *space.Reservations) *bundle {
		opts := enabled(cluster)
		opts.Reservations = res
		return setup(t, rdb, opts)
	}

	t.Run("a warm-up teaches the memory nothing that refuses another tier's create", func(t *testing.T) {
		t.Parallel()
		topologies(t, func(t *testing.T, rdb redis.UniversalClient) {
			// Shared 6 that never refills, pro's idle reserve of 4 lending all of it.
			b := reservedSetup(t, rdb, "", proReserve(1))
			const floor = 4
			warmUps := 0
			for {
				d, err := b.adm.decide(b.ctx, space.Charge{Cost: 1, Floor: floor}, take)
				if err != nil {
					t.Fatal(err)
				}
				if !d.Admitted {
					break
				}
				warmUps++
			}
			if warmUps != 6-floor {
				t.Fatalf("%d warm-ups, want the shared 6 less the floor of 4", warmUps)
			}
			// The shared remainder holds the 4 the floor keeps, pro lends 4 more: a
			// free create is Redis's to admit, and the memory must not refuse it.
			free := space.Charge{Key: "initech", Rate: rate(neverRefills, 100), Tier: "free", Cost: 1}
			if le := refusal(b.adm, free); le != nil {
				t.Fatalf("a free create is refused from memory after the warm-ups (%+v), while the shared remainder holds the floor", le)
			}
			if d := b.chargeAs("initech", "free"); !d.Admitted {
				t.Fatalf("the free create = %+v, want admitted", d)
			}
		})
	})

	t.Run("a cost no single source holds is drawn across the tier's reserve and the shared remainder, all at once", func(t *testing.T) {
		t.Parallel()
		topologies(t, func(t *testing.T, rdb redis.UniversalClient) {
			b := tiered(t, rdb, space.Rate{RefillRPS: 100, Burst: 200}, func() *space.Reservations { return docsLayout })
			for _, tier := range []string{"pro", "enterprise"} {
				d, err := b.adm.decide(b.ctx, space.Charge{Key: space.ClientKey(tier), Rate: rate(1, 1000), Tier: tier, Cost: 100}, take)
				if err != nil {
					t.Fatal(err)
				}
				if !d.Admitted || d.Drawn.Own < 39 || d.Drawn.Own+d.Drawn.Shared+d.Drawn.Borrowed < 100-1e-9 {
					t.Fatalf("%s's create of cost 100 on full buckets = %+v, want admitted from its reserve and the rest", tier, d)
				}
			}
		})
	})

	t.Run("a cost more than a tier can ever draw is refused for ever, and says so", func(t *testing.T) {
		t.Parallel()
		b := tiered(t, testenv.Redis(t), space.Rate{RefillRPS: 100, Burst: 200}, func() *space.Reservations { return docsLayout })
		// Free may draw the shared 80, 20 of pro's and 20 of enterprise's: 120.
		d, err := b.adm.decide(b.ctx, space.Charge{Key: "initech", Rate: rate(1, 1000), Tier: "free", Cost: 121}, take)
		if err != nil {
			t.Fatal(err)
		}
		if d.Admitted || d.RetryAfter != time.Duration(math.MaxInt64) {
			t.Fatalf("free's create of cost 121 = %+v, want refused with a retry of never", d)
		}
		if got := model.Most(model.Limits{Cluster: space.Rate{RefillRPS: 100, Burst: 200}, Reservations: docsLayout}, "free"); got != 120 {
			t.Fatalf("model.Most(free) = %v, want 120", got)
		}
	})

	t.Run("a tier's reserve does not come back full after its rate is lowered", func(t *testing.T) {
		t.Parallel()
		topologies(t, func(t *testing.T, rdb redis.UniversalClient) {
			// Pro's reserve refills 10 a second, full again 1 s after it is emptied;
			// then its rate falls to 0.1 a second. The shared remainder never refills.
			table := func(rps float64) *space.Reservations {
				return &space.Reservations{
					Shared:   space.Rate{RefillRPS: neverRefills, Burst: 1},
					Reserves: []space.TierReserve{{Tier: "pro", Reserve: space.Reserve{Rate: space.Rate{RefillRPS: rps, Burst: 10}}}},
				}
			}
			fast, slow := table(10), table(0.1)
			current := fast
			b := tiered(t, rdb, space.Rate{RefillRPS: 11, Burst: 11}, func() *space.Reservations { return current })
			pro := space.Charge{Key: "acme", Rate: rate(1, 1000), Tier: "pro", Cost: 10}
			if d, err := b.adm.decide(b.ctx, pro, take); err != nil || !d.Admitted {
				t.Fatalf("pro's first 10 = %+v, %v", d, err)
			}
			current = slow
			if d, err := b.adm.decide(b.ctx, pro, take); err != nil || d.Admitted {
				t.Fatalf("pro's 10 under the lowered rate at once = %+v, %v; want refused", d, err)
			}
			// Past the old full time; at 0.1/s the reserve holds about 0.15.
			time.Sleep(1500 * time.Millisecond)
			d, err := b.adm.decide(b.ctx, pro, take)
			if err != nil {
				t.Fatal(err)
			}
			if d.Admitted || d.Cluster.Remaining > 1.5 {
				t.Fatalf("pro's 10 after 1.5 s at 0.1/s = %+v, want refused with about 0.15 left (plus the shared 1)", d)
			}
		})
	})

	t.Run("what a refusal and a report say is what the tier can draw, a busy tier's lendable tokens left out", func(t *testing.T) {
		t.Parallel()
		topologies(t, func(t *testing.T, rdb redis.UniversalClient) {
			// Cluster 2/s burst 12; pro and enterprise each reserve 0.5/s burst 4,
			// lending all of it; the shared remainder is 1/s burst 4.
			res := &space.Reservations{
				Shared: space.Rate{RefillRPS: 1, Burst: 4},
				Reserves: []space.TierReserve{
					{Tier: "enterprise", Reserve: space.Reserve{Rate: space.Rate{RefillRPS: 0.5, Burst: 4}, Lendable: 1}},
					{Tier: "pro", Reserve: space.Reserve{Rate: space.Rate{RefillRPS: 0.5, Burst: 4}, Lendable: 1}},
				},
			}
			b := tiered(t, rdb, space.Rate{RefillRPS: 2, Burst: 12}, func() *space.Reservations { return res })
			b.chargeAs("acme", "pro")
			b.chargeAs("globex", "enterprise") // both asked: neither lends for 8 s
			var first Decision
			for i := range 4 {
				d := b.chargeAs("initech", "free")
				if !d.Admitted {
					t.Fatalf("free's create %d = %+v, want admitted from the shared 4", i+1, d)
				}
				if i == 0 {
					first = d
				}
			}
			// What the shared remainder refilled since the first take (1 a second), by
			// the Redis time of each decision: what is left to draw, whatever the pace
			// of a loaded machine.
			since := func(d Decision) float64 { return (d.redisNow - first.redisNow) / 1e6 }
			d := b.chargeAs("initech", "free")
			le := d.LimitError("initech")
			if d.Admitted || le == nil || le.Bucket != space.BucketClusterActivation || !near(le.Remaining, since(d), 1e-6) {
				t.Fatalf("free's fifth create = %+v (%+v), want a cluster refusal saying only the shared remainder's %v refilled is left to draw", d, le, since(d))
			}
			// The shared remainder refills 1 a second: the retry is what it lacks of a
			// token at that rate, not the 8 s the lenders stay busy, nor at once.
			if want := time.Duration((1 - since(d)) * float64(time.Second)); le.RetryAfter < want-time.Millisecond || le.RetryAfter > want+time.Millisecond {
				t.Fatalf("retry after %v, want %v: the shared remainder's", le.RetryAfter, want)
			}
			r, e, err := b.adm.Report(b.ctx, space.Charge{Key: "initech", Rate: rate(neverRefills, 100), Tier: "free", Cost: 1})
			if err != nil || e != Enforced || !near(r.Cluster.Remaining, min(since(r), 1), 1e-6) {
				t.Fatalf("free's report = %+v (%s, %v), want only the shared remainder's %v refilled to draw", r, e, err, since(r))
			}
		})
	})
}
