package model

import (
	"math"
	"testing"

	"github.com/space-sandbox/space"
)

const second = 1e6 // µs

// near reports whether a and b agree to a millionth: rates are tokens a µs, which the
// decimal rates here are not exactly.
func near(a, b float64) bool { return math.Abs(a-b) <= 1e-6*math.Max(math.Abs(a), math.Abs(b)) }

func rate(rps float64, burst int64) *space.Rate { return &space.Rate{RefillRPS: rps, Burst: burst} }

// tiers is docs/tiers.md's layout: cluster 100/s burst 200; pro reserves 20/s burst 40
// (lendable 0.5), enterprise 40/s burst 80 (lendable 0.25); the shared remainder is
// 40/s burst 80.
func tiers() Limits {
	return Limits{Cluster: space.Rate{RefillRPS: 100, Burst: 200}, Reservations: &space.Reservations{
		Shared: space.Rate{RefillRPS: 40, Burst: 80},
		Reserves: []space.TierReserve{
			{Tier: "enterprise", Reserve: space.Reserve{Rate: space.Rate{RefillRPS: 40, Burst: 80}, Lendable: 0.25}},
			{Tier: "pro", Reserve: space.Reserve{Rate: space.Rate{RefillRPS: 20, Burst: 40}, Lendable: 0.5}},
		},
	}}
}

func TestBuckets(t *testing.T) {
	t.Parallel()

	t.Run("a bucket nobody asked of is full, and refills continuously up to its burst", func(t *testing.T) {
		t.Parallel()
		s := NewState()
		lim := Limits{Cluster: space.Rate{RefillRPS: 10, Burst: 5}}
		now := 1000 * second
		for i := range 5 {
			if d := Decide(s, lim, space.Charge{Cost: 1}, true, now); !d.Admitted {
				t.Fatalf("take %d of a full bucket of 5 refused", i+1)
			}
		}
		d := Decide(s, lim, space.Charge{Cost: 1}, true, now)
		if d.Admitted || d.Bucket != space.BucketClusterActivation || !near(d.RetryAfter, 0.1*second) {
			t.Fatalf("the sixth take = %+v, want a cluster refusal with a retry of 100ms", d)
		}
		if got := s.Cluster.Level(RateOf(lim.Cluster), now+0.25*second); !near(got, 2.5) {
			t.Errorf("level after 250ms at 10/s = %v, want 2.5", got)
		}
		if got := s.Cluster.Level(RateOf(lim.Cluster), now+10*second); got != 5 {
			t.Errorf("level after 10s = %v, want the burst", got)
		}
	})

	t.Run("a cost is taken from both buckets or neither, and the client bucket is named first", func(t *testing.T) {
		t.Parallel()
		s := NewState()
		lim := Limits{Cluster: space.Rate{RefillRPS: 0, Burst: 3}}
		c := space.Charge{Key: "acme", Rate: rate(0, 2), Cost: 2}
		if d := Decide(s, lim, c, true, 0); !d.Admitted || d.Client.Remaining != 0 || d.Cluster.Remaining != 1 {
			t.Fatalf("first = %+v", d)
		}
		d := Decide(s, lim, c, true, 1)
		if d.Admitted || d.Bucket != space.BucketClientActivation || !math.IsInf(d.RetryAfter, 1) {
			t.Fatalf("second = %+v, want refused by the empty client bucket, for ever", d)
		}
		if d.Cluster.Remaining != 1 {
			t.Errorf("the refusal took from the cluster: %v left", d.Cluster.Remaining)
		}
	})

	t.Run("a lowered rate applies from the next ask, and a refusal under it moves F so the old one never fills the bucket", func(t *testing.T) {
		t.Parallel()
		s := NewState()
		fast, slow := Limits{Cluster: space.Rate{RefillRPS: 10, Burst: 10}}, Limits{Cluster: space.Rate{RefillRPS: 1, Burst: 10}}
		c := space.Charge{Cost: 10}
		Decide(s, fast, c, true, 0) // empty, full again at 1s at the old rate
		if !near(s.Cluster.Full, 1*second) {
			t.Fatalf("F = %v, want 1s", s.Cluster.Full)
		}
		d := Decide(s, slow, space.Charge{Cost: 5}, true, 0.5*second)
		if d.Admitted || !near(d.Cluster.Remaining, 0.5) {
			t.Fatalf("at 0.5s under 1/s = %+v, want refused holding 0.5", d)
		}
		if !near(s.Cluster.Full, 0.5*second+9.5*second) {
			t.Fatalf("F after the refusal = %v, want 10s", s.Cluster.Full)
		}
		if got := s.Cluster.Level(RateOf(slow.Cluster), 2*second); !near(got, 2) {
			t.Errorf("level at 2s = %v, want 2: the old F no longer fills it", got)
		}
	})

	t.Run("a bucket left alone until it was full under the old rates is full under new ones", func(t *testing.T) {
		t.Parallel()
		s := NewState()
		fast, slow := Limits{Cluster: space.Rate{RefillRPS: 10, Burst: 10}}, Limits{Cluster: space.Rate{RefillRPS: 1, Burst: 20}}
		Decide(s, fast, space.Charge{Cost: 10}, true, 0)
		if d := Decide(s, slow, space.Charge{Cost: 20}, true, 2*second); !d.Admitted {
			t.Fatalf("a bucket full at 1s under its old rates, asked at 2s with a burst of 20 = %+v", d)
		}
	})

	t.Run("at unchanged rates a refusal and a report write nothing", func(t *testing.T) {
		t.Parallel()
		s := NewState()
		lim := tiers()
		c := space.Charge{Key: "acme", Rate: rate(10, 5), Soft: rate(1, 2), Tier: "pro", Cost: 1}
		for i := range 200 {
			Decide(s, lim, c, true, float64(i)*100)
		}
		before := s.Clone()
		for _, take := range []bool{true, false} {
			Decide(s, lim, space.Charge{Key: "acme", Rate: rate(10, 5), Soft: rate(1, 2), Tier: "pro", Cost: 5}, take, 20001)
		}
		for k, v := range before.Reserves {
			if *s.Reserves[k] != *v {
				t.Errorf("reserve %s: %+v, was %+v", k, *s.Reserves[k], *v)
			}
		}
		if s.Cluster != before.Cluster || *s.Clients["acme"] != *before.Clients["acme"] {
			t.Errorf("a refusal wrote: cluster %+v (was %+v), client %+v (was %+v)", s.Cluster, before.Cluster, *s.Clients["acme"], *before.Clients["acme"])
		}
	})
}

