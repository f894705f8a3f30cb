package admission

import (
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/space-sandbox/space"
)

// TestRefusalsAreCountedAlike runs one workload with the refusal cache on and off, in
// enforce and in shadow mode: the decisions counted must not depend on whether Redis
// or the cache answered (a limiter whose shadow counts went wrong when its local cache
// answered is the failure this guards against).
func TestRefusalsAreCountedAlike(t *testing.T) {
	t.Parallel()
	// The flow asks the cache once, then charges (internal/sandbox's create).
	flow := func(b *bundle, c space.Charge) error {
		if le := refusal(b.adm, c); le != nil {
			return le
		}
		_, err := b.adm.Charge(b.ctx, c)
		return err
	}
	type counts struct{ admitted, rejected, shadowRejected, local, refusedToCaller float64 }
	run := func(t *testing.T, rdb redis.UniversalClient, shadow bool, maxAge time.Duration) counts {
		opts := enabled(space.Rate{RefillRPS: neverRefills, Burst: 100})
		opts.Shadow, opts.RefusalMaxAge = shadow, maxAge
		b := setup(t, rdb, opts)
		var refused float64
		for range 20 {
			err := flow(b, space.Charge{Key: "acme", Rate: rate(neverRefills, 5), Tier: "pro", Cost: 1})
			var le *space.LimitError
			switch {
			case errors.As(err, &le):
				refused++
			case err != nil:
				t.Fatal(err)
			}
		}
		count := func(decision string) float64 {
			return metricValue(t, b.reg, "space_sandbox_admission_rate_decisions_total", "decision", decision, "bucket", string(space.BucketClientActivation), "tier", "pro")
		}
		return counts{
			admitted: count(decisionAdmitted), rejected: count(decisionRejected), shadowRejected: count(decisionShadowRejected),
			local:           metricValue(t, b.reg, "space_sandbox_admission_local_refusals_total", "bucket", string(space.BucketClientActivation)),
			refusedToCaller: refused,
		}
	}

	topologies(t, func(t *testing.T, rdb redis.UniversalClient) {
		t.Run("enforcing, the cache's refusals are counted as Redis's", func(t *testing.T) {
			t.Parallel()
			on, off := run(t, rdb, false, time.Hour), run(t, rdb, false, 0)
			if on.local < 10 || off.local != 0 {
				t.Fatalf("refused from memory: %v with the cache, %v without; want most of the 15 with it, none without", on.local, off.local)
			}
			on.local, off.local = 0, 0
			if want := (counts{admitted: 5, rejected: 15, refusedToCaller: 15}); on != want || off != want {
				t.Fatalf("cache on %+v, off %+v; want both %+v", on, off, want)
			}
		})
		t.Run("shadowing, every would-be refusal is counted once and admitted, cache or not", func(t *testing.T) {
			t.Parallel()
			on, off := run(t, rdb, true, time.Hour), run(t, rdb, true, 0)
			// The bucket holds 5: the sixth and later would be refused, all 15 of them,
			// and each is admitted (shadow takes the client's tokens only while it has
			// them).
			if want := (counts{admitted: 5, shadowRejected: 15}); on != want || off != want {
				t.Fatalf("cache on %+v, off %+v; want both %+v", on, off, want)
			}
		})
	})
}
