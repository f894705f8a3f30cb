package admission

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/testenv"
)

func TestRefusedWithoutRedis(t *testing.T) {
	t.Parallel()

	// known is an Admitter on a replica clock the test moves, whose acme bucket of 2
	// refills one token every 10s.
	known := func(t *testing.T) (*bundle, *testenv.Clock, *space.Rate) {
		t.Helper()
		opts, c := clocked(enabled(space.Rate{RefillRPS: neverRefills, Burst: 100}))
		return setup(t, testenv.Redis(t), opts), c, rate(0.1, 2)
	}

	t.Run("a client known empty is refused as Redis would refuse it, without a call", func(t *testing.T) {
		t.Parallel()
		b, _, r := known(t)
		b.drain("acme", r)
		d := b.admit("acme", r) // Redis's own refusal, for comparison
		if d.Admitted {
			t.Fatal("admitted an empty bucket")
		}
		before := b.stored(b.clientKey("acme")).raw
		scripts := metricValue(t, b.reg, "space_sandbox_admission_script_seconds")
		rejected := b.decisions(decisionRejected, space.BucketClientActivation)
		le := refusal(b.adm, space.Charge{Key: "acme", Rate: r, Cost: 1})
		redisLE := d.LimitError("acme")
		if le == nil || le.Bucket != redisLE.Bucket || le.Client != "acme" || *le.Limit != *redisLE.Limit ||
			le.RetryAfter < 9*time.Second || le.RetryAfter > redisLE.RetryAfter+time.Second {
			t.Fatalf("Refused = %+v, want Redis's refusal %+v", le, redisLE)
		}
		if got := metricValue(t, b.reg, "space_sandbox_admission_script_seconds"); got != scripts {
			t.Fatalf("Refused ran the script (%v calls, was %v)", got, scripts)
		}
		if b.stored(b.clientKey("acme")).raw != before {
			t.Fatal("Refused wrote to the bucket")
		}
		if got := b.decisions(decisionRejected, space.BucketClientActivation); got != rejected+1 {
			t.Fatalf("rejected{client_activation} = %v, want %v: a local refusal counts as one", got, rejected+1)
		}
		if got := metricValue(t, b.reg, "space_sandbox_admission_local_refusals_total", "bucket", "client_activation"); got != 1 {
			t.Fatalf("local refusals = %v, want 1", got)
		}
		if err := b.charge("acme", r, 1); err == nil {
			t.Fatal("Charge admitted a client known empty")
		}
	})

	t.Run("it is admitted again the moment Redis would admit it", func(t *testing.T) {
		t.Parallel()
		b, c, r := known(t)
		b.drain("acme", r)
		le := refusal(b.adm, space.Charge{Key: "acme", Rate: r, Cost: 1})
		if le == nil {
			t.Fatal("not refused right after the drain")
		}
		// Known tokens are at most what Redis holds, so the local refill time T is no
		// later than Redis's: at T itself the cache still refuses, past it never.
		c.Advance(le.RetryAfter - time.Millisecond)
		if refusal(b.adm, space.Charge{Key: "acme", Rate: r, Cost: 1}) == nil {
			t.Fatal("admitted before the refill")
		}
		c.Advance(2 * time.Millisecond)
		if le := refusal(b.adm, space.Charge{Key: "acme", Rate: r, Cost: 1}); le != nil {
			t.Fatalf("refused past the refill: %+v", le)
		}
	})

	t.Run("a changed rate, an exemption or another key is Redis's to decide", func(t *testing.T) {
		t.Parallel()
		b, _, r := known(t)
		b.drain("acme", r)
		if refusal(b.adm, space.Charge{Key: "acme", Rate: r, Cost: 1}) == nil {
			t.Fatal("not refused")
		}
		raised := rate(100, 50)
		if le := refusal(b.adm, space.Charge{Key: "acme", Rate: raised, Cost: 1}); le != nil {
			t.Fatalf("refused under a raised rate: %+v", le)
		}
		if le := refusal(b.adm, space.Charge{Key: "acme", Rate: nil, Cost: 1}); le != nil {
			t.Fatalf("an exempt client refused: %+v", le)
		}
		if le := refusal(b.adm, space.Charge{Key: "globex", Rate: r, Cost: 1}); le != nil {
			t.Fatalf("another key refused: %+v", le)
		}
	})

	t.Run("the cluster bucket known empty refuses every cold create, and a client short too names the client", func(t *testing.T) {
		t.Parallel()
		opts, _ := clocked(enabled(space.Rate{RefillRPS: 0.01, Burst: 1}))
		b := setup(t, testenv.Redis(t), opts)
		if d := b.admit("acme", nil); !d.Admitted {
			t.Fatal("the cluster's one token was refused")
		}
		le := refusal(b.adm, space.Charge{Key: "globex", Rate: nil, Cost: 1})
		if le == nil || le.Bucket != space.BucketClusterActivation || le.RetryAfter < 99*time.Second {
			t.Fatalf("Refused = %+v, want the cluster's refusal for 100s", le)
		}
		r := rate(neverRefills, 1)
		b.admit("initech", r) // refused by the cluster, learns initech's full bucket
		if le := refusal(b.adm, space.Charge{Key: "initech", Rate: r, Cost: 1}); le == nil || le.Bucket != space.BucketClusterActivation {
			t.Fatalf("Refused = %+v, want the cluster named while initech holds a token", le)
		}
	})

	t.Run("nothing is refused in shadow mode or with admission disabled", func(t *testing.T) {
		t.Parallel()
		rdb := testenv.Redis(t)
		r := rate(neverRefills, 1)
		opts := enabled(space.Rate{RefillRPS: neverRefills, Burst: 100})
		opts.Shadow = true
		shadow := setup(t, rdb, opts)
		shadow.admit("acme", r)
		shadow.admit("acme", r)
		if le := refusal(shadow.adm, space.Charge{Key: "acme", Rate: r, Cost: 1}); le != nil {
			t.Fatal("shadow mode refused: it admits every rejection")
		}
		off := setup(t, rdb, Options{Cluster: space.Rate{RefillRPS: neverRefills, Burst: 1}})
		if le := refusal(off.adm, space.Charge{Key: "acme", Rate: r, Cost: 1}); le != nil {
			t.Fatal("a disabled Admitter refused")
		}
	})

	for _, refill := range []float64{0, 0.1} {
		t.Run(fmt.Sprintf("a bucket reset by hand is admitted once what was known of it is older than the bound (refill %g/s)", refill), func(t *testing.T) {
			t.Parallel()
			opts, c := clocked(enabled(space.Rate{RefillRPS: neverRefills, Burst: 100}))
			opts.RefusalMaxAge = time.Second
			b := setup(t, testenv.Redis(t), opts)
			r := rate(refill, 3)
			b.drain("acme", r)
			if err := b.charge("acme", r, 1); space.ErrorCode(err) != space.ELIMITED {
				t.Fatalf("charge of the drained bucket = %v, want a refusal", err)
			}
			// An operator resets the bucket: Redis would admit 3 now.
			if err := b.rdb.Del(b.ctx, b.clientKey("acme")).Err(); err != nil {
				t.Fatal(err)
			}
			c.Advance(999 * time.Millisecond)
			if le := refusal(b.adm, space.Charge{Key: "acme", Rate: r, Cost: 1}); le == nil {
				t.Fatal("not refused from memory within the bound: the cache is not on")
			}
			c.Advance(2 * time.Millisecond)
			if le := refusal(b.adm, space.Charge{Key: "acme", Rate: r, Cost: 1}); le != nil {
				t.Fatalf("refused from memory %v after it was learnt, past the bound of 1s: %+v", time.Second+time.Millisecond, le)
			}
			for i := range 3 {
				if err := b.charge("acme", r, 1); err != nil {
					t.Fatalf("charge %d of the reset bucket = %v, want admitted", i+1, err)
				}
			}
		})
	}

	t.Run("a bound of zero refuses nothing from memory", func(t *testing.T) {
		t.Parallel()
		opts := enabled(space.Rate{RefillRPS: neverRefills, Burst: 100})
		opts.RefusalMaxAge = 0
		b := setup(t, testenv.Redis(t), opts)
		r := rate(neverRefills, 1)
		b.drain("acme", r)
		if le := refusal(b.adm, space.Charge{Key: "acme", Rate: r, Cost: 1}); le != nil {
			t.Fatalf("refused from memory with the cache off: %+v", le)
		}
		if err := b.charge("acme", r, 1); space.ErrorCode(err) != space.ELIMITED {
			t.Fatalf("charge = %v, want Redis's refusal", err)
		}
	})

	t.Run("many goroutines charging at once never admit more than Redis does", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testenv.Redis(t), enabled(space.Rate{RefillRPS: neverRefills, Burst: 1000}))
		r := rate(neverRefills, 7)
		var mu sync.Mutex
		admitted := 0
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				for range 20 {
					if err := b.charge("acme", r, 1); err == nil {
						mu.Lock()
						admitted++
						mu.Unlock()
					}
				}
			})
		}
		wg.Wait()
		if admitted != 7 {
			t.Fatalf("admitted %d of a burst of 7", admitted)
		}
	})
}
