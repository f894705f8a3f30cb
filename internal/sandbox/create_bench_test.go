package sandbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/pool"
	"github.com/space-sandbox/space/internal/sandbox"
	"github.com/space-sandbox/space/internal/substrate"
	"github.com/space-sandbox/space/internal/testenv"
)

// benchCharger admits everything, or refuses everything as an empty client bucket
// would; with known set it also knows the refusal ahead (Refused), so that the
// Service takes the early refusal.
type benchCharger struct{ refuse, known bool }

func (c benchCharger) Charge(_ context.Context, ch space.Charge) (space.Charged, error) {
	client, rate := ch.Key, ch.Rate
	if c.refuse {
		return space.Charged{}, &space.LimitError{Bucket: space.BucketClientActivation, Client: client, RetryAfter: time.Hour, Limit: rate}
	}
	return space.Charged{}, nil
}

func (c benchCharger) CachedRefusal(ch space.Charge) (space.Hold, *space.LimitError) {
	client, rate := ch.Key, ch.Rate
	if !c.known {
		return nil, nil
	}
	return nil, &space.LimitError{Bucket: space.BucketClientActivation, Client: client, RetryAfter: time.Hour, Limit: rate}
}

// BenchmarkCreate is the flow of a create on the services' Postgres, the charge
// stubbed (no Redis) and the simulated substrate instant, so that ns/op is the
// flow's own Postgres round trips and allocs/op its own allocations:
//
//   - cold: a cold admit of a client with no live cap;
//   - rejected: a refused charge by the usual path: the row booked under the
//     client's lock (live cap 50) and deleted again;
//   - rejected_early: the same refusal known ahead and answered by the early refusal
//     (Service.Refused): no Postgres, nothing booked.
func BenchmarkCreate(b *testing.B) {
	shape := space.Shape{Template: "python-3.12", CPUMillis: 500, MemoryMiB: 1024, DiskGiB: 5}
	templates := substrate.Templates{"python-3.12": {Name: "python-3.12", Image: "python:3.12-slim"}}
	for _, c := range []struct {
		name    string
		charger space.Charger
		caller  space.Caller
		ok      bool
	}{
		{"cold", benchCharger{}, space.Caller{ID: "acme", Key: "acme"}, true},
		{"rejected", benchCharger{refuse: true}, space.Caller{ID: "acme", Key: "acme", LiveSandboxes: 50}, false},
		{"rejected_early", benchCharger{refuse: true, known: true}, space.Caller{ID: "acme", Key: "acme", LiveSandboxes: 50}, false},
	} {
		b.Run(c.name, func(b *testing.B) {
			db := testenv.DB(b)
			ctx := testenv.Context(b)
			synced := make(chan struct{}, 1)
			view := pool.NewView(pool.ViewOptions{DB: db,
				Targets: func(context.Context) ([]pool.Target, error) { return nil, nil },
				OnChange: func() {
					select {
					case synced <- struct{}{}:
					default:
					}
				}})
			go view.Run(ctx)
			<-synced
			sim := substrate.NewSimulated(substrate.SimulatedOptions{})
			svc := sandbox.New(sandbox.Options{
				DB: db, Pool: pool.New(pool.Options{DB: db, Substrate: sim}), Substrate: sim, Charger: c.charger, View: view,
				Catalog: sandbox.Catalog{Templates: templates, Max: space.Shape{CPUMillis: 8000, MemoryMiB: 16384, DiskGiB: 100}},
			})
			req := sandbox.CreateRequest{Shape: shape}
			b.ReportAllocs()
			for b.Loop() {
				_, err := create(svc, ctx, c.caller, req)
				if (err == nil) != c.ok {
					b.Fatalf("Create = %v, want ok %v", err, c.ok)
				}
			}
		})
	}
}
