// Package keyed holds per-key state that must not grow with the keys a replica has
// ever seen: a platform has tens of thousands of tenants, and a map of every budget
// key, lease set or API key a replica met would grow by each of them for ever (about
// 10 KB a tenant was measured, a gigabyte a replica at 100,000).
//
// A map holds its keys for as long as they are in use and, with Options.IdleFor, for
// that long after: at most Options.Max of them. At a platform's size most tenants are
// idle at any moment, so what a replica holds grows with the keys used recently (the
// rate of new keys times IdleFor), not with every key it ever met.
package keyed

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/puzpuzpuz/xsync/v4"
)

// Map is a concurrent map of per-key state of at most Max entries. Reads are a
// lock-free load and, at most once a second per entry, an atomic write of its last use.
// A new key past the bound first evicts the least recently used entries that may go
// (Options.Keep), down to nine tenths of the bound, in one pass under a lock that only
// growth takes; with Options.IdleFor, a new key also forgets, at most once per
// IdleFor, every entry idle for longer that is not worth keeping (Options.Worth).
// Each user says why forgetting an entry is
// safe: a forgotten key is learnt again (a refusal from memory asks Redis, never
// admits), or an entry in use is never forgotten.
//
// An entry is forgotten by marking it gone before it leaves the map, with a
// compare-and-swap on its last use that a concurrent use makes fail: a user that read
// an entry just as it was forgotten either kept it (its use was newer) or is given a
// fresh one. So what a user counts in an entry Keep holds is never lost with it.
type Map[V any] struct {
	// m is a cache-line hash table (xsync.Map) rather than a sync.Map, whose trie
	// takes more dependent reads and holds a key in more objects: over 100,000 keys a
	// lookup took 120 ns against 218 and a key 55 bytes of the map's own against 134
	// (BenchmarkLoadSpread, BenchmarkBytesPerKey), fewer for the collector to mark.
	m       *xsync.Map[string, *entry[V]]
	size    atomic.Int64
	max     int64
	idle    int64 // Options.IdleFor in seconds of now (0: entries go only for room)
	keep    func(*V) bool
	worth   func(*V) bool
	now     func() int64
	evictMu sync.Mutex // taken by eviction and the idle sweep
	swept   atomic.Int64
	evicted atomic.Int64
	idled   atomic.Int64
}

// gone is an entry's last use once it is forgotten.
const gone = math.MinInt64

type entry[V any] struct {
	v    V
	used atomic.Int64 // now() of its last use, or gone
}

// Options configure a Map.
type Options[V any] struct {
	// Max bounds the entries (default 100,000).
	Max int
	// IdleFor, when above zero, forgets an entry not used for longer (unless Keep holds
	// it): a key whose state is worth nothing once it has been idle that long (what
	// was learnt of it has expired, or would be learnt again at its next use anyway).
	// It is counted in whole seconds of Now, rounded up: an entry goes at least IdleFor
	// and at most a second and one sweep (IdleFor) after its last use.
	IdleFor time.Duration
	// Keep, when not nil, says whether an entry must stay whatever its age (its key
	// has work in flight); neither eviction nor the idle sweep takes it.
	Keep func(*V) bool
	// Worth, when not nil, says whether an idle entry still knows something that its
	// key's next use could not learn again (a bucket not yet full again): the idle
	// sweep leaves it, and only eviction, for room, may take it.
	Worth func(*V) bool
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
	m := &Map[V]{m: xsync.NewMap[string, *entry[V]](), max: int64(opts.Max), keep: opts.Keep, worth: opts.Worth, now: opts.Now}
	if opts.IdleFor > 0 {
		m.idle = int64((opts.IdleFor + time.Second - 1) / time.Second)
		m.swept.Store(opts.Now())
	}
	return m
}

// Load returns key's state, or nil when it has none.
func (m *Map[V]) Load(key string) *V {
	x, ok := m.m.Load(key)
	if !ok {
		return nil
	}
	return m.used(x, m.now())
}

// LoadAt is Load for a caller that has just read the map's clock (Options.Now) itself:
// now is that reading. A clock read costs as much as the lookup (time.Now is 47 ns
// here), and a refusal from memory looks up two buckets at the time it decides at.
func (m *Map[V]) LoadAt(key string, now int64) *V {
	x, ok := m.m.Load(key)
	if !ok {
		return nil
	}
	return m.used(x, now)
}

// used is x's state once its use at now is recorded, or nil when it was forgotten as
// it was read.
func (m *Map[V]) used(x *entry[V], now int64) *V {
	if !m.use(x, now) {
		return nil
	}
	return &x.v
}

// LoadOrNew returns key's state, made zero (then init, when not nil) the first time.
func (m *Map[V]) LoadOrNew(key string, init func(*V)) *V {
	return m.LoadOrNewAt(key, init, m.now())
}

