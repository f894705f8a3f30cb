package metric_test

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/space-sandbox/space/internal/metric"
)

func TestBound(t *testing.T) {
	t.Parallel()

	type key struct{ route, status string }
	setup := func() (*prometheus.CounterVec, *metric.Bound[key, prometheus.Counter], *atomic.Int64) {
		vec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "requests_total", Help: "h"}, []string{"route", "status"})
		binds := new(atomic.Int64)
		b := metric.NewBound(func(k key) prometheus.Counter {
			binds.Add(1)
			return vec.WithLabelValues(k.route, k.status)
		})
		return vec, b, binds
	}

	t.Run("a key's series is bound at its first use and the same series after", func(t *testing.T) {
		t.Parallel()
		vec, b, binds := setup()
		b.Of(key{"/a", "200"}).Inc()
		b.Of(key{"/a", "200"}).Inc()
		b.Of(key{"/a", "429"}).Inc()
		if got := binds.Load(); got != 2 {
			t.Errorf("bound %d times for two keys", got)
		}
		if got := testutil.ToFloat64(vec.WithLabelValues("/a", "200")); got != 2 {
			t.Errorf("/a 200 = %v, want 2", got)
		}
		if got := testutil.ToFloat64(vec.WithLabelValues("/a", "429")); got != 1 {
			t.Errorf("/a 429 = %v, want 1", got)
		}
	})

	t.Run("goroutines meeting a key at once all count on its one series", func(t *testing.T) {
		t.Parallel()
		vec, b, _ := setup()
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				for range 100 {
					b.Of(key{"/b", "200"}).Inc()
				}
			})
		}
		wg.Wait()
		if got := testutil.ToFloat64(vec.WithLabelValues("/b", "200")); got != 1600 {
			t.Errorf("/b 200 = %v, want 1600", got)
		}
	})
}
