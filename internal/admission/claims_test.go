package admission

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/testenv"
)

// drained is an Admitter on a replica clock the test moves, trusting what it learnt for
// maxAge (0: the tests' hour), whose acme bucket of r it has just seen drained, and how
// acme asks it for a charge of one token.
func drained(t *testing.T, maxAge time.Duration, r *space.Rate) (*bundle, *testenv.Clock, func() *space.LimitError) {
	t.Helper()
	opts, c := clocked(enabled(space.Rate{RefillRPS: neverRefills, Burst: 1000}))
	if maxAge > 0 {
		opts.RefusalMaxAge = maxAge
	}
	b := setup(t, testenv.Redis(t), opts)
	b.drain("acme", r)
	return b, c, func() *space.LimitError { return onItsWay(t, b.adm, space.Charge{Key: "acme", Rate: r, Cost: 1}) }
}

// TestKnownShortBucketsLetThroughWhatTheirRefillServes holds CachedRefusal's claims: a
// bucket last known short lets through to Redis only the charges its refill since can
// serve, however many ask at once.
func TestKnownShortBucketsLetThroughWhatTheirRefillServes(t *testing.T) {
	t.Parallel()

	// short's acme bucket of 3 refills one token every 10 s.
	r := rate(0.1, 3)
	short := func(t *testing.T) (*bundle, *testenv.Clock, func() *space.LimitError) {
		return drained(t, 0, r)
	}
	askAcme := func(t *testing.T, b *bundle, r *space.Rate) *space.LimitError {
		return onItsWay(t, b.adm, space.Charge{Key: "acme", Rate: r, Cost: 1})
	}

	t.Run("once a token is due one charge goes to Redis, and the next is refused until another is", func(t *testing.T) {
		t.Parallel()
		_, c, ask := short(t)
		c.Advance(10*time.Second + time.Millisecond)
		if le := ask(); le != nil {
			t.Fatalf("the charge the refill serves was refused: %+v", le)
		}
		le := ask()
		if le == nil || le.Bucket != space.BucketClientActivation || le.RetryAfter < 9*time.Second || le.RetryAfter > 10*time.Second {
			t.Fatalf("the second charge = %+v, want refused for the next token, about 10 s", le)
		}
		c.Advance(10 * time.Second)
		if le := ask(); le != nil {
			t.Fatalf("refused once the next token was due: %+v", le)
		}
		if ask() == nil {
			t.Fatal("a third charge was let through for two tokens")
		}
	})

	t.Run("many asking at once are let through no more than the tokens due", func(t *testing.T) {
		t.Parallel()
		_, c, ask := short(t)
		c.Advance(30*time.Second + time.Millisecond) // the whole burst of 3 is due
		var through atomic.Int64
		var wg sync.WaitGroup
		for range 64 {
			wg.Go(func() {
				if ask() == nil {
					through.Add(1)
				}
			})
		}
		wg.Wait()
		if got := through.Load(); got != 3 {
			t.Fatalf("%d of 64 let through with 3 tokens due, want 3", got)
		}
	})

	t.Run("a decision starts the claims again from what Redis says", func(t *testing.T) {
		t.Parallel()
		b, c, ask := short(t)
		c.Advance(10*time.Second + time.Millisecond)
		if ask() != nil || ask() == nil {
			t.Fatal("want one let through, then one refused")
		}
		// The charge let through reaches Redis. The replica's clock ran ahead of
		// Redis's here, which refilled nothing: Redis refuses, and the replica learns
		// the bucket again, with no claim on it.
		if d := b.admit("acme", r); d.Admitted {
			t.Fatalf("Redis admitted %+v", d)
		}
		c.Advance(10*time.Second + time.Millisecond)
		if le := ask(); le != nil {
			t.Fatalf("refused a token due after the decision: %+v", le)
		}
	})

	t.Run("a bucket known to hold tokens lets that many charges on their way, and a released hold one more", func(t *testing.T) {
		t.Parallel()
		opts, _ := clocked(enabled(space.Rate{RefillRPS: neverRefills, Burst: 1000}))
		b := setup(t, testenv.Redis(t), opts)
		r := rate(neverRefills, 50)
		b.admit("acme", r) // 49 left
		var holds []space.Hold
		for i := range 49 {
			h, le := b.adm.CachedRefusal(space.Charge{Key: "acme", Rate: r, Cost: 1})
			if le != nil {
				t.Fatalf("charge %d refused with 49 tokens known: %+v", i, le)
			}
			holds = append(holds, h)
		}
		if le := refusal(b.adm, space.Charge{Key: "acme", Rate: r, Cost: 1}); le == nil || le.Bucket != space.BucketClientActivation {
			t.Fatalf("the 50th charge on its way with 49 tokens = %+v, want refused", le)
		}
		// One create ends without its charge (refused by another limit on the way):
		// its token can serve another.
		holds[0].Release()
		holds[0].Release()
		if le := refusal(b.adm, space.Charge{Key: "acme", Rate: r, Cost: 1}); le != nil {
			t.Fatalf("refused after a hold was given back: %+v", le)
		}
		if le := refusal(b.adm, space.Charge{Key: "acme", Rate: r, Cost: 1}); le != nil {
			t.Fatalf("a hold given back twice was counted once, yet: %+v", le)
		}
	})

	t.Run("a charge the cluster bucket refuses gives back what it claimed of the client's", func(t *testing.T) {
		t.Parallel()
		opts, c := clocked(enabled(space.Rate{RefillRPS: 0.1, Burst: 2}))
		b := setup(t, testenv.Redis(t), opts)
		r := rate(0.1, 1)
		b.admit("acme", r)
		b.admit("initech", r)                        // the cluster's and both clients' buckets empty, all known short
		c.Advance(10*time.Second + time.Millisecond) // a token due in each
		if askAcme(t, b, r) != nil {
			t.Fatal("acme's charge, which both refills serve, was refused")
		}
		le := onItsWay(t, b.adm, space.Charge{Key: "initech", Rate: r, Cost: 1})
		if le == nil || le.Bucket != space.BucketClusterActivation {
			t.Fatalf("initech = %+v, want the cluster's refusal: acme claimed its token", le)
		}
		claims := func(client space.ClientKey) int64 {
			return b.adm.known.Load(b.clientKey(client)).Load().claimed.Load()
		}
		if got := claims("initech"); got != 0 {
			t.Fatalf("initech's bucket holds %d claims after the cluster refused it, want 0", got)
		}
		if got := claims("acme"); got != 1 {
			t.Fatalf("acme's bucket holds %d claims, want the 1 let through", got)
		}
		if le := onItsWay(t, b.adm, space.Charge{Key: "globex", Cost: 1}); le == nil || le.Bucket != space.BucketClusterActivation {
			t.Fatalf("globex, with no client bucket, = %+v, want the cluster's refusal", le)
		}
	})
}

