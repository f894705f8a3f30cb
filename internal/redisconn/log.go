package redisconn

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/redis/go-redis/v9"
)

// go-redis logs dial failures through a package-level logger that writes plain text to
// stderr; route it into the JSON log at debug level instead: a Redis outage is reported
// by /readyz and the admission error counters, not by a line per dial. Set at init, so
// that it holds for every client of the process that imports this package, the
// replica's and any other, from the first dial.
func init() { redis.SetLogger(goRedisLogger{}) }

type goRedisLogger struct{}

func (goRedisLogger) Printf(ctx context.Context, format string, v ...any) {
	slog.DebugContext(ctx, "redis client", "msg", fmt.Sprintf(format, v...))
}
