package admission

import (
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/testenv"
)

// reservedSetup is an Admitter on rdb whose cluster bucket of 10 (which never refills)
// is shared out as res says.
func reservedSetup(t *testing.T, rdb redis.UniversalClient, prefix string, res *space.Reservations) *bundle {
	t.Helper()
	opts := enabled(space.Rate{RefillRPS: neverRefills, Burst: 10})
	opts.Prefix = prefix
	opts.Reservations = func() *space.Reservations { return res }
	return setup(t, rdb, opts)
}

// proReserve reserves 4 of the cluster's 10 tokens for pro, lendable as given.
func proReserve(lendable float64) *space.Reservations {
	return &space.Reservations{
		Shared:   space.Rate{RefillRPS: neverRefills, Burst: 6},
		Reserves: []space.TierReserve{{Tier: "pro", Reserve: space.Reserve{Rate: space.Rate{RefillRPS: neverRefills, Burst: 4}, Lendable: lendable}}},
	}
}

// chargeAs charges one activation of tier (a client bucket of 100 that never
// refills) and returns the decision.
func (b *bundle) chargeAs(client space.ClientKey, tier string) Decision {
	b.t.Helper()
	d, err := b.adm.decide(b.ctx, space.Charge{Key: client, Rate: rate(neverRefills, 100), Tier: tier, Cost: 1}, take)
	if err != nil {
		b.t.Fatal(err)
	}
	return d
}

// drainAs charges as tier until the first refusal and returns how many were admitted,
// by where their cluster token came from, and the refusal.
func (b *bundle) drainAs(client space.ClientKey, tier string) (map[string]int, Decision) {
	b.t.Helper()
	got := map[string]int{}
	for range 100 {
		d := b.chargeAs(client, tier)
		if !d.Admitted {
			return got, d
		}
		got[d.Source]++
	}
	b.t.Fatal("never refused")
	return nil, Decision{}
}

