package space

import "context"

type clientContextKey struct{}

// NewContextWithClient returns ctx carrying the caller's bounded client key.
func NewContextWithClient(ctx context.Context, key ClientKey) context.Context {
	return context.WithValue(ctx, clientContextKey{}, key)
}

// ClientFromContext returns the client key carried by ctx, or Unknown when there is
// none: an unidentified caller is never anyone in particular.
func ClientFromContext(ctx context.Context) ClientKey {
	if key, ok := ctx.Value(clientContextKey{}).(ClientKey); ok && key != "" {
		return key
	}
	return Unknown
}
