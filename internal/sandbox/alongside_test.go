package sandbox_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/pool"
	"github.com/space-sandbox/space/internal/sandbox"
	"github.com/space-sandbox/space/internal/substrate"
)

var overCap = &space.LimitError{Bucket: space.BucketClientConcurrency, Client: "acme", Cap: 2, RetryAfter: time.Second}

// places is a concurrency cap the test decides: Acquire refuses with refuse when set,
// Alongside allows when alongside is true; every call is an event (asked, when set, is
// told each Acquire as it begins), and the places held are counted until given back.
type places struct {
	refuse    error
	alongside bool
	events    *events
	asked     func()
	held      atomic.Int64
	acquired  atomic.Int64
	mu        sync.Mutex
	along     int // Alongside's counts not yet done
	asks      int // Alongside's calls
}

func (p *places) Acquire(context.Context, space.ClientKey, int) (space.Lease, error) {
	p.acquired.Add(1)
	if p.events != nil {
		p.events.add("place")
	}
	if p.asked != nil {
		p.asked()
	}
	if p.refuse != nil {
		return space.Lease{}, p.refuse
	}
	p.held.Add(1)
	var once sync.Once
	return space.NewLease(func() { once.Do(func() { p.held.Add(-1) }) }, true), nil
}

// counts are Alongside's calls, and its counts not yet done.
func (p *places) counts() (asks, along int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.asks, p.along
}

func (p *places) Alongside(space.ClientKey, int) (func(), bool) {
	p.mu.Lock()
	p.asks++
	p.mu.Unlock()
	if !p.alongside {
		return nil, false
	}
	p.mu.Lock()
	p.along++
	p.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			p.mu.Lock()
			p.along--
			p.mu.Unlock()
		})
	}, true
}

