// Command peer-chi-redis-rate is the bench's peer for refused creates: a minimal chi
// server that decodes the create body and asks go-redis/redis_rate v10 (one EVALSHA,
// Allow with a per-client limit), answering 429 when refused. See package peer.
//
//	peer-chi-redis-rate -addr 127.0.0.1:8081 -redis 127.0.0.1:6379 [-rate 1 -burst 1 -period 1000h]
//	    [-limit client:rate:burst:period ...]
//
// The defaults are a bucket of 1 that refills once in 1000 hours: space-api's client
// rate of 0 with burst 1, which redis_rate (whose rate is a whole number of events per
// period) cannot write as 0. Each -limit gives one client a limit of its own, as
// space-api's flags give a client its rate (the quiet neighbour's peer column).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/space-sandbox/space/bench/peer"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8081", "listen address")
	redisAddr := flag.String("redis", "127.0.0.1:6379", "Redis address")
	rate := flag.Int("rate", 1, "events per period")
	burst := flag.Int("burst", 1, "bucket size")
	period := flag.Duration("period", 1000*time.Hour, "the period of -rate")
	timeout := flag.Duration("redis-timeout", 100*time.Millisecond, "Redis read and write timeout (space-api's SPACE_REDIS_TIMEOUT default)")
	limits := map[string]redis_rate.Limit{}
	flag.Func("limit", "client:rate:burst:period, a client's own limit (repeatable)", func(v string) error {
		f := strings.Split(v, ":")
		if len(f) != 4 {
			return fmt.Errorf("%q: want client:rate:burst:period", v)
		}
		rate, err := strconv.Atoi(f[1])
		if err != nil {
			return fmt.Errorf("%q: rate: %w", v, err)
		}
		burst, err := strconv.Atoi(f[2])
		if err != nil {
			return fmt.Errorf("%q: burst: %w", v, err)
		}
		period, err := time.ParseDuration(f[3])
		if err != nil {
			return fmt.Errorf("%q: period: %w", v, err)
		}
		limits[f[0]] = redis_rate.Limit{Rate: rate, Burst: burst, Period: period}
		return nil
	})
	flag.Parse()

	// Built as space-api builds its client: per-call deadlines from the context,
	// not a goroutine raced against each call.
	rdb := redis.NewClient(&redis.Options{Addr: *redisAddr, DialTimeout: time.Second, ReadTimeout: *timeout,
		WriteTimeout: *timeout, ContextTimeoutEnabled: true})
	defer rdb.Close()
	limiter := redis_rate.NewLimiter(rdb)
	limit := redis_rate.Limit{Rate: *rate, Burst: *burst, Period: *period}
	decide := func(ctx context.Context, client string) (peer.Decision, error) {
		l, ok := limits[client]
		if !ok {
			l = limit
		}
		res, err := limiter.Allow(ctx, client, l)
		if err != nil {
			return peer.Decision{}, fmt.Errorf("redis_rate: %w", err)
		}
		return peer.Decision{Allowed: res.Allowed > 0, RetryAfter: res.RetryAfter}, nil
	}
	if err := peer.Serve(*addr, peer.Handler(decide)); err != nil {
		fmt.Fprintln(os.Stderr, "peer-chi-redis-rate:", err)
		os.Exit(1)
	}
}
