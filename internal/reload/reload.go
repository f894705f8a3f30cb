// Package reload keeps a configuration file in service while it changes: read once at
// start (a bad file then is a configuration error), polled by content hash afterwards,
// swapped atomically when a new content parses, and kept as it was when the file goes
// bad or missing (logged and counted), so that a bad edit never takes a replica down.
// The flags file and the templates file are both served this way.
package reload

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/space-sandbox/space/internal/metric"
)

// Options configure a File.
type Options[T any] struct {
	// Path is the file, read through any symlink each time: an atomic rename and a
	// Kubernetes ConfigMap update (the ..data symlink swap) both show as a new content.
	Path string
	// What names the file in logs and errors, e.g. "flags file".
	What string
	// Parse turns a content into what is served; an error keeps the last good one.
	Parse func(data []byte) (T, error)
	// Metric is the series name stem: <stem>_reloads_total{result},
	// <stem>_last_reload_successful and <stem>_last_reload_success_timestamp_seconds,
	// e.g. "space_flags".
	Metric     string
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// Result says what one check found.
type Result struct {
	// Unchanged is true when the file is what the last check saw (nothing reloaded,
	// nothing logged, nothing counted).
	Unchanged bool
	// Err is why the file could not be used; the last good content stays in service.
	Err error
	// Swapped is true when a new good content replaced the one in service.
	Swapped bool
	// Hash is the hex SHA-256 of the content in service after the check.
	Hash string
}

// File is a configuration file kept in service.
type File[T any] struct {
	opts    Options[T]
	current atomic.Pointer[loaded[T]]

	mu       sync.Mutex // serialises checks; guards lastSeen
	lastSeen string     // fingerprint of the last check: a content hash or an error text

	success, failure prometheus.Counter
	lastOK, lastOKAt prometheus.Gauge
}

type loaded[T any] struct {
	value T
	hash  string
}

// Open reads and parses the file once. An error is a configuration error: there is no
// last good content to keep.
func Open[T any](opts Options[T]) (*File[T], error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	reloads := metric.Register(opts.Registerer, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: opts.Metric + "_reloads_total",
		Help: fmt.Sprintf("Reloads of the %s after a change, by result (success, error). On error the last good content stays in service.", opts.What),
	}, []string{"result"}))
	f := &File[T]{opts: opts,
		success: reloads.WithLabelValues("success"),
		failure: reloads.WithLabelValues("error"),
		lastOK: metric.Register(opts.Registerer, prometheus.NewGauge(prometheus.GaugeOpts{
			Name: opts.Metric + "_last_reload_successful",
			Help: fmt.Sprintf("1 when the last load of the %s succeeded, 0 when what is in service is an older good content.", opts.What),
		})),
		lastOKAt: metric.Register(opts.Registerer, prometheus.NewGauge(prometheus.GaugeOpts{
			Name: opts.Metric + "_last_reload_success_timestamp_seconds",
			Help: fmt.Sprintf("When the %s was last loaded successfully (Unix seconds).", opts.What),
		})),
	}
	data, err := os.ReadFile(opts.Path)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", opts.What, opts.Path, err)
	}
	v, err := opts.Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", opts.What, opts.Path, err)
	}
	h := hash(data)
	f.current.Store(&loaded[T]{value: v, hash: h})
	f.lastSeen = h
	f.ok()
	return f, nil
}

func hash(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

func (f *File[T]) ok() {
	f.lastOK.Set(1)
	f.lastOKAt.Set(float64(time.Now().UnixNano()) / 1e9)
}

// Current is the content in service and its hash.
func (f *File[T]) Current() (T, string) {
	c := f.current.Load()
	return c.value, c.hash
}

// Check reads the file now and swaps in a new good content. When it swapped, prev and
// next are the old and the new content, for the caller to tell what changed.
func (f *File[T]) Check() (res Result, prev, next T) {
	f.mu.Lock()
	defer f.mu.Unlock()
	cur := f.current.Load()
	data, err := os.ReadFile(f.opts.Path)
	if err != nil {
		// A missing file is reported once, not once a poll, until it changes.
		fingerprint := "error: " + err.Error()
		if fingerprint == f.lastSeen {
			return Result{Unchanged: true, Err: err, Hash: cur.hash}, prev, next
		}
		f.lastSeen = fingerprint
		return f.failed(fmt.Errorf("%s %s: %w", f.opts.What, f.opts.Path, err), cur), prev, next
	}
	h := hash(data)
	if h == f.lastSeen {
		return Result{Unchanged: true, Hash: cur.hash}, prev, next
	}
	f.lastSeen = h
	if h == cur.hash {
		// The good file is back after an error: nothing to swap, but the file is sane.
		f.success.Inc()
		f.ok()
		f.opts.Logger.Info(f.opts.What+" readable again; unchanged", "path", f.opts.Path, "hash", short(h))
		return Result{Hash: h}, prev, next
	}
	v, err := f.opts.Parse(data)
	if err != nil {
		return f.failed(fmt.Errorf("%s %s: %w", f.opts.What, f.opts.Path, err), cur), prev, next
	}
	f.current.Store(&loaded[T]{value: v, hash: h})
	f.success.Inc()
	f.ok()
	return Result{Swapped: true, Hash: h}, cur.value, v
}

func (f *File[T]) failed(err error, cur *loaded[T]) Result {
	f.failure.Inc()
	f.lastOK.Set(0)
	f.opts.Logger.Error(f.opts.What+" reload failed; keeping the last good one", "path", f.opts.Path, "error", err, "hash_in_service", short(cur.hash))
	return Result{Err: err, Hash: cur.hash}
}

// Poll calls check every interval until ctx ends.
func Poll(ctx context.Context, interval time.Duration, check func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			check()
		}
	}
}

func short(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}