// TestMost holds Most to what Decide admits on a fresh state: the largest cost is
// admitted, one more is refused for ever, with reserves and without (whose answer
// Most gives without building a state).
func TestMost(t *testing.T) {
	t.Parallel()

	for _, c := range []struct {
		name string
		lim  Limits
		tier string
	}{
		{"without reservations, the cluster bucket's burst", Limits{Cluster: space.Rate{RefillRPS: 10, Burst: 7}}, ""},
		{"without reservations, whatever the tier", Limits{Cluster: space.Rate{RefillRPS: 0, Burst: 3}}, "pro"},
		{"with reserves, what the tier may draw", tiers(), "pro"},
		{"with reserves, for a tier with none of its own", tiers(), "free"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			most := Most(c.lim, c.tier)
			if most != math.Trunc(most) || most < 1 {
				t.Fatalf("Most = %v, want a whole cost of at least 1", most)
			}
			now := 1000 * second
			if d := Decide(NewState(), c.lim, space.Charge{Tier: c.tier, Cost: int(most)}, true, now); !d.Admitted {
				t.Errorf("a cost of Most (%v) on a fresh state = %+v, want admitted", most, d)
			}
			if d := Decide(NewState(), c.lim, space.Charge{Tier: c.tier, Cost: int(most) + 1}, true, now); d.Admitted || !math.IsInf(d.RetryAfter, 1) {
				t.Errorf("a cost of Most+1 (%v) on a fresh state = %+v, want refused for ever", most+1, d)
			}
		})
	}
}

