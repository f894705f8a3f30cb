package logs

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestThrottle(t *testing.T) {
	t.Parallel()

	t.Run("one line per key per interval, under a flood of goroutines, counting those held back", func(t *testing.T) {
		t.Parallel()
		now := time.Unix(1_000, 0)
		var mu sync.Mutex
		th := NewThrottle(time.Minute, func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
		flood := func(key string) (allowed int64) {
			var n atomic.Int64
			var wg sync.WaitGroup
			for range 20 {
				wg.Go(func() {
					for range 50 {
						if ok, _ := th.Allow(key); ok {
							n.Add(1)
						}
					}
				})
			}
			wg.Wait()
			return n.Load()
		}
		if n := flood("a"); n != 1 {
			t.Fatalf("%d lines let through in a flood, want 1", n)
		}
		if n := flood("b"); n != 1 {
			t.Fatalf("another key: %d lines, want its own 1", n)
		}
		mu.Lock()
		now = now.Add(59 * time.Second)
		mu.Unlock()
		if ok, _ := th.Allow("a"); ok {
			t.Fatal("a line let through before the interval passed")
		}
		mu.Lock()
		now = now.Add(time.Second)
		mu.Unlock()
		ok, held := th.Allow("a")
		if !ok || held != 1000 {
			t.Fatalf("after the interval: allowed %v, held back %d; want true and the 999 of the flood plus one", ok, held)
		}
	})
}
