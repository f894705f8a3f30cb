package keyed

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestMap(t *testing.T) {
	t.Parallel()

	t.Run("past its bound a map forgets its least recently used keys, down to nine tenths", func(t *testing.T) {
		t.Parallel()
		var clock atomic.Int64
		m := New(Options[int]{Max: 100, Now: clock.Load})
		for i := range 100 {
			clock.Store(int64(i))
			*m.LoadOrNew(fmt.Sprintf("k%d", i), nil) = i
		}
		clock.Store(1000)
		m.Load("k0") // used again: the newest
		m.LoadOrNew("k100", nil)
		if m.Len() != 90 {
			t.Fatalf("%d keys after one over the bound of 100, want 90", m.Len())
		}
		if m.Load("k0") == nil || m.Load("k100") == nil {
			t.Fatal("a key just used was forgotten")
		}
		if m.Load("k1") != nil || m.Load("k10") != nil {
			t.Fatal("an old key was kept over newer ones")
		}
		if m.Evicted() != 11 {
			t.Errorf("%d evicted, want 11", m.Evicted())
		}
	})

	t.Run("the older keys go first even when the newest second holds more than the excess", func(t *testing.T) {
		t.Parallel()
		for range 20 { // the map's order differs every time
			var clock atomic.Int64
			m := New(Options[int]{Max: 100, Now: clock.Load})
			m.LoadOrNew("old", nil)
			clock.Store(1)
			for i := range 100 { // all in one second, the last one past the bound
				m.LoadOrNew(fmt.Sprintf("k%d", i), nil)
			}
			if m.Len() != 90 {
				t.Fatalf("%d keys, want 90", m.Len())
			}
			if m.Load("old") != nil {
				t.Fatal("the one key of an older second was kept over keys of the newest")
			}
		}
	})

	t.Run("an entry Keep holds is never forgotten, however old", func(t *testing.T) {
		t.Parallel()
		var clock atomic.Int64
		m := New(Options[int]{Max: 10, Now: clock.Load, Keep: func(v *int) bool { return *v > 0 }})
		*m.LoadOrNew("busy", nil) = 1
		for i := range 50 {
			clock.Store(int64(i + 1))
			m.LoadOrNew(fmt.Sprintf("k%d", i), nil)
		}
		if v := m.Load("busy"); v == nil || *v != 1 {
			t.Fatal("the entry in use was forgotten")
		}
		if m.Len() > 10 {
			t.Fatalf("%d keys, over the bound of 10", m.Len())
		}
	})

	t.Run("under concurrency the map stays within its bound and every key is a single entry", func(t *testing.T) {
		t.Parallel()
		m := New(Options[atomic.Int64]{Max: 1000})
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Go(func() {
				for i := range 10_000 {
					m.LoadOrNew(fmt.Sprintf("k%d", (i*8+g)%20_000), nil).Add(1)
				}
			})
		}
		wg.Wait()
		if m.Len() > 1000 {
			t.Fatalf("%d keys, over the bound of 1,000", m.Len())
		}
	})
}

func BenchmarkLoad(b *testing.B) {
	m := New(Options[int]{})
	m.LoadOrNew("acme", nil)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.Load("acme")
		}
	})
}

