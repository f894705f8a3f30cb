package api

import (
	"context"
	"time"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/admission"
	"github.com/space-sandbox/space/internal/dispatcher"
	"github.com/space-sandbox/space/internal/flags"
	"github.com/space-sandbox/space/internal/sandbox"
)

// The domain the handlers call. They are interfaces so that the HTTP behaviour
// (statuses, problems, headers) is tested on fakes in this package as well as end to
// end; main wires the real ones, named on each.

// Callers resolves an authenticated client id into its budget key and limits
// (*flags.Resolver).
type Callers interface {
	Resolve(ctx context.Context, id space.ClientID) space.Caller
}

// Tiers is the tier table in force (*flags.Resolver).
type Tiers interface {
	Tiers(ctx context.Context) flags.TierTable
}

// Leases caps a budget key's requests in flight (*admission.ConcurrencyLimiter): a cap
// of 0 is none; over the cap is a *space.LimitError.
type Leases interface {
	Acquire(ctx context.Context, key space.ClientKey, cap int) (space.Lease, error)
	// Alongside reports whether a request may take its place alongside other work of
	// its own rather than before it, counting it until done is called once its
	// Acquire has returned (see admission.ConcurrencyLimiter.Alongside).
	Alongside(key space.ClientKey, cap int) (done func(), ok bool)
}

// Budgets reports a caller's activation buckets as admission would find them, taking
// nothing (*admission.Admitter).
type Budgets interface {
	Report(ctx context.Context, c space.Charge) (admission.Decision, admission.Enforcement, error)
}

// Sandboxes is the sandbox flow (*sandbox.Service).
type Sandboxes interface {
	// Plan validates a create to be queued; Create runs a synchronous one, taking its
	// concurrency place from places and returning it, to be given back once answered.
	Plan(caller space.Caller, req sandbox.CreateRequest) (sandbox.Plan, error)
	Create(ctx context.Context, caller space.Caller, req sandbox.CreateRequest, places sandbox.Places) (*space.Sandbox, space.Lease, error)
	Get(ctx context.Context, client space.ClientID, id string) (*space.Sandbox, error)
	List(ctx context.Context, client space.ClientID, limit int, pageToken string) (*sandbox.Page, error)
	Pause(ctx context.Context, caller space.Caller, id string) (*space.Sandbox, error)
	Keepalive(ctx context.Context, caller space.Caller, id string, timeout time.Duration) (*space.Sandbox, error)
	Restore(ctx context.Context, caller space.Caller, id string) (*space.Sandbox, error)
	Delete(ctx context.Context, client space.ClientID, id string) (teardown bool, err error)
	Owner(ctx context.Context, id string) (space.ClientID, error)
	Wake(ctx context.Context, owner space.Caller, id string) (*space.Sandbox, error)
	Costs() map[string]int
}

// Operations queues requests and reads queued operations (*dispatcher.Dispatcher).
type Operations interface {
	Enqueue(ctx context.Context, req dispatcher.Request) (*space.Operation, bool, error)
	Get(ctx context.Context, client space.ClientID, id string) (*space.Operation, error)
	GetAny(ctx context.Context, id string) (*space.Operation, error)
}