func TestSoftLimits(t *testing.T) {
	t.Parallel()

	t.Run("an admission past the soft bucket is a breach that takes no soft token", func(t *testing.T) {
		t.Parallel()
		s := NewState()
		lim := Limits{Cluster: space.Rate{RefillRPS: 0, Burst: 100}}
		c := space.Charge{Key: "acme", Rate: rate(0, 5), Soft: rate(0, 2), Cost: 1}
		var breaches int
		for range 5 {
			d := Decide(s, lim, c, true, 0)
			if !d.Admitted {
				t.Fatal("refused within the hard bucket")
			}
			if d.SoftBreach {
				breaches++
			}
		}
		if breaches != 3 {
			t.Errorf("%d breaches, want the 3 past a soft burst of 2", breaches)
		}
		if d := Decide(s, lim, c, true, 0); d.Admitted || d.SoftBreach {
			t.Errorf("past the hard bucket = %+v, want refused and no breach", d)
		}
	})
}

func TestReserves(t *testing.T) {
	t.Parallel()

	t.Run("a cost larger than any one source is drawn across the tier's reserve and the shared remainder at once", func(t *testing.T) {
		t.Parallel()
		s := NewState()
		d := Decide(s, tiers(), space.Charge{Tier: "pro", Cost: 100}, true, 0)
		if !d.Admitted || d.Drawn != (Drawn{Own: 40, Shared: 60}) {
			t.Fatalf("a pro create of cost 100 on full buckets = %+v, want 40 from its reserve and 60 shared", d)
		}
	})

	t.Run("an idle tier lends down to its keep; a busy one lends nothing", func(t *testing.T) {
		t.Parallel()
		s := NewState()
		lim := tiers()
		// Free empties the shared remainder, then borrows what pro and enterprise
		// lend: 20 of pro's 40, 20 of enterprise's 80.
		if d := Decide(s, lim, space.Charge{Tier: "free", Cost: 80}, true, 0); !d.Admitted || d.Drawn.Shared != 80 {
			t.Fatalf("free's first 80 = %+v", d)
		}
		d := Decide(s, lim, space.Charge{Tier: "free", Cost: 40}, true, 0)
		if !d.Admitted || d.Drawn.Borrowed != 40 {
			t.Fatalf("free's next 40 = %+v, want borrowed", d)
		}
		if d := Decide(s, lim, space.Charge{Tier: "free", Cost: 1}, true, 0); d.Admitted {
			t.Fatalf("free borrowed past the keeps: %+v", d)
		}
		// Enterprise asks (its reserve is drawn): it is busy for its interval, 2 s.
		Decide(s, lim, space.Charge{Tier: "enterprise", Cost: 1}, true, 0.1*second)
		if d := Decide(s, lim, space.Charge{Tier: "free", Cost: 1}, true, 0.5*second); d.Admitted && d.Drawn.Borrowed > 0 && s.Reserves["enterprise"].Tokens < 59 {
			t.Fatalf("free borrowed from busy enterprise: %+v", d)
		}
		if !near(s.Reserves["enterprise"].IdleAt, 0.1*second+2*second) {
			t.Errorf("enterprise idle at %v, want 2.1s", s.Reserves["enterprise"].IdleAt)
		}
	})

	t.Run("what is reported is what can be drawn: a busy tier's lendable tokens are not", func(t *testing.T) {
		t.Parallel()
		// The measurement: cluster 2/s burst 12, pro and enterprise each
		// reserving 0.5/s burst 4 (lendable 1), both having just asked.
		lim := Limits{Cluster: space.Rate{RefillRPS: 2, Burst: 12}, Reservations: &space.Reservations{
			Shared: space.Rate{RefillRPS: 1, Burst: 4},
			Reserves: []space.TierReserve{
				{Tier: "enterprise", Reserve: space.Reserve{Rate: space.Rate{RefillRPS: 0.5, Burst: 4}, Lendable: 1}},
				{Tier: "pro", Reserve: space.Reserve{Rate: space.Rate{RefillRPS: 0.5, Burst: 4}, Lendable: 1}},
			},
		}}
		s := NewState()
		Decide(s, lim, space.Charge{Tier: "pro", Cost: 1}, true, 0)
		Decide(s, lim, space.Charge{Tier: "enterprise", Cost: 1}, true, 0)
		for i := range 4 {
			if d := Decide(s, lim, space.Charge{Tier: "free", Cost: 1}, true, 1); !d.Admitted {
				t.Fatalf("free's create %d refused", i+1)
			}
		}
		d := Decide(s, lim, space.Charge{Tier: "free", Cost: 1}, false, 2)
		if d.Admitted || d.Cluster.Remaining > 1e-5 {
			t.Fatalf("free's report = %+v, want nothing it can draw", d)
		}
		if d.Bound < 6 {
			t.Errorf("the bound %v leaves out what the busy tiers hold", d.Bound)
		}
		// The retry: the shared remainder refills 1 token a second; the lenders turn
		// idle at 8s (their interval), after it.
		if d.Cluster.Wait < 0.99*second || d.Cluster.Wait > 1.01*second {
			t.Errorf("retry %vµs, want about 1s", d.Cluster.Wait)
		}
	})

	t.Run("a warm-up leaves the floor in the shared remainder and touches no reserve", func(t *testing.T) {
		t.Parallel()
		s := NewState()
		lim := tiers()
		var n int
		for Decide(s, lim, space.Charge{Cost: 1, Floor: 16}, true, 0).Admitted {
			n++
		}
		if n != 80-16 || len(s.Reserves) != 0 {
			t.Errorf("%d warm-ups, reserves %v; want 64 and none read", n, s.Reserves)
		}
	})
}

