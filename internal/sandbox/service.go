// Package sandbox is the create/restore/pause/wake flow that the HTTP API and the
// dispatcher share (DESIGN.md §2). Its one rule is the order of the steps of an
// activation: live-sandbox cap, then the warm pool, then cold shape resolution, then
// the admission charge, then the cold start — so that a warm hit never costs budget and
// a request that cannot be served never spends a token.
package sandbox

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/pool"
	"github.com/space-sandbox/space/internal/substrate"
)

// Charger charges one activation to the cluster bucket and, when rate is not nil, to
// client's bucket, both or neither (internal/admission). A *space.LimitError means a
// bucket was empty and nothing was charged.
type Charger interface {
	Charge(ctx context.Context, client space.ClientKey, rate *space.Rate) error
}

// Refuser is a Charger that can also tell, without charging anything, that a charge
// would be refused now (internal/admission's Admitter.Refused). With it the Service
// answers a create of a client whose charges it has just seen refused without
// reserving and undoing a sandbox row first (see refuseEarly).
type Refuser interface {
	// Refuse returns the *space.LimitError that a Charge now would return, counted as
	// that Charge would count it; nil when the charge would not be refused or when it
	// cannot tell (a Redis error, shadow mode): the caller then charges as usual.
	Refuse(ctx context.Context, client space.ClientKey, rate *space.Rate) *space.LimitError
}

// Options configure a Service.
type Options struct {
	DB        *pgxpool.Pool
	Pool      *pool.Pool
	Substrate substrate.Substrate
	Charger   Charger
	Catalog   Catalog
	// OnClaim is called after a warm slot is claimed, e.g. to kick the replenisher.
	OnClaim    func()
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// Service runs the flow.
type Service struct {
	opts   Options
	logger *slog.Logger
	starts *prometheus.CounterVec

	// refused remembers, per client key, until when this replica knows that the
	// client's charges fail: the refill time its last refused charge reported, counted
	// from before that charge was sent. It only chooses the path of the next create
	// (refuseEarly); the decision itself is always Redis's. Keys are bounded client
	// keys, so the map is bounded by the allowlist.
	refused sync.Map // space.ClientKey -> *atomic.Int64, nanoseconds since epoch
	epoch   time.Time
}

// New returns a Service.
func New(opts Options) *Service {
	if opts.OnClaim == nil {
		opts.OnClaim = func() {}
	}
	s := &Service{opts: opts, logger: opts.Logger, epoch: time.Now()}
	if s.logger == nil {
		s.logger = slog.New(slog.DiscardHandler)
	}
	s.starts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "space_sandbox_activations_total",
		Help: "Sandbox activations by kind (create, restore) and outcome (warm, cold, failed, rejected, unprocessable).",
	}, []string{"kind", "outcome"})
	if opts.Registerer != nil {
		opts.Registerer.MustRegister(s.starts)
	}
	return s
}

func activateVerb(kind string) string {
	if kind == "create" {
		return "start"
	}
	return kind
}

func (s *Service) count(kind string, err error) {
	switch space.ErrorCode(err) {
	case space.ELIMITED:
		s.starts.WithLabelValues(kind, "rejected").Inc()
	case space.EUNPROCESSABLE:
		s.starts.WithLabelValues(kind, "unprocessable").Inc()
	}
}
