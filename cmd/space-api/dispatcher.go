package main

import (
	"context"
	"fmt"

	"github.com/space-sandbox/space/internal/dispatcher"
)

// dispatcher makes the queued-operation dispatcher (DESIGN.md §6) on m's database and
// starts its River workers (SPACE_DISPATCHER_WORKERS; with 0 this replica accepts
// Prefer: respond-async requests and other replicas run them). Close stops it
// gracefully: no new operation is taken and running ones finish within the shutdown
// timeout; what is still queued stays queued for the next replica. It needs
// m.Sandboxes and m.Resolver.
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
		Registerer:        m.Registry,
		Logger:            m.Logger.With("component", "dispatcher"),
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
