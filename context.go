package space

import "context"

type callerContextKey struct{}

// NewContext returns ctx carrying caller: the one place a request's or a job's
// resolved identity and limits travel, set once by whoever resolved them (the API's
// identity middleware, a dispatcher worker, an internal wake).
func NewContext(ctx context.Context, caller Caller) context.Context {
	return context.WithValue(ctx, callerContextKey{}, caller)
}

// CallerFromContext returns the caller carried by ctx and true, or the zero Caller and
// false when there is none: code that needs a caller must not invent one.
func CallerFromContext(ctx context.Context) (Caller, bool) {
	c, ok := ctx.Value(callerContextKey{}).(Caller)
	return c, ok
}

type idleContextKey struct{}

// Idler is what work on a context calls, through Idle, when it is about to wait on
// something that costs the replica nothing while it waits (see WithIdle).
type Idler interface {
	Idle()
}

// IdleFunc is a function as an Idler.
type IdleFunc func()

// Idle calls f.
func (f IdleFunc) Idle() { f() }

// WithIdle returns ctx carrying idle: what work on ctx calls, through Idle, when it is
// about to wait on something that costs the replica nothing while it waits (a
// sandbox's start on the substrate: a Pod becoming ready takes seconds of the API
// server's and the kubelet's time, none of the replica's CPU or Postgres connections).
// The API's overload gate puts there the release of the request's seat, so that the
// seats (SPACE_MAX_IN_FLIGHT) bound the work a replica does at once, not the starts it
// waits on: a seat held through a 300 ms start would cap a replica of 32 seats at 107
// cold creates a second, whatever its CPU. (The sandbox service calls Idle once a start
// has run 10 ms: one that returns sooner is work-like, and keeps its seat.) An Idler,
// not a func: a pointer the caller already holds goes into the context as it is, where
// a method value would be an allocation of its own at every create.
func WithIdle(ctx context.Context, idle Idler) context.Context {
	return context.WithValue(ctx, idleContextKey{}, idle)
}

// Idle calls the Idler WithIdle put in ctx, if any. It may be called more than once:
// the Idler must do its part once.
func Idle(ctx context.Context) {
	if idle, ok := ctx.Value(idleContextKey{}).(Idler); ok {
		idle.Idle()
	}
}
