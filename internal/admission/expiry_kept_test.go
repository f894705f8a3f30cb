package admission

import (
	"math"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/testenv"
)

// TestATakeKeepsAnExpiryThatCoversItsRefill holds bucket.lua's kept expiry: a take
// leaves a key's expiry as it is while the stored one comes after the moment the
// bucket is full again, and writes burst/refill when it does not, on every path that
// takes (one key, two keys, a soft limit).
func TestATakeKeepsAnExpiryThatCoversItsRefill(t *testing.T) {
	t.Parallel()

	// within reports whether got is want give or take a second (the test's own
	// round trips, and PTTL's millisecond rounding).
	within := func(got, want time.Duration) bool { return got <= want+time.Second && got >= want-time.Second }

	t.Run("a take keeps both keys' expiries while they cover the refill", func(t *testing.T) {
		t.Parallel()
		topologies(t, func(t *testing.T, rdb redis.UniversalClient) {
			b := setup(t, rdb, enabled(space.Rate{RefillRPS: 1, Burst: 100}))
			now := b.redisTime()
			// 90 tokens: after the take, 11 s to refill, and the keys live 50 s.
			b.writeStored(b.clusterKey(), 90, now, 50*time.Second)
			b.writeStored(b.clientKey("acme"), 90, now, 50*time.Second)
			before := []stored{b.stored(b.clusterKey()), b.stored(b.clientKey("acme"))}
			if d := b.admit("acme", rate(1, 100)); !d.Admitted {
				t.Fatalf("decision = %+v, want admitted", d)
			}
			for i, key := range []string{b.clusterKey(), b.clientKey("acme")} {
				after := b.stored(key)
				if after.expires != before[i].expires || after.tokens >= before[i].tokens {
					t.Fatalf("%s: stored %+v after the take, want the expiry %v kept and a token fewer than %v", key, after, before[i].expires, before[i].tokens)
				}
				if ttl := b.pttl(key); ttl > 50*time.Second || ttl < 48*time.Second {
					t.Fatalf("%s lives %v after the take, want the 50 s it had", key, ttl)
				}
			}
		})
	})

	t.Run("a take rewrites an expiry that falls short of the refill", func(t *testing.T) {
		t.Parallel()
		topologies(t, func(t *testing.T, rdb redis.UniversalClient) {
			b := setup(t, rdb, enabled(space.Rate{RefillRPS: 1, Burst: 100}))
			now := b.redisTime()
			// After the take the cluster bucket needs 11 s and its key has 5; the
			// client's needs 3 s at 4/s and its key has 10, so only the first is
			// rewritten, to burst/refill: 100 s.
			b.writeStored(b.clusterKey(), 90, now, 5*time.Second)
			b.writeStored(b.clientKey("acme"), 90, now, 10*time.Second)
			client := b.stored(b.clientKey("acme"))
			if d := b.admit("acme", rate(4, 100)); !d.Admitted {
				t.Fatalf("decision = %+v, want admitted", d)
			}
			if ttl := b.pttl(b.clusterKey()); !within(ttl, 100*time.Second) {
				t.Fatalf("cluster key lives %v, want the 100 s its bucket takes to refill from empty", ttl)
			}
			if s := b.stored(b.clusterKey()); math.Abs(s.expires-(s.micros+100e6+float64(expiryMargin/time.Microsecond))) > 1 {
				t.Fatalf("cluster key stored %+v, want its expiry 100 s after the take", s)
			}
			if s := b.stored(b.clientKey("acme")); s.expires != client.expires {
				t.Fatalf("client key stored %+v, want its expiry %v kept", s, client.expires)
			}
		})
	})

	t.Run("a lowered rate's take extends the key to the new refill", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testenv.Redis(t), enabled(space.Rate{RefillRPS: 1e6, Burst: 1e6}))
		b.admit("acme", rate(10, 10)) // the key lives 1 s
		if ttl := b.pttl(b.clientKey("acme")); ttl > time.Second+expiryMargin {
			t.Fatalf("at 10/s the key lives %v, want at most 1 s", ttl)
		}
		// At 0.01/s the 2 tokens taken by then refill in 200 s: the kept 1 s falls short.
		b.admit("acme", rate(0.01, 10))
		if ttl := b.pttl(b.clientKey("acme")); !within(ttl, 1000*time.Second) {
			t.Fatalf("after a take at 0.01/s the key lives %v, want burst/refill, 1000 s", ttl)
		}
	})

	t.Run("a soft limit's slower refill counts in the client key's expiry", func(t *testing.T) {
		t.Parallel()
		topologies(t, func(t *testing.T, rdb redis.UniversalClient) {
			b := setup(t, rdb, enabled(space.Rate{RefillRPS: 1e6, Burst: 1e6}))
			// A hard bucket at 100/s is full again 10 ms after a take and its key has
			// 5 s; the soft one at 0.01/s needs 100 s for the token it gives.
			b.writeStored(b.clientKey("acme"), 100, b.redisTime(), 5*time.Second)
			c := space.Charge{Key: "acme", Rate: rate(100, 100), Soft: rate(0.01, 100), Cost: 1}
			if _, err := b.adm.Charge(b.ctx, c); err != nil {
				t.Fatalf("Charge: %v", err)
			}
			if ttl := b.pttl(b.clientKey("acme")); !within(ttl, 10000*time.Second) {
				t.Fatalf("the client key lives %v, want the soft bucket's burst/refill, 10^4 s", ttl)
			}
			// Now the key covers both refills: the next take keeps it.
			before := b.pttl(b.clientKey("acme"))
			if _, err := b.adm.Charge(b.ctx, c); err != nil {
				t.Fatalf("Charge: %v", err)
			}
			if ttl := b.pttl(b.clientKey("acme")); ttl > before {
				t.Fatalf("the second take moved the expiry from %v to %v, want it kept", before, ttl)
			}
		})
	})

	t.Run("the cluster key alone keeps and rewrites alike", func(t *testing.T) {
		t.Parallel()
		topologies(t, func(t *testing.T, rdb redis.UniversalClient) {
			b := setup(t, rdb, enabled(space.Rate{RefillRPS: 1, Burst: 100}))
			b.writeStored(b.clusterKey(), 50, b.redisTime(), time.Hour)
			kept := b.stored(b.clusterKey()).expires
			b.admit("", nil) // 51 s to refill, an hour to live: kept
			if s := b.stored(b.clusterKey()); s.expires != kept {
				t.Fatalf("stored %+v, want the expiry %v kept", s, kept)
			}
			b.writeStored(b.clusterKey(), 50, b.redisTime(), 10*time.Second)
			b.admit("", nil) // 51 s to refill, 10 s to live: rewritten
			if ttl := b.pttl(b.clusterKey()); !within(ttl, 100*time.Second) {
				t.Fatalf("the cluster key lives %v, want 100 s", ttl)
			}
		})
	})
}