func TestReservedCapacity(t *testing.T) {
	t.Parallel()

	t.Run("a reserved tier takes from its reserve first, then from the shared remainder", func(t *testing.T) {
		t.Parallel()
		topologies(t, func(t *testing.T, rdb redis.UniversalClient) {
			b := reservedSetup(t, rdb, "", proReserve(1))
			got, refused := b.drainAs("acme", "pro")
			if got["reserve"] != 4 || got["shared"] != 6 || got["borrowed"] != 0 || refused.Bucket != space.BucketClusterActivation {
				t.Fatalf("pro drew %v then %+v; want its 4 reserved, then the 6 shared, then a cluster refusal", got, refused)
			}
		})
	})

	t.Run("a tier without a reserve draws on the shared remainder, then borrows an idle reserve down to what lendable keeps", func(t *testing.T) {
		t.Parallel()
		topologies(t, func(t *testing.T, rdb redis.UniversalClient) {
			b := reservedSetup(t, rdb, "", proReserve(0.5))
			got, refused := b.drainAs("initech", "free")
			if got["shared"] != 6 || got["borrowed"] != 2 || refused.Bucket != space.BucketClusterActivation {
				t.Fatalf("free drew %v then %+v; want the 6 shared and 2 of pro's 4 (lendable 0.5)", got, refused)
			}
			// What pro keeps is its own.
			if got, _ := b.drainAs("acme", "pro"); got["reserve"] != 2 {
				t.Fatalf("pro then drew %v, want the 2 it kept", got)
			}
		})
	})

	t.Run("a reserve of lendable 0 is never borrowed", func(t *testing.T) {
		t.Parallel()
		topologies(t, func(t *testing.T, rdb redis.UniversalClient) {
			b := reservedSetup(t, rdb, "", proReserve(0))
			if got, _ := b.drainAs("initech", "free"); got["shared"] != 6 || got["borrowed"] != 0 {
				t.Fatalf("free drew %v, want the 6 shared and none of pro's", got)
			}
			if got, _ := b.drainAs("acme", "pro"); got["reserve"] != 4 {
				t.Fatalf("pro then drew %v, want its 4", got)
			}
		})
	})

	t.Run("a tier that asked within its refill interval lends nothing", func(t *testing.T) {
		t.Parallel()
		topologies(t, func(t *testing.T, rdb redis.UniversalClient) {
			b := reservedSetup(t, rdb, "", proReserve(1))
			if d := b.chargeAs("acme", "pro"); d.Source != "reserve" {
				t.Fatalf("pro's first charge came from %q", d.Source)
			}
			if got, _ := b.drainAs("initech", "free"); got["shared"] != 6 || got["borrowed"] != 0 {
				t.Fatalf("free drew %v while pro was active, want the 6 shared only", got)
			}
			if got, _ := b.drainAs("acme", "pro"); got["reserve"] != 3 {
				t.Fatalf("pro then drew %v, want the 3 left of its reserve", got)
			}
		})
	})

	t.Run("a tier's last ask outlives its refill interval, however full its reserve", func(t *testing.T) {
		t.Parallel()
		topologies(t, func(t *testing.T, rdb redis.UniversalClient) {
			// pro reserves 4 refilling at 4/s: nobody may borrow from it for 1 s after
			// it asked.
			b := reservedSetup(t, rdb, "", &space.Reservations{
				Shared:   space.Rate{RefillRPS: neverRefills, Burst: 6},
				Reserves: []space.TierReserve{{Tier: "pro", Reserve: space.Reserve{Rate: space.Rate{RefillRPS: 4, Burst: 4}, Lendable: 1}}},
			})
			b.chargeAs("acme", "pro")
			// Full again, so that the next ask leaves a reserve whose refill (250 ms)
			// ends long before the interval of that ask does.
			time.Sleep(500 * time.Millisecond)
			if d := b.chargeAs("acme", "pro"); d.Source != "reserve" {
				t.Fatalf("pro's second charge came from %q", d.Source)
			}
			// The mark of that ask is in the reserve's key: gone with it, the reserve
			// would read as full and idle, and be lent while pro is active.
			if ttl := b.pttl(TierKey(b.prefix, "pro")); ttl < 900*time.Millisecond {
				t.Fatalf("pro's reserve lives %v after its last ask, want at least its refill interval of 1s", ttl)
			}
		})
	})

	t.Run("a client bucket too empty takes no cluster token, from any bucket", func(t *testing.T) {
		t.Parallel()
		topologies(t, func(t *testing.T, rdb redis.UniversalClient) {
			b := reservedSetup(t, rdb, "", proReserve(1))
			one := rate(neverRefills, 1)
			for i, want := range []bool{true, false, false} {
				d, err := b.adm.decide(b.ctx, space.Charge{Key: "acme", Rate: one, Tier: "pro", Cost: 1}, take)
				if err != nil || d.Admitted != want {
					t.Fatalf("charge %d = %+v, %v; want admitted %v", i+1, d, err, want)
				}
				if !want && d.Bucket != space.BucketClientActivation {
					t.Fatalf("charge %d refused by %s, want the client bucket", i+1, d.Bucket)
				}
			}
			if got, _ := b.drainAs("globex", "pro"); got["reserve"] != 3 || got["shared"] != 6 {
				t.Fatalf("then pro drew %v: the refused charges took cluster tokens", got)
			}
		})
	})

	t.Run("three replicas charging at once admit exactly the cluster bucket, the reserved tier at least its reserve", func(t *testing.T) {
		t.Parallel()
		eachTopology(t, func(t *testing.T, dial func(testing.TB) redis.UniversalClient) {
			res := proReserve(0)
			first := reservedSetup(t, dial(t), "", res)
			replicas := []*bundle{first, reservedSetup(t, dial(t), first.prefix, res), reservedSetup(t, dial(t), first.prefix, res)}
			var mu sync.Mutex
			admitted := map[string]int{}
			var wg sync.WaitGroup
			for i := range 24 {
				wg.Go(func() {
					b := replicas[i%3]
					tier, client := "free", space.ClientKey("initech")
					if i%4 == 0 {
						tier, client = "pro", "acme"
					}
					for range 5 {
						d, err := b.adm.decide(b.ctx, space.Charge{Key: client, Rate: rate(neverRefills, 1000), Tier: tier, Cost: 1}, take)
						if err != nil {
							t.Error(err)
							return
						}
						if d.Admitted {
							mu.Lock()
							admitted[tier]++
							mu.Unlock()
						}
					}
				})
			}
			wg.Wait()
			if total := admitted["pro"] + admitted["free"]; total != 10 {
				t.Fatalf("admitted %v, %d in all; want the cluster bucket's 10 exactly", admitted, total)
			}
			if admitted["pro"] < 4 {
				t.Fatalf("pro was admitted %d, less than its reserve of 4", admitted["pro"])
			}
		})
	})

	t.Run("the refusal cache never refuses a tier whose reserve holds tokens", func(t *testing.T) {
		t.Parallel()
		b := reservedSetup(t, testenv.Redis(t), "", proReserve(0))
		if got, _ := b.drainAs("initech", "free"); got["shared"] != 6 {
			t.Fatalf("free drew %v", got)
		}
		if le := refusal(b.adm, space.Charge{Key: "initech", Rate: rate(neverRefills, 100), Tier: "free", Cost: 1}); le == nil || le.Bucket != space.BucketClusterActivation {
			t.Fatalf("free, which can draw on nothing now, is not refused from memory: %+v", le)
		}
		if le := refusal(b.adm, space.Charge{Key: "acme", Rate: rate(neverRefills, 100), Tier: "pro", Cost: 1}); le != nil {
			t.Fatalf("pro refused from memory while its reserve holds 4: %+v", le)
		}
		if d := b.chargeAs("acme", "pro"); !d.Admitted || d.Source != "reserve" {
			t.Fatalf("pro's charge = %+v, want admitted from its reserve", d)
		}
	})

	t.Run("where each token came from is counted per tier", func(t *testing.T) {
		t.Parallel()
		b := reservedSetup(t, testenv.Redis(t), "", proReserve(1))
		b.drainAs("acme", "pro")
		for source, want := range map[string]float64{"reserve": 4, "shared": 6, "borrowed": 0} {
			// Tokens, not charges: the charge that empties the reserve draws what it
			// refilled since (a trillionth) there, the rest of its token shared.
			if got := metricValue(t, b.reg, "space_sandbox_admission_cluster_tokens_total", "tier", "pro", "source", source); !near(got, want, 1e-6) {
				t.Errorf("cluster tokens of pro from %s = %v, want %v", source, got, want)
			}
		}
		if got := metricValue(t, b.reg, "space_sandbox_admission_rate_decisions_total", "decision", "admitted", "bucket", "cluster_activation", "tier", "pro"); got != 10 {
			t.Errorf("admitted decisions of pro = %v, want 10", got)
		}
	})
}

