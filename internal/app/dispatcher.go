package app

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/space-sandbox/space/internal/api"
	"github.com/space-sandbox/space/internal/dispatcher"
	"riverqueue.com/riverui"
)

// dispatcher makes the queued-operation dispatcher (docs/dispatcher.md) on m's database and
// starts its River workers (SPACE_DISPATCHER_WORKERS; with 0 this replica accepts
// Prefer: respond-async requests and other replicas run them). Close stops it
// gracefully: no new operation is taken and running ones finish within the shutdown
// timeout; what is still queued stays queued for the next replica. It needs
// m.Sandboxes and m.Resolver.
// jobSlack is added to the substrate's timeout for River's job timeout: the reads and
// writes of one run around its substrate calls, each bounded by 10s.
const jobSlack = 20 * time.Second

// rescueSlack is how long after its job timeout a run is taken as abandoned by a dead
// replica: a live replica's run has returned by then.
const rescueSlack = 10 * time.Second

// jobTimeout is SPACE_DISPATCHER_JOB_TIMEOUT, or the substrate's timeout plus jobSlack.
func (m *Main) jobTimeout() time.Duration {
	if d := m.Config.Dispatcher.JobTimeout; d > 0 {
		return d
	}
	return m.Substrate.Timeout() + jobSlack
}

func (m *Main) dispatcher(ctx context.Context) (*dispatcher.Dispatcher, error) {
	cfg := m.Config.Dispatcher
	d, err := dispatcher.New(dispatcher.Options{
		DB:                m.DB,
		Sandboxes:         m.Sandboxes,
		Callers:           m.Resolver,
		Workers:           cfg.Workers,
		AdmissionDeadline: cfg.AdmissionDeadline,
		MaxSnooze:         cfg.MaxSnooze,
		MaxAttempts:       cfg.MaxAttempts,
		OwnerLanes:        cfg.OwnerLanes,
		IdempotencyTTL:    m.Config.IdempotencyKeyTTL,
		// A run is the flow's substrate calls (bounded by the substrate's own timeout)
		// and the writes around them: River never cuts it short, and rescues a dead
		// replica's run soon after it could have finished.
		JobTimeout:  m.jobTimeout(),
		RescueAfter: m.jobTimeout() + rescueSlack,
		Registerer:  m.Registry,
		BudgetKeys:  m.Config.MetricsBudgetKeys,
		Logger:      m.Logger.With("component", "dispatcher"),
	})
	if err != nil {
		return nil, err
	}
	if err := d.Start(ctx); err != nil {
		return nil, fmt.Errorf("SPACE_DISPATCHER_WORKERS=%d: %w", cfg.Workers, err)
	}
	m.onClose(d.Stop)
	return d, nil
}

// riverUI returns River UI over d's River client, started, and stopped on Close.
func (m *Main) riverUI(d *dispatcher.Dispatcher) (http.Handler, error) {
	h, err := riverui.NewHandler(&riverui.HandlerOpts{
		Endpoints: riverui.NewEndpoints(d.River(), nil),
		Logger:    m.Logger.With("component", "riverui"),
		Prefix:    api.RiverUIPath,
	})
	if err != nil {
		return nil, fmt.Errorf("SPACE_RIVER_UI: %w", err)
	}
	// Its caches and background queries live as long as the replica, not as long as
	// the start-up context.
	ctx, cancel := context.WithCancel(context.Background())
	if err := h.Start(ctx); err != nil {
		cancel()
		return nil, fmt.Errorf("SPACE_RIVER_UI: start: %w", err)
	}
	m.onClose(func(context.Context) error { cancel(); return nil })
	return h, nil
}
