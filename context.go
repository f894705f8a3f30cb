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
