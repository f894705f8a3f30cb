// Package sandbox is the create/restore/pause/wake flow that the HTTP API and the
// dispatcher share (docs/design.md, "The create path"). Its one rule is the order of
// the steps: a create is validated and its shape resolved before any limit is looked
// at, then the live-sandbox cap, the warm pool, the admission charge and the cold
// start, so that a request that cannot be served never spends a token and a warm hit
// never costs budget.
//
// create.go is the create flow from its request to its activation, activate.go the
// activation a create and a restore share, sandboxes.go the plain reads and changes,
// and reconcile.go what settles the states a crash or an outage leaves.
package sandbox

import (
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/pool"
	"github.com/space-sandbox/space/internal/store"
	"github.com/space-sandbox/space/internal/substrate"
)

// Options configure a Service.
type Options struct {
	DB        *pgxpool.Pool
	Pool      *pool.Pool
	Substrate substrate.Substrate
	Charger   space.Charger
	Catalog   Catalog
	// View, when set, tells which shapes a create would miss the pool for without a
	// query, for a refusal known from memory (Plan); nil refuses nothing early.
	View *pool.View
	// IdempotencyTTL is how long an Idempotency-Key on a synchronous create names it
	// (SPACE_IDEMPOTENCY_KEY_TTL, 24h by default). Required for a create with a key:
	// idempotency.Claim refuses a zero one.
	IdempotencyTTL time.Duration
	// OnClaim is called after a warm slot is claimed, e.g. to kick the replenisher.
	OnClaim func()
	// OutcomeWait bounds how long an activation sends again the write that records
	// its sandbox running when Postgres went away after the write was sent, so that
	// its outcome is unknown (it may have committed with its reply lost): 10s by
	// default. Past it the caller gets a 503, and a create nobody can claim is kept
	// from being left answered (docs/design.md, "Unanswered creates").
	OutcomeWait time.Duration
	// Now is the clock activations are timed with (default time.Now).
	Now        func() time.Time
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// Service runs the flow.
type Service struct {
	opts    Options
	db      *store.DB
	logger  *slog.Logger
	metrics *metrics
	// liveCaps refuses the activations of a key found at its live cap without a
	// booking while a count still finds it there (livecap.go).
	liveCaps *liveCaps
}

// New returns a Service.
func New(opts Options) *Service {
	if opts.OnClaim == nil {
		opts.OnClaim = func() {}
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.OutcomeWait <= 0 {
		opts.OutcomeWait = defaultOutcomeWait
	}
	s := &Service{opts: opts, db: store.Wrap(opts.DB), logger: opts.Logger, metrics: newMetrics(opts.Registerer)}
	s.liveCaps = newLiveCaps(s.db, opts.Now, opts.Registerer)
	if s.logger == nil {
		s.logger = slog.New(slog.DiscardHandler)
	}
	return s
}

// Costs returns the activation cost of every template in force, by name: what one
// activation takes from each activation bucket.
func (s *Service) Costs() map[string]int {
	ts := s.opts.Catalog.Templates.Current()
	out := make(map[string]int, len(ts))
	for name, t := range ts {
		out[name] = t.ActivationCost()
	}
	return out
}
