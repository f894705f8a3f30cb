package sandbox_test

import (
	"errors"
	"testing"
	"time"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/pool"
	"github.com/space-sandbox/space/internal/sandbox"
)

// A create's concurrency place taken alongside its reservation (Plan.WithPlace): what
// Create does with the place's answer, on real Postgres and the simulated substrate.
func TestPlaceAlongside(t *testing.T) {
	t.Parallel()

	overCap := &space.LimitError{Bucket: space.BucketClientConcurrency, Client: "acme", Cap: 2, RetryAfter: time.Second}

	// planned is acme's create of shape, planned, its place answered by place, which
	// also records whether acme's row existed when it was asked.
	planned := func(t *testing.T, b *bundle, shape space.Shape, place func() error) (sandbox.Plan, *int) {
		t.Helper()
		p, err := b.svc.Plan(acme(), sandbox.CreateRequest{Shape: shape})
		if err != nil {
			t.Fatal(err)
		}
		rows := -1
		return p.WithPlace(func() error {
			b.events.add("place")
			rows = b.count(t, "client = 'acme' AND state = 'starting'")
			return place()
		}), &rows
	}

	t.Run("a place taken is waited for once the create is reserved, before the charge", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p, rows := planned(t, b, python, func() error { return nil })
		sb, err := b.svc.Create(b.ctx, p)
		if err != nil || sb.State != space.StateRunning {
			t.Fatalf("create = %+v, %v", sb, err)
		}
		if got := b.events.list(); !equal(got, []string{"place", "charge:acme", "start_cold"}) {
			t.Fatalf("events = %v, want the place, then the charge and the cold start", got)
		}
		if *rows != 1 {
			t.Fatalf("%d reserved rows when the place was asked, want the create's", *rows)
		}
	})

	t.Run("a place refused takes the reservation back, charges nothing and starts nothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p, rows := planned(t, b, python, func() error { return overCap })
		_, err := b.svc.Create(b.ctx, p)
		if !errors.Is(err, overCap) {
			t.Fatalf("err = %v, want the place's refusal", err)
		}
		if got := b.events.list(); !equal(got, []string{"place"}) {
			t.Fatalf("events = %v, want nothing charged or started", got)
		}
		if *rows != 1 {
			t.Fatalf("%d reserved rows when the place was asked, want the create's", *rows)
		}
		if n := b.count(t, "true"); n != 0 {
			t.Fatalf("%d sandboxes left behind by a create refused its place", n)
		}
	})

	t.Run("a slot claimed beside a refused place is discarded, not adopted", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.addReadySlots(t, python, 1)
		p, _ := planned(t, b, python, func() error { return overCap })
		if _, err := b.svc.Create(b.ctx, p); !errors.Is(err, overCap) {
			t.Fatalf("err = %v, want the place's refusal", err)
		}
		if got := b.events.list(); !equal(got, []string{"place", "stop"}) {
			t.Fatalf("events = %v, want the claimed slot stopped and nothing adopted or charged", got)
		}
		var slots int
		if err := b.db.QueryRow(b.ctx, "SELECT count(*) FROM pool_slots").Scan(&slots); err != nil {
			t.Fatal(err)
		}
		if slots != 0 || b.count(t, "true") != 0 || b.sim.Running() != 0 {
			t.Fatalf("%d slots, %d sandboxes, %d running on the substrate; want none", slots, b.count(t, "true"), b.sim.Running())
		}
	})

	t.Run("only a plain create of a shape the pool view knows cold may take its place alongside", func(t *testing.T) {
		t.Parallel()
		b, v := setupRefusing(t)
		v.waitCold(python)
		for _, tc := range []struct {
			name string
			req  sandbox.CreateRequest
			want bool
		}{
			{"a plain create", sandbox.CreateRequest{Shape: python}, true},
			{"a queued create", sandbox.CreateRequest{Shape: python, Async: true}, false},
			{"a create under an Idempotency-Key", sandbox.CreateRequest{Shape: python, IdempotencyKey: "k-1"}, false},
			{"a create with a fixed id", sandbox.CreateRequest{Shape: python, ID: "0f0e0d0c-0b0a-4908-8706-050403020100"}, false},
		} {
			p, err := b.svc.Plan(acme(), tc.req)
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if p.Alongside() != tc.want {
				t.Errorf("%s: Alongside() = %v, want %v", tc.name, p.Alongside(), tc.want)
			}
			p.Release()
		}
		v.setTargets(pool.Fixed(python, 1))
		for v.Cold(python) {
			<-v.changes
		}
		p, err := b.svc.Plan(acme(), sandbox.CreateRequest{Shape: python})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Release()
		if p.Alongside() {
			t.Fatal("a create of a shape the pool makes slots of may take its place alongside")
		}
	})
}
