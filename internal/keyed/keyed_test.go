package keyed

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
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
