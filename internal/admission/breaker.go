package admission

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sony/gobreaker/v2"

	"github.com/space-sandbox/space/internal/metric"
)

// Defaults of BreakerOptions.
const (
	// breakerFailures is how many Redis calls in a row must fail or time out
	// before the breaker opens.
	breakerFailures = 3
	// breakerOpenFor is how long the breaker stays open before it lets one
	// probe through: one Redis timeout a second is what an outage then costs.
	breakerOpenFor = time.Second
)

// BreakerOptions configure a Breaker.
type BreakerOptions struct {
	// Failures in a row that open the breaker (default 3).
	Failures int
	// OpenFor is how long it stays open before a probe (default 1s).
	OpenFor    time.Duration
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// Breaker is the circuit breaker over one replica's Redis calls on the request path:
// the failed-authentication limiter, the concurrency leases and the admission script
// share it. Without it, each create during a Redis outage waits out one timeout per
// call, three in a row; once Redis has failed Failures times in a row the breaker
// opens, and every call fails at once with an error wrapping ErrUnavailable, so the
// failure mode (fail open: admit and count; fail closed: 503) applies without waiting.
// After OpenFor one call is let through as a probe: its success closes the breaker,
// its failure keeps it open for another OpenFor.
//
// It is github.com/sony/gobreaker, which is small, dependency-free and widely used:
// counting, the half-open probe and the state machine are easy to get subtly wrong.
// A call the caller itself abandoned (its context cancelled) counts neither way.
//
// While the breaker is closed and no failure has been seen since the last success,
// which is nearly all the time, a call passes with one atomic load and its success is
// not recorded: gobreaker's two mutex sections and clock reads per call would cost the
// decision path more than the rest of its client side. The first failure is handed to
// gobreaker, and the calls after it go through gobreaker until one succeeds with the
// breaker closed again; a success then could only have reset a count that is already
// zero, so nothing the breaker decides changes.
type Breaker struct {
	cb *gobreaker.CircuitBreaker[any]
	// healthy is true while the breaker is closed with no failure since the last
	// success: calls then skip gobreaker.
	healthy     atomic.Bool
	state       *prometheus.GaugeVec
	transitions *prometheus.CounterVec
}

// Breaker states, as the space_redis_circuit_breaker_state label names them.
var breakerStates = []gobreaker.State{gobreaker.StateClosed, gobreaker.StateHalfOpen, gobreaker.StateOpen}

func stateName(s gobreaker.State) string {
	switch s {
	case gobreaker.StateHalfOpen:
		return "half_open"
	case gobreaker.StateOpen:
		return "open"
	}
	return "closed"
}

// NewBreaker returns a closed Breaker.
func NewBreaker(opts BreakerOptions) *Breaker {
	if opts.Failures <= 0 {
		opts.Failures = breakerFailures
	}
	if opts.OpenFor <= 0 {
		opts.OpenFor = breakerOpenFor
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	b := &Breaker{
		state: metric.Register(opts.Registerer, prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "space_redis_circuit_breaker_state",
			Help: "1 for the state the Redis circuit breaker is in (closed, half_open, open), 0 for the others. Open: Redis calls on the request path fail at once and the admission failure mode applies.",
		}, []string{"state"})),
		transitions: metric.Register(opts.Registerer, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "space_redis_circuit_breaker_transitions_total",
			Help: "Changes of the Redis circuit breaker's state, by the state entered.",
		}, []string{"to"})),
	}
	for _, s := range breakerStates {
		b.transitions.WithLabelValues(stateName(s))
	}
	b.set(gobreaker.StateClosed)
	failures := uint32(opts.Failures)
	b.cb = gobreaker.NewCircuitBreaker[any](gobreaker.Settings{
		Name:        "redis",
		MaxRequests: 1,
		Timeout:     opts.OpenFor,
		ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= failures },
		IsExcluded:  excluded,
		OnStateChange: func(_ string, from, to gobreaker.State) {
			if to != gobreaker.StateClosed {
				b.healthy.Store(false)
			}
			b.set(to)
			b.transitions.WithLabelValues(stateName(to)).Inc()
			logger.Warn("redis circuit breaker", "from", stateName(from), "to", stateName(to))
		},
	})
	b.healthy.Store(true)
	return b
}

// excluded is a failure the breaker does not count: the caller abandoned the call.
func excluded(err error) bool { return errors.Is(err, context.Canceled) }

func (b *Breaker) set(to gobreaker.State) {
	for _, s := range breakerStates {
		v := 0.0
		if s == to {
			v = 1
		}
		b.state.WithLabelValues(stateName(s)).Set(v)
	}
}

// State is the breaker's state: "closed", "half_open" or "open".
func (b *Breaker) State() string { return stateName(b.cb.State()) }

// do runs fn through the breaker; a nil Breaker runs it directly. An open breaker
// answers gobreaker.ErrOpenState (or ErrTooManyRequests while a probe is out) at once.
func (b *Breaker) do(fn func() (any, error)) (any, error) {
	if b == nil {
		return fn()
	}
	if b.healthy.Load() {
		v, err := fn()
		if err != nil && !excluded(err) {
			b.healthy.Store(false)
			_, _ = b.cb.Execute(func() (any, error) { return nil, err })
		}
		return v, err
	}
	v, err := b.cb.Execute(fn)
	if err == nil && b.cb.State() == gobreaker.StateClosed && b.cb.Counts().ConsecutiveFailures == 0 {
		b.healthy.Store(true)
	}
	return v, err
}
