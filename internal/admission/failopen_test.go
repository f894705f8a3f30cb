package admission

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/testenv"
)

// TestFailOpenSpendsLocally covers what a replica admits while Redis cannot decide
// and the failure mode is open: each bucket as the replica knows it, spent here.
func TestFailOpenSpendsLocally(t *testing.T) {
	t.Parallel()

	// outage is an Admitter failing open through a cuttable client of the shared Redis
	// (standalone or cluster) that the test cuts and restores, its clock the test's, and its breaker opening at the
	// first failure and letting a probe through every 50ms.
	type outage struct {
		*bundle
		redis *testenv.CuttableRedis
		clock *testenv.Clock
	}
	setupOutage := func(t *testing.T, dial cuttableDial, cluster space.Rate) *outage {
		t.Helper()
		cut := dial(t)
		clock := testenv.NewClock(time.Now())
		opts := Options{Enabled: true, Cluster: cluster, Timeout: time.Second, RefusalMaxAge: time.Hour, Now: clock.Now,
			Breaker: NewBreaker(BreakerOptions{Failures: 1, OpenFor: 50 * time.Millisecond})}
		return &outage{bundle: setup(t, cut.Client, opts), redis: cut, clock: clock}
	}
	// failOpen charges and expects the charge admitted without Redis.
	failOpen := func(o *outage, client space.ClientKey, r *space.Rate) {
		o.t.Helper()
		d, err := o.adm.admit(o.ctx, client, r)
		if err != nil || !d.Admitted || !d.FailedOpen {
			o.t.Fatalf("Admit(%q) = %+v, %v; want admitted, failed open", client, d, err)
		}
	}
	// refused charges and expects a refusal by bucket.
	refused := func(o *outage, client space.ClientKey, r *space.Rate, bucket space.Bucket) Decision {
		o.t.Helper()
		d, err := o.adm.admit(o.ctx, client, r)
		if err != nil || d.Admitted || d.Bucket != bucket || d.LimitError(client) == nil {
			o.t.Fatalf("Admit(%q) = %+v, %v; want refused by %s", client, d, err, bucket)
		}
		return d
	}
	neverRefillsCluster := space.Rate{RefillRPS: neverRefills, Burst: 1000}

	cuttable(t, "a client its last decision found empty is refused, not admitted, while redis is down", func(t *testing.T, dial cuttableDial) {
		o := setupOutage(t, dial, neverRefillsCluster)
		r := rate(1, 3)
		if n, _ := o.drain("acme", r); n != 3 {
			t.Fatalf("drained %d, want the burst of 3", n)
		}
		o.redis.Cut()
		d := refused(o, "acme", r, space.BucketClientActivation)
		if d.RetryAfter <= 0 || d.RetryAfter > time.Second {
			t.Fatalf("retry after %v, want the refill of one token at 1/s", d.RetryAfter)
		}
		if got := o.decisions(decisionError, space.BucketClientActivation); got != 0 {
			t.Fatalf("a refusal decided locally was counted as %v errors, want none", got)
		}
		if got := metricValue(t, o.reg, "space_sandbox_admission_local_refusals_total", "bucket", "client_activation"); got != 1 {
			t.Fatalf("local refusals %v, want 1", got)
		}

		o.clock.Advance(time.Second)
		failOpen(o, "acme", r)
		refused(o, "acme", r, space.BucketClientActivation)
		if got := o.decisions(decisionError, space.BucketClientActivation); got != 1 {
			t.Fatalf("the admission failed open was counted as %v errors, want 1", got)
		}
	})

	cuttable(t, "a bucket never learnt is spent from full", func(t *testing.T, dial cuttableDial) {
		o := setupOutage(t, dial, space.Rate{RefillRPS: neverRefills, Burst: 5})
		o.redis.Cut()
		r := rate(neverRefills, 3)
		for range 3 {
			failOpen(o, "acme", r)
		}
		refused(o, "acme", r, space.BucketClientActivation)
		// The cluster bucket, never learnt either, had 5: two are left for others.
		failOpen(o, "globex", r)
		failOpen(o, "initech", r)
		refused(o, "umbrella", r, space.BucketClusterActivation)
	})

	cuttable(t, "a refusal by the cluster bucket takes no client token", func(t *testing.T, dial cuttableDial) {
		o := setupOutage(t, dial, space.Rate{RefillRPS: neverRefills, Burst: 1})
		o.redis.Cut()
		r := rate(neverRefills, 1)
		failOpen(o, "globex", nil) // the cluster's only token
		refused(o, "acme", r, space.BucketClusterActivation)
		o.clock.Advance(time.Hour)
		// acme's own token is still there: a cluster token now would admit it.
		d := refused(o, "acme", r, space.BucketClusterActivation)
		if d.Client == nil || d.Client.Remaining != 1 {
			t.Fatalf("client bucket after the refusal: %+v, want its token of 1 still there", d.Client)
		}
	})

	cuttable(t, "many charges at once admit exactly the bucket", func(t *testing.T, dial cuttableDial) {
		o := setupOutage(t, dial, neverRefillsCluster)
		o.redis.Cut()
		r := rate(neverRefills, 10)
		var admitted, refusals atomic.Int64
		var wg sync.WaitGroup
		for range 64 {
			wg.Go(func() {
				d, err := o.adm.admit(o.ctx, "acme", r)
				switch {
				case err != nil:
					t.Error(err)
				case d.Admitted:
					admitted.Add(1)
				default:
					refusals.Add(1)
				}
			})
		}
		wg.Wait()
		if admitted.Load() != 10 || refusals.Load() != 54 {
			t.Fatalf("admitted %d and refused %d of 64, want 10 and 54", admitted.Load(), refusals.Load())
		}
	})

	cuttable(t, "once redis decides again its state replaces the local one", func(t *testing.T, dial cuttableDial) {
		o := setupOutage(t, dial, neverRefillsCluster)
		r := rate(neverRefills, 3)
		o.admit("acme", r)
		o.redis.Cut()
		failOpen(o, "acme", r)
		failOpen(o, "acme", r)
		refused(o, "acme", r, space.BucketClientActivation)
		o.redis.Restore()
		o.clock.Advance(2 * time.Hour) // what the replica knows is old: the next charge asks Redis
		testenv.Eventually(t, 5*time.Second, "redis to decide again", func() bool {
			d, err := o.adm.admit(o.ctx, "acme", r)
			return err == nil && !d.FailedOpen && d.Admitted
		})
		// Redis had taken one token of 3: the probe took the second, the third is there.
		d := o.admit("acme", r)
		if !d.Admitted || !near(d.Client.Remaining, 0, 0.01) {
			t.Fatalf("after the outage: %+v, client %+v; want Redis's last token", d, d.Client)
		}
	})

	cuttable(t, "shadow mode spends nothing locally and admits everything", func(t *testing.T, dial cuttableDial) {
		cut := dial(t)
		b := setup(t, cut.Client, Options{Enabled: true, Shadow: true, Cluster: space.Rate{RefillRPS: neverRefills, Burst: 1}, Timeout: time.Second})
		cut.Cut()
		for range 3 {
			if d, err := b.adm.admit(b.ctx, "acme", rate(neverRefills, 1)); err != nil || !d.Admitted || !d.FailedOpen {
				t.Fatalf("Admit = %+v, %v; want admitted, failed open", d, err)
			}
		}
	})
}