func TestAStaleStateIsRelearntByOneCharge(t *testing.T) {
	t.Parallel()

	// stale trusts what it learnt for a second; its acme bucket of 2 refills one token
	// every 100 s.
	r := rate(0.01, 2)
	stale := func(t *testing.T) (*bundle, *testenv.Clock, func() *space.LimitError) {
		return drained(t, time.Second, r)
	}

	t.Run("past RefusalMaxAge one charge asks Redis, and those meanwhile are judged by what was known", func(t *testing.T) {
		t.Parallel()
		_, c, ask := stale(t)
		c.Advance(time.Second + time.Millisecond)
		if le := ask(); le != nil {
			t.Fatalf("the charge that relearns the bucket was refused: %+v", le)
		}
		for range 5 {
			if le := ask(); le == nil || le.Bucket != space.BucketClientActivation {
				t.Fatalf("a charge while the bucket is relearnt = %+v, want refused by the old state", le)
			}
		}
	})

	t.Run("a bucket reset by hand is learnt by that charge, and the others follow", func(t *testing.T) {
		t.Parallel()
		b, c, ask := stale(t)
		if err := b.rdb.Del(b.ctx, b.clientKey("acme")).Err(); err != nil {
			t.Fatal(err)
		}
		c.Advance(time.Second + time.Millisecond)
		if ask() != nil {
			t.Fatal("the relearning charge was refused")
		}
		if d := b.admit("acme", r); !d.Admitted {
			t.Fatalf("Redis refused a bucket reset by hand: %+v", d)
		}
		if le := ask(); le != nil {
			t.Fatalf("refused with the token the reset gave back: %+v", le)
		}
	})

	t.Run("if the relearning charge never comes back, another asks a RefusalMaxAge later", func(t *testing.T) {
		t.Parallel()
		_, c, ask := stale(t)
		c.Advance(time.Second + time.Millisecond)
		if ask() != nil || ask() == nil {
			t.Fatal("want one charge through, then the next refused")
		}
		c.Advance(time.Second + time.Millisecond)
		if le := ask(); le != nil {
			t.Fatalf("no charge asked Redis a RefusalMaxAge after the last: %+v", le)
		}
	})
}

// TestABucketFirstMetIsHeldToItsFirstDecision: a bucket this replica has no state of
// lets charges through (only Redis can tell), and from its first decision on holds
// them to what that decision found.
func TestABucketFirstMetIsHeldToItsFirstDecision(t *testing.T) {
	t.Parallel()
	b := setup(t, testenv.Redis(t), enabled(space.Rate{RefillRPS: neverRefills, Burst: 1000}))
	acme := space.Charge{Key: "acme", Rate: rate(neverRefills, 3), Cost: 1}
	for i := range 5 {
		if le := onItsWay(t, b.adm, acme); le != nil {
			t.Fatalf("charge %d refused before anything was learnt: %+v", i, le)
		}
	}
	if _, err := b.adm.Charge(b.ctx, acme); err != nil {
		t.Fatal(err)
	}
	// 2 left: two more go on, the next is refused from memory.
	for i := range 2 {
		if le := onItsWay(t, b.adm, acme); le != nil {
			t.Fatalf("charge %d after the decision refused with 2 known: %+v", i, le)
		}
	}
	if le := onItsWay(t, b.adm, acme); le == nil || le.Bucket != space.BucketClientActivation {
		t.Fatalf("a third charge for 2 tokens = %+v, want refused", le)
	}
}
