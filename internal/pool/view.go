package pool

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/space-sandbox/space"
)

// readyChannel is the Postgres channel a slot becoming ready is notified on (migration
// 00005: a trigger on pool_slots, whatever wrote it).
const readyChannel = "space_pool_ready"

// DefaultViewResync is how often a View re-reads the ready shapes and the targets.
const DefaultViewResync = time.Second

// staleAfter is how many resyncs a View may miss (a slow moment, a busy Postgres)
// before it no longer trusts itself and Cold answers false: the notifications keep it
// current meanwhile, the resync only backs them up.
const staleAfter = 5

// ViewOptions configure a View.
type ViewOptions struct {
	DB *pgxpool.Pool
	// Targets returns the warm pool targets, as the replenisher reads them.
	Targets func(ctx context.Context) ([]Target, error)
	// Resync is how often the ready shapes and the targets are re-read (default
	// DefaultViewResync): a safety net under the notifications, and what clears a shape
	// whose last ready slot was claimed.
	Resync time.Duration
	Logger *slog.Logger
	// OnChange, when set, is called after every change the view applies (a
	// notification or a resync): tests wait on it instead of sleeping.
	OnChange func()
}

// View is one replica's knowledge, kept without a query per request, of the shapes a
// create could find a ready warm slot of: a shape with a ready slot, one a pool target
// makes slots of, or one it cannot tell about is "warm"; only a shape known to have
// none is Cold. It listens on Postgres (LISTEN space_pool_ready, notified by a trigger
// whenever a slot becomes ready) and re-reads the ready shapes and the targets every
// Resync.
//
// It exists so that a create of a client known to be over its rate can be refused
// without asking Postgres or Redis, and never while a slot of its shape is ready: a
// warm hit costs no budget, so it must not be refused for want of one. A targeted shape
// is never Cold, because its slots come and go; the notification closes the gap for a
// slot of an untargeted shape (one left when its target was removed, until the
// replenisher retires it).
type View struct {
	opts      ViewOptions
	listening atomic.Bool

	mu       sync.RWMutex
	ready    map[space.Shape]bool
	targeted map[space.Shape]bool
	synced   time.Time
}

// NewView returns a View that knows nothing until Run has synced it.
func NewView(opts ViewOptions) *View {
	if opts.Resync <= 0 {
		opts.Resync = DefaultViewResync
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &View{opts: opts}
}

// Cold reports whether a create of shape would miss the pool now: the view is
// listening and current, no ready slot of shape is known and no target makes any.
// When the view cannot tell (not synced yet, its connection lost, a resync overdue)
// it is false, and the caller asks Postgres as it would without a view.
func (v *View) Cold(shape space.Shape) bool {
	if !v.listening.Load() {
		return false
	}
	v.mu.RLock()
	defer v.mu.RUnlock()
	return time.Since(v.synced) < staleAfter*v.opts.Resync && !v.ready[shape] && !v.targeted[shape]
}

// Run listens and resyncs until ctx ends, reconnecting after a lost connection.
func (v *View) Run(ctx context.Context) {
	for ctx.Err() == nil {
		err := v.listen(ctx)
		v.listening.Store(false)
		if ctx.Err() != nil {
			return
		}
		v.opts.Logger.WarnContext(ctx, "warm pool view: listener lost; refusals ask Postgres until it is back", "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(v.opts.Resync):
		}
	}
}

// listen holds one connection listening on readyChannel, resyncing every Resync,
// until an error.
func (v *View) listen(ctx context.Context) error {
	conn, err := pgx.ConnectConfig(ctx, v.opts.DB.Config().ConnConfig.Copy())
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+readyChannel); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	for {
		// Listening first, then reading: a slot that becomes ready after the read is
		// notified, one before it is read.
		if err := v.resync(ctx); err != nil {
			return err
		}
		v.listening.Store(true)
		deadline := time.Now().Add(v.opts.Resync)
		for {
			wctx, cancel := context.WithDeadline(ctx, deadline)
			n, err := conn.WaitForNotification(wctx)
			cancel()
			if err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				if time.Now().Before(deadline) {
					return fmt.Errorf("wait for notifications: %w", err)
				}
				break // time to resync
			}
			if shape, ok := parseShape(n.Payload); ok {
				v.mu.Lock()
				v.ready[shape] = true
				v.mu.Unlock()
				v.changed()
			}
		}
	}
}

// resync re-reads the ready shapes and the targets.
func (v *View) resync(ctx context.Context) error {
	rows, err := v.opts.DB.Query(ctx, `SELECT DISTINCT template, cpu_millis, memory_mib, disk_gib FROM pool_slots WHERE state = 'ready'`)
	if err != nil {
		return fmt.Errorf("read ready shapes: %w", err)
	}
	ready := map[space.Shape]bool{}
	for rows.Next() {
		var s space.Shape
		if err := rows.Scan(&s.Template, &s.CPUMillis, &s.MemoryMiB, &s.DiskGiB); err != nil {
			rows.Close()
			return fmt.Errorf("read ready shapes: %w", err)
		}
		ready[s] = true
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read ready shapes: %w", err)
	}
	targets, err := v.opts.Targets(ctx)
	if err != nil {
		return fmt.Errorf("read pool targets: %w", err)
	}
	targeted := map[space.Shape]bool{}
	for _, t := range targets {
		if t.Max > 0 {
			targeted[t.Shape] = true
		}
	}
	v.mu.Lock()
	v.ready, v.targeted, v.synced = ready, targeted, time.Now()
	v.mu.Unlock()
	v.changed()
	return nil
}

func (v *View) changed() {
	if v.opts.OnChange != nil {
		v.opts.OnChange()
	}
}

// parseShape reads a notification's payload, template/cpu/memory/disk.
func parseShape(payload string) (space.Shape, bool) {
	parts := strings.Split(payload, "/")
	if len(parts) != 4 {
		return space.Shape{}, false
	}
	var s space.Shape
	var err error
	s.Template = parts[0]
	if s.CPUMillis, err = strconv.Atoi(parts[1]); err != nil {
		return space.Shape{}, false
	}
	if s.MemoryMiB, err = strconv.Atoi(parts[2]); err != nil {
		return space.Shape{}, false
	}
	if s.DiskGiB, err = strconv.Atoi(parts[3]); err != nil {
		return space.Shape{}, false
	}
	return s, true
}
