// Package keyed holds per-key state that must not grow with the keys a replica has
// ever seen: a platform has tens of thousands of tenants, and a map of every budget
// key, lease set or API key a replica met would grow by each of them for ever (about
// 10 KB a tenant was measured, a gigabyte a replica at 100,000).
package keyed

import (
	"sync"
	"sync/atomic"
	"time"
)

// Map is a concurrent map of per-key state of at most Max entries. Reads are a
// sync.Map load and an atomic store of the entry's last use; a new key past the bound
// first evicts the least recently used entries that may go (Options.Keep), down to
// nine tenths of the bound, in one pass under a lock that only growth takes. Each user
// says why forgetting an entry is safe: a forgotten key is learnt again (a refusal
// from memory asks Redis, never admits), or an entry in use is never forgotten.
type Map[V any] struct {
	m       sync.Map // key -> *entry[V]
	size    atomic.Int64
	max     int64
	keep    func(*V) bool
	now     func() int64
	evictMu sync.Mutex
	evicted atomic.Int64
}

type entry[V any] struct {
	v    V
	used atomic.Int64
}

// Options configure a Map.
type Options[V any] struct {
	// Max bounds the entries (default 100,000).
	Max int
	// Keep, when not nil, says whether an entry must stay whatever its age (its key
	// has work in flight); eviction passes it by.
	Keep func(*V) bool
	// Now is the clock of the entries' last use (default: time.Now, in seconds).
	Now func() int64
}

// DefaultMax is Options.Max's default.
const DefaultMax = 100_000

// New returns an empty Map.
func New[V any](opts Options[V]) *Map[V] {
	if opts.Max <= 0 {
		opts.Max = DefaultMax
	}
	if opts.Now == nil {
		opts.Now = func() int64 { return time.Now().Unix() }
	}
	return &Map[V]{max: int64(opts.Max), keep: opts.Keep, now: opts.Now}
}

// Load returns key's state, or nil when it has none.
func (m *Map[V]) Load(key string) *V {
	e, ok := m.m.Load(key)
	if !ok {
		return nil
	}
	x := e.(*entry[V])
	m.touch(x)
	return &x.v
}

// LoadOrNew returns key's state, made zero (then init, when not nil) the first time.
func (m *Map[V]) LoadOrNew(key string, init func(*V)) *V {
	if e, ok := m.m.Load(key); ok {
		x := e.(*entry[V])
		m.touch(x)
		return &x.v
	}
	fresh := &entry[V]{}
	if init != nil {
		init(&fresh.v)
	}
	fresh.used.Store(m.now())
	e, loaded := m.m.LoadOrStore(key, fresh)
	if !loaded && m.size.Add(1) > m.max {
		m.evict()
	}
	return &e.(*entry[V]).v
}

// Delete forgets key.
func (m *Map[V]) Delete(key string) {
	if _, loaded := m.m.LoadAndDelete(key); loaded {
		m.size.Add(-1)
	}
}

// Len is how many keys the map holds.
func (m *Map[V]) Len() int { return int(m.size.Load()) }

// Evicted is how many entries eviction has forgotten.
func (m *Map[V]) Evicted() int64 { return m.evicted.Load() }

// touch records a use, at most one store per entry a clock tick.
func (m *Map[V]) touch(x *entry[V]) {
	if now := m.now(); x.used.Load() != now {
		x.used.Store(now)
	}
}

// evict forgets the least recently used entries that may go, down to nine tenths of
// the bound. One pass at a time; a pass that comes to a map back within its bound does
// nothing.
func (m *Map[V]) evict() {
	m.evictMu.Lock()
	defer m.evictMu.Unlock()
	target := m.max - m.max/10
	if m.size.Load() <= m.max {
		return
	}
	// The last uses, bucketed: the oldest buckets go first, without sorting every key.
	type candidate struct {
		key  any
		used int64
	}
	var all []candidate
	m.m.Range(func(k, v any) bool {
		x := v.(*entry[V])
		if m.keep == nil || !m.keep(&x.v) {
			all = append(all, candidate{k, x.used.Load()})
		}
		return true
	})
	over := m.size.Load() - target
	if over <= 0 || len(all) == 0 {
		return
	}
	// The cut-off: the used time below which at least over entries lie.
	lo, hi := all[0].used, all[0].used
	for _, c := range all {
		lo, hi = min(lo, c.used), max(hi, c.used)
	}
	cut := lo
	for cut < hi {
		mid := cut + (hi-cut)/2
		n := int64(0)
		for _, c := range all {
			if c.used <= mid {
				n++
			}
		}
		if n >= over {
			hi = mid
		} else {
			cut = mid + 1
		}
	}
	// Older than the cut-off first, all of them; then of the cut-off's own second only
	// as many as are still over.
	for _, older := range [2]bool{true, false} {
		for _, c := range all {
			if over <= 0 {
				return
			}
			if (older && c.used < cut) || (!older && c.used == cut) {
				if _, loaded := m.m.LoadAndDelete(c.key); loaded {
					m.size.Add(-1)
					m.evicted.Add(1)
					over--
				}
			}
		}
	}
}