// LoadOrNewAt is LoadOrNew for a caller that has just read the map's clock itself, as
// LoadAt is Load's.
func (m *Map[V]) LoadOrNewAt(key string, init func(*V), now int64) *V {
	for {
		if x, ok := m.m.Load(key); ok {
			if m.use(x, now) {
				return &x.v
			}
			m.drop(key, x) // forgotten as it was read: help it leave, then a new one
			continue
		}
		fresh := &entry[V]{}
		if init != nil {
			init(&fresh.v)
		}
		fresh.used.Store(now)
		x, loaded := m.m.LoadOrStore(key, fresh)
		if loaded {
			if m.use(x, now) {
				return &x.v
			}
			m.drop(key, x)
			continue
		}
		if m.idle > 0 && now-m.swept.Load() >= m.idle {
			m.sweep(now)
		}
		if m.size.Add(1) > m.max {
			m.evict()
		}
		return &x.v
	}
}

// Delete forgets key's state.
func (m *Map[V]) Delete(key string) {
	if _, loaded := m.m.LoadAndDelete(key); loaded {
		m.size.Add(-1)
	}
}

// Len is the number of keys held.
func (m *Map[V]) Len() int { return int(m.size.Load()) }

// Evicted is the number of keys forgotten for room since the map was made.
func (m *Map[V]) Evicted() int64 { return m.evicted.Load() }

// Idled is the number of keys forgotten for being idle since the map was made.
func (m *Map[V]) Idled() int64 { return m.idled.Load() }

// use records x's use at now, a write only when the second changed (an entry read by
// every request of a busy key stays a read-only cache line within a second). It fails
// when x is forgotten, then or before.
func (m *Map[V]) use(x *entry[V], now int64) bool {
	for {
		u := x.used.Load()
		switch {
		case u == gone:
			return false
		case u >= now:
			return true
		case x.used.CompareAndSwap(u, now):
			return true
		}
	}
}

// forget marks x gone if its last use is still before cutoff and Keep does not hold
// it (nor Worth, when idle, for the sweep), and removes it from the map; false when it
// stays. The mark is a compare-and-swap on the last use that use's own makes fail: x
// is either used again or gone, never both.
func (m *Map[V]) forget(key string, x *entry[V], cutoff int64, idle bool) bool {
	u := x.used.Load()
	if u == gone || u >= cutoff || (m.keep != nil && m.keep(&x.v)) || (idle && m.worth != nil && m.worth(&x.v)) {
		return false
	}
	if !x.used.CompareAndSwap(u, gone) {
		return false
	}
	return m.drop(key, x)
}

// drop removes x, once gone, from the map, if it is still there: whoever removes it
// counts it out.
func (m *Map[V]) drop(key string, x *entry[V]) bool {
	dropped := false
	m.m.Compute(key, func(cur *entry[V], loaded bool) (*entry[V], xsync.ComputeOp) {
		if !loaded || cur != x {
			return cur, xsync.CancelOp
		}
		dropped = true
		return nil, xsync.DeleteOp
	})
	if dropped {
		m.size.Add(-1)
	}
	return dropped
}

// sweep forgets the entries idle for longer than IdleFor, once per IdleFor, by the one
// new key that finds the lock free: the others go on.
func (m *Map[V]) sweep(now int64) {
	if !m.evictMu.TryLock() {
		return
	}
	defer m.evictMu.Unlock()
	if now-m.swept.Load() < m.idle {
		return
	}
	m.swept.Store(now)
	cutoff := now - m.idle
	m.m.Range(func(k string, x *entry[V]) bool {
		if m.forget(k, x, cutoff, true) {
			m.idled.Add(1)
		}
		return true
	})
}

// evict forgets the least recently used entries, down to nine tenths of the bound.
// Entries of one second are alike: the older seconds go first, then as many of the
// cut's second as the excess needs.
func (m *Map[V]) evict() {
	m.evictMu.Lock()
	defer m.evictMu.Unlock()
	target := m.max - m.max/10
	if m.size.Load() <= m.max {
		return
	}
	type candidate struct {
		key  string
		x    *entry[V]
		used int64
	}
	var all []candidate
	m.m.Range(func(k string, x *entry[V]) bool {
		if u := x.used.Load(); u != gone && (m.keep == nil || !m.keep(&x.v)) {
			all = append(all, candidate{k, x, u})
		}
		return true
	})
	over := m.size.Load() - target
	if over <= 0 || len(all) == 0 {
		return
	}
	// The cut: the newest second such that the entries at or before it are at least
	// the excess (a binary search over the seconds, not a sort of the entries).
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
	for _, older := range [2]bool{true, false} {
		for _, c := range all {
			if over <= 0 {
				return
			}
			// An entry used since the pass read it is newer than the cut now: forget
			// (a compare-and-swap on the use read here) leaves it.
			if (older && c.used < cut) || (!older && c.used == cut) {
				if m.forget(c.key, c.x, c.used+1, false) {
					m.evicted.Add(1)
					over--
				}
			}
		}
	}
}