func TestSoftLimit(t *testing.T) {
	t.Parallel()

	for _, res := range []struct {
		name string
		res  *space.Reservations
	}{{"one cluster bucket", nil}, {"reserved tiers", proReserve(1)}} {
		t.Run("an activation over the soft limit is admitted and marked, one under it is not ("+res.name+")", func(t *testing.T) {
			t.Parallel()
			topologies(t, func(t *testing.T, rdb redis.UniversalClient) {
				b := reservedSetup(t, rdb, "", res.res)
				hard, soft := rate(neverRefills, 5), rate(neverRefills, 2)
				var marks []bool
				for range 6 {
					d, err := b.adm.decide(b.ctx, space.Charge{Key: "acme", Rate: hard, Soft: soft, Tier: "pro", Cost: 1}, take)
					if err != nil {
						t.Fatal(err)
					}
					if !d.Admitted {
						if d.Bucket != space.BucketClientActivation {
							t.Fatalf("refused by %s, want the hard client bucket", d.Bucket)
						}
						break
					}
					marks = append(marks, d.SoftBreach)
				}
				want := []bool{false, false, true, true, true}
				if len(marks) != len(want) {
					t.Fatalf("admitted %d (%v), want the hard burst of 5", len(marks), marks)
				}
				for i := range want {
					if marks[i] != want[i] {
						t.Fatalf("soft breaches %v, want %v: the soft burst of 2, then every activation over it", marks, want)
					}
				}
				if got := metricValue(t, b.reg, "space_sandbox_soft_breaches_total", "budget_key", "acme", "tier", "pro"); got != 3 {
					t.Fatalf("soft breaches counted %v, want 3", got)
				}
			})
		})
	}

	t.Run("dropping a client's soft limit keeps its hard bucket", func(t *testing.T) {
		t.Parallel()
		b := reservedSetup(t, testenv.Redis(t), "", nil)
		hard := rate(neverRefills, 5)
		for range 3 {
			if d, _ := b.adm.decide(b.ctx, space.Charge{Key: "acme", Rate: hard, Soft: rate(neverRefills, 1), Cost: 1}, take); !d.Admitted {
				t.Fatal("refused within the hard burst")
			}
		}
		n, d := b.drain("acme", hard)
		if n != 2 || d.Bucket != space.BucketClientActivation {
			t.Fatalf("without the soft limit: admitted %d more (%+v), want the 2 left of the hard burst", n, d)
		}
	})

	t.Run("shadow mode counts a soft breach but tells nobody", func(t *testing.T) {
		t.Parallel()
		opts := enabled(space.Rate{RefillRPS: neverRefills, Burst: 100})
		opts.Shadow = true
		b := setup(t, testenv.Redis(t), opts)
		c := space.Charge{Key: "acme", Rate: rate(neverRefills, 5), Soft: rate(neverRefills, 1), Cost: 1}
		var told []bool
		for range 3 {
			charged, err := b.adm.Charge(b.ctx, c)
			if err != nil {
				t.Fatal(err)
			}
			told = append(told, charged.SoftBreach)
		}
		if told[0] || told[1] || told[2] {
			t.Fatalf("shadow mode signalled soft breaches: %v", told)
		}
		if got := metricValue(t, b.reg, "space_sandbox_soft_breaches_total", "budget_key", "acme"); got != 2 {
			t.Fatalf("soft breaches counted %v, want 2", got)
		}
	})
}

