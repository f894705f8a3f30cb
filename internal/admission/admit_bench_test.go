package admission

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/testenv"
)

// BenchmarkAdmit is the admission call of the create path as space-api makes it
// (through a circuit breaker), with its allocations: Admit with a client rate (the
// two-bucket script) on the allow and the reject path, each one round trip to the
// services' Redis, which dominates ns/op (allocs/op is this package's own); and the
// refusal from memory (CachedRefusal), no round trip, of an untiered and of a tiered
// charge (the tier's series counted).
//
//	go test -run '^$' -bench 'BenchmarkAdmit$' -benchmem ./internal/admission/
func BenchmarkAdmit(b *testing.B) {
	// A client as space-api builds it: its calls run directly under their deadline.
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(b), ContextTimeoutEnabled: true})
	b.Cleanup(func() { rdb.Close() })
	ctx := testenv.Context(b)
	for _, c := range []struct {
		name    string
		rate    space.Rate
		refused bool
		tier    string
	}{
		{"allow", space.Rate{RefillRPS: 1e6, Burst: 1e6}, false, ""},
		{"reject", space.Rate{RefillRPS: 0, Burst: 1}, false, ""},
		{"refused", space.Rate{RefillRPS: 0, Burst: 1}, true, ""},
		{"refused_tiered", space.Rate{RefillRPS: 0, Burst: 1}, true, "pro"},
	} {
		b.Run(c.name, func(b *testing.B) {
			a, err := New(Options{Redis: rdb, Prefix: testenv.Prefix(b), Enabled: true, FailClosed: true, Cluster: c.rate, Timeout: time.Second,
				Breaker: NewBreaker(BreakerOptions{}), RefusalMaxAge: time.Minute, BatchAbove: DefaultBatchAbove})
			if err != nil {
				b.Fatal(err)
			}
			rate := c.rate
			if _, err := a.admit(ctx, "acme", &rate); err != nil { // loads the script; empties a bucket of one
				b.Fatal(err)
			}
			allow := c.rate.Burst > 1
			b.ReportAllocs()
			for b.Loop() {
				if c.refused {
					if refusal(a, space.Charge{Key: "acme", Rate: &rate, Cost: 1, Tier: c.tier}) == nil {
						b.Fatal("Refused = nil on a bucket known empty")
					}
					continue
				}
				d, err := a.admit(ctx, "acme", &rate)
				if err != nil || d.Admitted != allow {
					b.Fatalf("Admit = %+v, %v; want admitted %v", d, err, allow)
				}
			}
		})
	}
}

// BenchmarkConcurrencyAcquire is the concurrency limiter of every API request: one
// Acquire and its release, two round trips.
func BenchmarkConcurrencyAcquire(b *testing.B) {
	c, err := NewConcurrencyLimiter(ConcurrencyOptions{Redis: testenv.Redis(b), Prefix: testenv.Prefix(b), Timeout: time.Second, PipelineAbove: DefaultPipelineAbove})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Close)
	ctx := testenv.Context(b)
	b.ReportAllocs()
	for b.Loop() {
		lease, err := c.Acquire(ctx, "acme", 10)
		if err != nil {
			b.Fatal(err)
		}
		lease.Release()
	}
}