func TestOutage(t *testing.T) {
	t.Parallel()

	t.Run("n replicas, each on its copy, admit one cluster budget between them, tiers included", func(t *testing.T) {
		t.Parallel()
		lim := Limits{Cluster: space.Rate{RefillRPS: 20, Burst: 20}, Reservations: &space.Reservations{
			Shared: space.Rate{RefillRPS: 10, Burst: 10},
			Reserves: []space.TierReserve{
				{Tier: "enterprise", Reserve: space.Reserve{Rate: space.Rate{RefillRPS: 5, Burst: 5}, Lendable: 1}},
				{Tier: "pro", Reserve: space.Reserve{Rate: space.Rate{RefillRPS: 5, Burst: 5}, Lendable: 1}},
			},
		}}
		const replicas = 3
		copies := make([]*Outage, replicas)
		for i := range copies {
			copies[i] = &Outage{State: NewState(), Replicas: replicas}
		}
		admitted := 0
		// 8 s of every tier flooding every replica, a create each 1 ms.
		for ms := range 8000 {
			now := float64(ms) * 1000
			for _, o := range copies {
				for _, tier := range []string{"free", "pro", "enterprise"} {
					if o.Decide(lim, space.Charge{Tier: tier, Cost: 1}, now).Admitted {
						admitted++
					}
				}
			}
		}
		// One budget: the burst and 8 s of refill, 20 + 160; each copy may round up
		// by under a cost n times over.
		if budget := 20.0 + 20*8; float64(admitted) > budget+replicas {
			t.Errorf("%d admitted, over the budget of %.0f", admitted, budget)
		} else if float64(admitted) < 0.9*budget {
			t.Errorf("%d admitted, well under the budget of %.0f", admitted, budget)
		}
	})

	t.Run("more replicas than tokens still admit a nth of the rate each, into debt", func(t *testing.T) {
		t.Parallel()
		lim := Limits{Cluster: space.Rate{RefillRPS: 2, Burst: 2}}
		o := &Outage{State: NewState(), Replicas: 10}
		admitted := 0
		for ms := range 10000 {
			if o.Decide(lim, space.Charge{Cost: 1}, float64(ms)*1000).Admitted {
				admitted++
			}
		}
		// A tenth of 2/s over 10 s, and the first from a full copy.
		if admitted < 2 || admitted > 3 {
			t.Errorf("%d admitted by one of 10 replicas in 10 s at 2/s, want 2 or 3", admitted)
		}
	})
}