// TestAReservedTakeKeepsAnExpiryThatCoversItsRefill is the same for reserve.lua: the
// tier's reserve, the shared remainder and the client bucket each keep their expiry
// while it covers their refill.
func TestAReservedTakeKeepsAnExpiryThatCoversItsRefill(t *testing.T) {
	t.Parallel()
	topologies(t, func(t *testing.T, rdb redis.UniversalClient) {
		b := reservedSetup(t, rdb, "", proReserve(1))
		// expiry is the third double of a key's state, whatever its length.
		expiry := func(key string) float64 {
			t.Helper()
			raw, err := b.rdb.Get(b.ctx, key).Result()
			if err != nil || len(raw) < 24 {
				t.Fatalf("GET %s = %q, %v; want a bucket's state", key, raw, err)
			}
			return double(raw, 16)
		}
		keys := []string{TierKey(b.prefix, "pro"), b.clusterKey(), b.clientKey("acme")}
		b.chargeAs("acme", "pro") // from the reserve: writes it and the client key
		for range 4 {
			b.chargeAs("acme", "pro") // three more from the reserve, then the shared remainder
		}
		first := map[string]float64{}
		for _, key := range keys {
			first[key] = expiry(key)
		}
		if d := b.chargeAs("acme", "pro"); d.Source != "shared" {
			t.Fatalf("the sixth charge came from %q, want the shared remainder", d.Source)
		}
		for _, key := range keys {
			if got := expiry(key); got != first[key] {
				t.Fatalf("%s: expiry %v after the take, want %v kept (a bucket that never refills is covered by its 10^12 s)", key, got, first[key])
			}
		}
	})
}
