package admission

import (
	"fmt"
	"testing"
	"time"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/testenv"
)

// TestWhatAReplicaRemembersIsBounded holds the per-key memory of the admission path to
// its bound with more keys than it: the buckets CachedRefusal knows and the places
// Alongside knows. What is forgotten is asked of Redis again, never admitted.
func TestWhatAReplicaRemembersIsBounded(t *testing.T) {
	t.Parallel()

	t.Run("past MaxKeys the least used buckets are forgotten, and a forgotten refusal is Redis's again", func(t *testing.T) {
		t.Parallel()
		opts, c := clocked(enabled(space.Rate{RefillRPS: neverRefills, Burst: 100_000}))
		opts.MaxKeys = 50
		b := setup(t, testenv.Redis(t), opts)
		r := rate(neverRefills, 1)
		b.drain("acme", r)
		if le := refusal(b.adm, space.Charge{Key: "acme", Rate: r, Cost: 1}); le == nil {
			t.Fatal("acme's drained bucket was not refused from memory")
		}
		c.Advance(2 * time.Second) // acme is now the least recently used
		for i := range 200 {
			b.admit(space.ClientKey(fmt.Sprintf("tenant-%d", i)), rate(1, 10))
			if n := b.adm.known.Len(); n > opts.MaxKeys {
				t.Fatalf("%d buckets remembered after %d keys, want at most %d", n, i+2, opts.MaxKeys)
			}
		}
		if b.adm.known.Load(b.clientKey("acme")) != nil {
			t.Fatal("acme's bucket is still remembered after 200 newer keys")
		}
		if le := refusal(b.adm, space.Charge{Key: "acme", Rate: r, Cost: 1}); le != nil {
			t.Fatalf("a forgotten bucket was refused from memory: %+v", le)
		}
		d := b.admit("acme", r)
		if d.Admitted || d.Bucket != space.BucketClientActivation {
			t.Fatalf("acme's charge, asked of Redis, = %+v, want refused by its client bucket", d)
		}
	})

	t.Run("a bucket no charge asked about for idleBuckets is forgotten once full again, and kept while it refills", func(t *testing.T) {
		t.Parallel()
		opts, c := clocked(enabled(space.Rate{RefillRPS: neverRefills, Burst: 100_000}))
		b := setup(t, testenv.Redis(t), opts)
		refilled, empty := rate(1, 1), rate(neverRefills, 1)
		b.drain("refilled", refilled)
		b.drain("empty", empty)
		c.Advance(idleBuckets + 2*time.Second) // refilled is full again, empty is not
		b.admit("newcomer", rate(1, 10))       // a new key: the sweep runs
		if b.adm.known.Load(b.clientKey("refilled")) != nil {
			t.Fatal("a bucket full again and idle past idleBuckets is still remembered")
		}
		if b.adm.known.Load(b.clientKey("empty")) == nil {
			t.Fatal("an idle bucket still empty was forgotten: an outage would give it tokens back")
		}
		if le := refusal(b.adm, space.Charge{Key: "empty", Rate: empty, Cost: 1}); le == nil {
			t.Fatal("the empty bucket kept is not refused from memory")
		}
	})

	t.Run("past MaxKeys a client's places are forgotten, but not while some are being taken alongside", func(t *testing.T) {
		t.Parallel()
		b := setupConcurrency(t, testenv.Redis(t), ConcurrencyOptions{MaxKeys: 20})
		now := time.Now()
		b.lim.now = func() time.Time { return now }
		b.acquire("acme", 100)()
		done, ok := b.lim.Alongside("acme", 100)
		if !ok {
			t.Fatal("acme, 1 of 100 held a moment ago, may not go alongside")
		}
		acquireMany := func(from, n int) {
			for i := from; i < from+n; i++ {
				b.acquire(space.ClientKey(fmt.Sprintf("tenant-%d", i)), 100)()
				if got := b.lim.known.Len(); got > 20 {
					t.Fatalf("%d clients' places remembered, want at most 20", got)
				}
			}
		}
		now = now.Add(2 * time.Second) // acme is the least recently used
		acquireMany(0, 100)
		if b.lim.known.Load("acme") == nil {
			t.Fatal("acme was forgotten with a place being taken alongside")
		}
		done()
		now = now.Add(2 * time.Second) // and the first hundred now are too
		acquireMany(100, 100)
		if b.lim.known.Load("acme") != nil {
			t.Fatal("acme is still remembered after its place was taken and 100 newer clients")
		}
		if _, ok := b.lim.Alongside("acme", 100); ok {
			t.Fatal("a forgotten client may go alongside: it must take its place first")
		}
	})
}
