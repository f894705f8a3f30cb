// Package coalesce joins reads of one key made at once into fewer round trips, without
// ever answering a read with what was read before it was asked.
package coalesce

import (
	"context"
	"sync"
	"time"
)

// Reads coalesces the reads of each key: at most one read of a key is on its way at
// once, and the reads of it asked for meanwhile wait together for the next, sent as
// that one comes back. A flood of one key's reads then costs the store one read at a
// time, each answering every caller that arrived during the one before, where it cost
// a read a caller; reads of different keys never wait on each other.
//
// Unlike a singleflight, which hands a caller the result of a read already on its way
// (begun, perhaps, before a write the caller has seen complete), every answer here
// comes from a read that began after its caller asked: what was written before the
// call is always seen. That is what lets a revoked API key be refused by the very next
// request (internal/apikey).
//
// A lone read (none of its key on its way) runs on its caller's goroutine under its
// caller's context, as it would without Reads. A read sent for callers that waited
// runs on a goroutine of its own, under no caller's context but Timeout (default
// DefaultTimeout): each of them still returns at its own context's end, and the read
// goes on for the others. The zero Reads is ready to use.
type Reads[K comparable, V any] struct {
	// Timeout bounds a read sent for the callers that waited for it.
	Timeout time.Duration

	// OnWait, when set, is called each time a caller starts waiting for a key's next
	// read: a signal for tests.
	OnWait func()

	// out holds the keys with a read on its way, each with its next read, which the
	// callers arrived since wait for (nil while none waits).
	mu  sync.Mutex
	out map[K]*result[V]
}

// DefaultTimeout is Reads.Timeout's default.
const DefaultTimeout = 5 * time.Second

// result is one read and its answer, for every caller waiting on it.
type result[V any] struct {
	read func(context.Context) (V, error)
	done chan struct{} // closed once v and err are set
	v    V
	err  error
}

// Do returns read's answer for key: read's own, run now, when no read of key is on its
// way; otherwise the answer of the next read of key, which begins once the one on its
// way has come back. read must read the same thing for every caller of one key (only
// one of the waiting callers' reads runs). A caller whose context ends while it waits
// returns ctx.Err() at once.
func (r *Reads[K, V]) Do(ctx context.Context, key K, read func(context.Context) (V, error)) (V, error) {
	r.mu.Lock()
	next, onItsWay := r.out[key]
	if !onItsWay {
		if r.out == nil {
			r.out = map[K]*result[V]{}
		}
		r.out[key] = nil
		r.mu.Unlock()
		defer r.landed(key)
		return read(ctx)
	}
	if next == nil {
		next = &result[V]{read: read, done: make(chan struct{})}
		r.out[key] = next
	}
	r.mu.Unlock()
	if r.OnWait != nil {
		r.OnWait()
	}
	select {
	case <-next.done:
		return next.v, next.err
	case <-ctx.Done():
		var zero V
		return zero, ctx.Err()
	}
}

// landed is called as a read of key comes back: the read its waiting callers wait for
// goes next, or, when none waits, key has no read on its way.
func (r *Reads[K, V]) landed(key K) {
	r.mu.Lock()
	next := r.out[key]
	if next == nil {
		delete(r.out, key)
		r.mu.Unlock()
		return
	}
	r.out[key] = nil // on its way now; the callers arriving next wait for another
	r.mu.Unlock()
	timeout := r.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	go func() {
		defer r.landed(key)
		defer close(next.done)
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		next.v, next.err = next.read(ctx)
	}()
}

// Len is the number of keys with a read on its way.
func (r *Reads[K, V]) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.out)
}
