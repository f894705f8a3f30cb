package admission

import (
	"testing"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/testenv"
)

func TestRefused(t *testing.T) {
	t.Parallel()

	t.Run("a refusal takes nothing and is counted and answered as Admit's would be", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testenv.Redis(t), enabled(space.Rate{RefillRPS: neverRefills, Burst: 100}))
		r := rate(neverRefills, 1)
		b.admit("acme", r) // the client's one token
		before := b.stored(b.clientKey("acme")).raw + b.stored(b.clusterKey()).raw
		d, refused := b.adm.Refused(b.ctx, "acme", r)
		if !refused || d.Admitted || d.Bucket != space.BucketClientActivation || d.Client == nil || d.Client.Remaining >= 1 {
			t.Fatalf("Refused = %+v, %v; want a client_activation refusal", d, refused)
		}
		if after := b.stored(b.clientKey("acme")).raw + b.stored(b.clusterKey()).raw; after != before {
			t.Fatal("Refused wrote to the buckets")
		}
		if got := b.decisions(decisionRejected, space.BucketClientActivation); got != 1 {
			t.Fatalf("rejected{client_activation} = %v, want 1", got)
		}
		a := b.admit("acme", r)
		// The same decision a moment later: the buckets refilled by a hair since.
		if a.Admitted || a.Bucket != d.Bucket || !near(a.Cluster.Remaining, d.Cluster.Remaining, 1e-6) ||
			!near(a.Client.Remaining, d.Client.Remaining, 1e-6) || !near(a.RetryAfter.Hours(), d.RetryAfter.Hours(), 1e-3) {
			t.Fatalf("Admit = %+v after Refused = %+v: not the same decision", a, d)
		}
	})

	t.Run("nothing is refused or counted when the decision would admit, in shadow mode or when disabled", func(t *testing.T) {
		t.Parallel()
		rdb := testenv.Redis(t)
		r := rate(neverRefills, 1)

		open := setup(t, rdb, enabled(space.Rate{RefillRPS: neverRefills, Burst: 100}))
		if _, refused := open.adm.Refused(open.ctx, "acme", r); refused {
			t.Fatal("a full bucket was refused")
		}
		if n := open.stored(open.clientKey("acme")); n.exists {
			t.Fatal("Refused wrote the client's bucket")
		}

		opts := enabled(space.Rate{RefillRPS: neverRefills, Burst: 100})
		opts.Shadow = true
		shadow := setup(t, rdb, opts)
		shadow.admit("acme", r)
		if _, refused := shadow.adm.Refused(shadow.ctx, "acme", r); refused {
			t.Fatal("shadow mode refused: it admits every rejection")
		}

		off := setup(t, rdb, Options{Cluster: space.Rate{RefillRPS: neverRefills, Burst: 1}})
		if _, refused := off.adm.Refused(off.ctx, "acme", r); refused {
			t.Fatal("a disabled Admitter refused")
		}
		for _, b := range []*bundle{open, shadow, off} {
			for _, bucket := range []space.Bucket{space.BucketClientActivation, space.BucketClusterActivation} {
				if got := b.decisions(decisionRejected, bucket); got != 0 {
					t.Fatalf("rejected{%s} = %v, want 0", bucket, got)
				}
			}
		}
	})
}