func TestWarmUpFloor(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name       string
		res        *space.Reservations
		warm, user int
	}{
		{"one cluster bucket", nil, 6, 4},
		// The shared remainder is 6: warm-ups leave 4 of it, and never touch pro's 4.
		{"reserved tiers", proReserve(1), 2, 8},
	} {
		t.Run("a warm-up leaves the floor to the users, and users may take it ("+tc.name+")", func(t *testing.T) {
			t.Parallel()
			topologies(t, func(t *testing.T, rdb redis.UniversalClient) {
				b := reservedSetup(t, rdb, "", tc.res)
				warm := 0
				for range 20 {
					if _, err := b.adm.Charge(b.ctx, space.Charge{Cost: 1, Floor: 4}); err != nil {
						if space.ErrorCode(err) != space.ELIMITED {
							t.Fatal(err)
						}
						break
					}
					warm++
				}
				if warm != tc.warm {
					t.Fatalf("warm-ups took %d tokens, want %d: all but the floor of the shared bucket", warm, tc.warm)
				}
				user := 0
				for range 20 {
					tier := "free"
					if user >= 4 {
						tier = "pro" // the rest of the cluster is pro's reserve
					}
					if d := b.chargeAs("acme", tier); !d.Admitted {
						break
					}
					user++
				}
				if user != tc.user {
					t.Fatalf("users then got %d, want %d: the floor and every reserve", user, tc.user)
				}
			})
		})
	}
}
