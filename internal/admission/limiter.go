package admission

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/coalesce"
)

// LimiterOptions configures a Limiter.
type LimiterOptions struct {
	// Redis is required.
	Redis redis.UniversalClient
	// Prefix is required and names what is limited, e.g. "space:auth_failures": a
	// key k is the bucket "<prefix>:<k>".
	Prefix string
	// Rate is every key's bucket.
	Rate space.Rate
	// Timeout bounds each Redis call (required; SPACE_REDIS_TIMEOUT).
	Timeout time.Duration
	// Breaker, shared by a replica's Redis components, fails calls at once while Redis
	// is known to be down (see Breaker); nil calls Redis every time.
	Breaker *Breaker
	// PipelineAbove is how many of this component's scripts may be on their way to
	// Redis at once, each on its own, before the ones callers start wait and go
	// together when a round trip comes back (SPACE_REDIS_PIPELINE_ABOVE): one key's
	// as one batch script call, different keys' beside each other in one pipeline
	// (see coalescer; SPACE_REDIS_PIPELINE_ABOVE, whose default is
	// DefaultPipelineAbove, 8). 0, as that variable's 0, never coalesces: every script
	// is a call of its own and nothing waits (NewLimiter refuses a negative number).
	PipelineAbove int
}

// Limiter is one token bucket per key, on the Admitter's script with a single key: the
// same continuous refill from Redis TIME, a new bucket starting full, and a key that
// expires once its bucket is full again, so that many distinct keys (say, source
// addresses guessing API keys) cannot fill Redis. Redis failures are returned as
// errors wrapping ErrUnavailable: the caller chooses what they mean.
type Limiter struct {
	run    runner
	prefix string
	rate   space.Rate
	args   bucketArgs
	// peeks coalesces each key's Peeks (see Peek).
	peeks coalesce.Reads[string, peeked]
}

// peeked is a Peek's answer.
type peeked struct {
	allowed bool
	state   BucketState
}

// NewLimiter returns a Limiter, or an error naming the option that is wrong.
func NewLimiter(opts LimiterOptions) (*Limiter, error) {
	if opts.Redis == nil {
		return nil, errors.New("limiter: Redis is required")
	}
	if opts.Prefix == "" {
		return nil, errors.New("limiter: Prefix is required")
	}
	if err := opts.Rate.Validate(); err != nil {
		return nil, fmt.Errorf("limiter: rate: %w", err)
	}
	if err := checkTimeout("limiter", opts.Timeout); err != nil {
		return nil, err
	}
	if err := checkAbove("limiter", "PipelineAbove", opts.PipelineAbove); err != nil {
		return nil, err
	}
	return &Limiter{run: newRunner(opts.Redis, opts.Timeout, opts.Breaker, opts.PipelineAbove), prefix: opts.Prefix + ":", rate: opts.Rate, args: argsOf(opts.Rate)}, nil
}

// Allow takes one token from key's bucket if it holds one. state is the bucket after
// the decision; when not allowed, state.Refill is when a token will be there.
func (l *Limiter) Allow(ctx context.Context, key string) (allowed bool, state BucketState, err error) {
	allowed, state, err = l.decide(ctx, take, key)
	if err != nil {
		return false, state, fmt.Errorf("limiter allow: %w", err)
	}
	return allowed, state, nil
}

// Peek reports whether key's bucket holds a token now, without taking it or writing
// anything.
//
// One key's Peeks are coalesced (coalesce.Reads): while one is on its way to Redis,
// the Peeks of the key asked for meanwhile wait together for the next, which begins
// once that one is back, so each still reads what every take before it left. A
// source address sending thousands of requests a second (each of which Peeks its
// failures' bucket before its API key is looked up) then costs Redis one Peek at a
// time, not one a request.
func (l *Limiter) Peek(ctx context.Context, key string) (allowed bool, state BucketState, err error) {
	p, err := l.peeks.Do(ctx, key, func(ctx context.Context) (peeked, error) {
		allowed, state, err := l.decide(ctx, peek, key)
		return peeked{allowed, state}, err
	})
	if err != nil {
		if !errors.Is(err, ErrUnavailable) {
			err = unavailable(err) // its context ended while it waited
		}
		return false, BucketState{Rate: l.rate}, fmt.Errorf("limiter peek: %w", err)
	}
	return p.allowed, p.state, nil
}

func (l *Limiter) decide(ctx context.Context, cost, key string) (bool, BucketState, error) {
	allowed, states, _, _, err := l.run.decide(ctx, cost, []string{l.prefix + key}, l.args, "", "")
	if err != nil {
		return false, BucketState{Rate: l.rate}, unavailable(err)
	}
	state := states[0]
	state.Rate = l.rate
	return allowed, state, nil
}