func TestIdleFor(t *testing.T) {
	t.Parallel()

	type bundle struct {
		clock *atomic.Int64
		m     *Map[atomic.Int64]
	}
	setup := func(t *testing.T, idle time.Duration) bundle {
		t.Helper()
		clock := new(atomic.Int64)
		clock.Store(1000)
		return bundle{clock, New(Options[atomic.Int64]{
			IdleFor: idle,
			Now:     clock.Load,
			Keep:    func(n *atomic.Int64) bool { return n.Load() > 0 },
		})}
	}

	// Load reads the map's clock for an entry's use; LoadAt takes the caller's reading.
	for _, read := range []struct {
		name string
		load func(b bundle, key string) *atomic.Int64
	}{
		{"Load", func(b bundle, key string) *atomic.Int64 { return b.m.Load(key) }},
		{"LoadAt", func(b bundle, key string) *atomic.Int64 { return b.m.LoadAt(key, b.clock.Load()) }},
	} {
		t.Run("an entry idle for longer than IdleFor is forgotten by the next new key, one read by "+read.name+" within it is kept", func(t *testing.T) {
			t.Parallel()
			b := setup(t, 10*time.Second)
			b.m.LoadOrNew("idle", nil)
			b.m.LoadOrNew("busy", nil)
			b.clock.Add(10)
			if read.load(b, "busy") == nil || read.load(b, "missing") != nil {
				t.Fatalf("%s did not find exactly the keys the map holds", read.name)
			}
			b.clock.Add(1) // idle's last use is 11 s ago, busy's 1 s
			b.m.LoadOrNewAt("new", nil, b.clock.Load())
			if read.load(b, "idle") != nil {
				t.Fatal("an entry idle for 11 s outlived IdleFor of 10 s")
			}
			if read.load(b, "busy") == nil || read.load(b, "new") == nil {
				t.Fatal("an entry used within IdleFor was forgotten")
			}
			if b.m.Len() != 2 || b.m.Idled() != 1 {
				t.Fatalf("%d keys, %d idled; want 2 and 1", b.m.Len(), b.m.Idled())
			}
		})
	}

	t.Run("an entry is never forgotten before IdleFor has passed", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 10*time.Second)
		b.m.LoadOrNew("a", nil)
		b.clock.Add(10) // exactly IdleFor: may still be wanted
		b.m.LoadOrNew("b", nil)
		if b.m.Load("a") == nil {
			t.Fatal("an entry was forgotten after 10 s of an IdleFor of 10 s")
		}
	})

	t.Run("an entry Keep holds outlives IdleFor", func(t *testing.T) {
		t.Parallel()
		b := setup(t, time.Second)
		b.m.LoadOrNew("working", nil).Add(1)
		b.clock.Add(60)
		b.m.LoadOrNew("new", nil)
		if n := b.m.Load("working"); n == nil || n.Load() != 1 {
			t.Fatal("an entry with work in flight was forgotten for being idle")
		}
	})

	t.Run("an idle entry still worth keeping outlives IdleFor and goes only for room", func(t *testing.T) {
		t.Parallel()
		var clock atomic.Int64
		m := New(Options[int]{Max: 10, IdleFor: time.Second, Now: clock.Load,
			Worth: func(v *int) bool { return *v > 0 }})
		*m.LoadOrNew("worth", nil) = 1
		m.LoadOrNew("spent", nil)
		clock.Add(5)
		m.LoadOrNew("new", nil)
		if m.Load("worth") == nil {
			t.Fatal("an idle entry still worth keeping was swept")
		}
		if m.Load("spent") != nil {
			t.Fatal("an idle entry worth nothing outlived IdleFor")
		}
		clock.Add(1) // within IdleFor of the keys below: only the bound forgets now
		for i := range 20 {
			m.LoadOrNew(fmt.Sprintf("k%d", i), nil)
		}
		if m.Load("worth") != nil {
			t.Fatal("an entry worth keeping, the least recently used, was kept past the bound")
		}
	})

	t.Run("without IdleFor, entries go only for room", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 0)
		b.m.LoadOrNew("old", nil)
		b.clock.Add(3600)
		b.m.LoadOrNew("new", nil)
		if b.m.Load("old") == nil {
			t.Fatal("an idle entry was forgotten with no IdleFor")
		}
	})

	t.Run("under sweeps and evictions beside each other the map counts exactly the keys it holds", func(t *testing.T) {
		t.Parallel()
		// A second passes every 8 uses of one worker, so sweeps run beside the
		// evictions of the bound of 256, and the workers' keys are forgotten and made again between
		// their uses: every entry must leave the count exactly once.
		var clock atomic.Int64
		m := New(Options[atomic.Int64]{Max: 256, IdleFor: time.Second, Now: clock.Load,
			Keep: func(n *atomic.Int64) bool { return n.Load() > 0 }})
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Go(func() {
				for i := range 5_000 {
					if g == 0 && i%8 == 0 {
						clock.Add(1)
					}
					n := m.LoadOrNew(fmt.Sprintf("k%d", (i*8+g)%2_000), nil)
					n.Add(1)
					n.Add(-1)
				}
			})
		}
		wg.Wait()
		held := 0
		m.m.Range(func(string, *entry[atomic.Int64]) bool { held++; return true })
		if m.Len() != held {
			t.Fatalf("the map counts %d keys and holds %d", m.Len(), held)
		}
		if held > 256 {
			t.Fatalf("%d keys, over the bound of 256", held)
		}
		if m.Idled() == 0 || m.Evicted() == 0 {
			t.Fatalf("%d idled, %d evicted: the test did not make both run", m.Idled(), m.Evicted())
		}
	})
}

// spreadKeys are n budget keys' bucket names, as the Admitter's memory holds them.
func spreadKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "{space:cluster_admission:sandbox_activation}:client:c" + fmt.Sprint(i)
	}
	return keys
}

// BenchmarkLoadSpread reads keys drawn from 100,000, as a replica over that many
// tenants does on every decision.
func BenchmarkLoadSpread(b *testing.B) {
	keys := spreadKeys(100_000)
	m := New(Options[int]{Max: len(keys)})
	for _, k := range keys {
		m.LoadOrNew(k, nil)
	}
	var seed atomic.Uint64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		x := seed.Add(0x9e3779b97f4a7c15) // each goroutine its own walk over the keys
		for pb.Next() {
			x = x*6364136223846793005 + 1442695040888963407
			m.Load(keys[(x>>33)%uint64(len(keys))])
		}
	})
}

// BenchmarkBytesPerKey is the live heap a key costs the map itself, beyond the key's
// string and its state: what a replica pays per tenant in each of its keyed maps.
func BenchmarkBytesPerKey(b *testing.B) {
	keys := spreadKeys(100_000)
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		m := New(Options[int]{Max: len(keys)})
		for _, k := range keys {
			m.LoadOrNew(k, nil)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(len(keys))-8, "B/key")
		runtime.KeepAlive(m)
	}
}
