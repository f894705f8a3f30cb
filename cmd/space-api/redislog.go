package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/redis/go-redis/v9"
)

// go-redis logs dial failures through a package-level logger that writes plain text to
// stderr; route it into the JSON log at debug level instead: a Redis outage is reported
// by /readyz and the admission error counters, not by a line per dial.
func init() { redis.SetLogger(redisLogger{}) }

type redisLogger struct{}

func (redisLogger) Printf(ctx context.Context, format string, v ...any) {
	slog.DebugContext(ctx, "redis client", "msg", fmt.Sprintf(format, v...))
}