// A create's concurrency place, taken before its booking or alongside it
// (Service.Create, takePlace): on real Postgres and the simulated substrate.
func TestCreatePlace(t *testing.T) {
	t.Parallel()

	// alongside is a setup whose pool view knows python cold, and places that let
	// acme go alongside, recording whether acme's row existed when its place was asked.
	alongside := func(t *testing.T, refuse error) (*bundle, *places, *int) {
		t.Helper()
		b, v := setupRefusing(t)
		v.waitCold(python)
		rows := -1
		pl := &places{refuse: refuse, alongside: true, events: b.events}
		pl.asked = func() { rows = b.count(t, "client = 'acme' AND state = 'starting'") }
		return b, pl, &rows
	}

	t.Run("a plain create the pool cannot serve warm takes its place alongside its booking, before the charge", func(t *testing.T) {
		t.Parallel()
		b, pl, _ := alongside(t, nil)
		sb, lease, err := b.svc.Create(b.ctx, acme(), sandbox.CreateRequest{Shape: python}, pl)
		if err != nil || sb.State != space.StateRunning {
			t.Fatalf("create = %+v, %v", sb, err)
		}
		if got := b.events.list(); !equal(got, []string{"place", "charge:acme", "start_cold"}) {
			t.Fatalf("events = %v, want the place, then the charge and the cold start", got)
		}
		if asks, _ := pl.counts(); asks != 1 {
			t.Fatalf("Alongside asked %d times, want once", asks)
		}
		waitFor(t, "Alongside's count done once the place is taken", func() bool { _, along := pl.counts(); return along == 0 })
		if n := pl.held.Load(); n != 1 {
			t.Fatalf("%d places held after the create, want its own, handed to its caller", n)
		}
		lease.Release()
		if n := pl.held.Load(); n != 0 {
			t.Fatalf("%d places held once given back", n)
		}
	})

	t.Run("a place refused alongside takes the booking back, charges nothing and starts nothing", func(t *testing.T) {
		t.Parallel()
		b, pl, rows := alongside(t, overCap)
		_, lease, err := b.svc.Create(b.ctx, acme(), sandbox.CreateRequest{Shape: python}, pl)
		lease.Release()
		if !errors.Is(err, overCap) {
			t.Fatalf("err = %v, want the place's refusal", err)
		}
		if got := b.events.list(); !equal(got, []string{"place"}) {
			t.Fatalf("events = %v, want nothing charged or started", got)
		}
		if *rows != 0 && *rows != 1 {
			t.Fatalf("%d rows when the place was asked", *rows)
		}
		if n := b.count(t, "true"); n != 0 {
			t.Fatalf("%d sandboxes left behind by a create refused its place", n)
		}
	})

	t.Run("a slot claimed beside a refused place is discarded, not adopted", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.addReadySlots(t, python, 1)
		pl := &places{refuse: overCap, events: b.events}
		if _, _, err := b.svc.Create(b.ctx, acme(), sandbox.CreateRequest{Shape: python}, pl); !errors.Is(err, overCap) {
			t.Fatalf("err = %v, want the place's refusal", err)
		}
		if got := b.events.list(); !equal(got, []string{"place"}) {
			t.Fatalf("events = %v, want nothing adopted or charged", got)
		}
		var slots int
		if err := b.db.QueryRow(b.ctx, "SELECT count(*) FROM pool_slots WHERE state = 'ready'").Scan(&slots); err != nil {
			t.Fatal(err)
		}
		if slots != 1 || b.count(t, "true") != 0 {
			t.Fatalf("%d ready slots, %d sandboxes; want the slot untouched and no sandbox: the place is taken before the booking here", slots, b.count(t, "true"))
		}
	})

	t.Run("only a plain create of a shape the pool view knows cold goes alongside; any other takes its place first", func(t *testing.T) {
		t.Parallel()
		b, v := setupRefusing(t)
		v.waitCold(python)
		for _, tc := range []struct {
			name string
			req  sandbox.CreateRequest
			want int // Alongside's calls
		}{
			{"a plain create", sandbox.CreateRequest{Shape: python}, 1},
			{"a create under an Idempotency-Key", sandbox.CreateRequest{Shape: python, IdempotencyKey: "k-1"}, 0},
			{"a create with a fixed id", sandbox.CreateRequest{Shape: python, ID: "0f0e0d0c-0b0a-4908-8706-050403020100"}, 0},
		} {
			rows := -1
			pl := &places{alongside: true}
			pl.asked = func() { rows = b.count(t, "state = 'starting'") }
			_, lease, err := b.svc.Create(b.ctx, acme(), tc.req, pl)
			lease.Release()
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if asks, _ := pl.counts(); asks != tc.want {
				t.Errorf("%s: Alongside asked %d times, want %d", tc.name, asks, tc.want)
			}
			if tc.want == 0 && rows != 0 {
				t.Errorf("%s: its place was asked with %d rows booked, want before its booking", tc.name, rows)
			}
		}
		v.setTargets(pool.Fixed(python, 1))
		for v.Cold(python) {
			<-v.changes
		}
		pl := &places{alongside: true}
		_, lease, _ := b.svc.Create(b.ctx, acme(), sandbox.CreateRequest{Shape: python}, pl)
		lease.Release()
		if asks, _ := pl.counts(); asks != 0 {
			t.Fatal("a create of a shape the pool makes slots of asked to go alongside")
		}
	})

	t.Run("a create whose activation panics gives its place back", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.setFail(func(c substrate.Call) error {
			if c.Op == substrate.OpStartCold {
				panic("a substrate bug")
			}
			return nil
		})
		pl := &places{}
		func() {
			defer func() { _ = recover() }()
			_, _, _ = b.svc.Create(b.ctx, acme(), sandbox.CreateRequest{Shape: python}, pl)
			t.Error("Create returned; want the substrate's panic")
		}()
		if n := pl.held.Load(); n != 0 {
			t.Fatalf("%d places held after a create panicked, want it given back", n)
		}
	})
}
