package dispatcher

import (
	"fmt"
	"testing"

	"github.com/space-sandbox/space/internal/metric"
)

func TestTheQueuesSeriesDoNotGrowWithTenants(t *testing.T) {
	t.Parallel()

	t.Run("past the bound the smaller backlogs are summed as other, per kind and tier", func(t *testing.T) {
		t.Parallel()
		groups := map[group]*counts{}
		for i := range 1000 {
			groups[group{"create", fmt.Sprintf("tenant-%d", i), "free"}] = &counts{queued: float64(i % 7), oldest: float64(i)}
		}
		groups[group{"create", "big", "pro"}] = &counts{queued: 500, running: 3, oldest: 9}
		out := (&backlog{keys: 1}).bounded(groups)
		keys := map[string]bool{}
		var queued float64
		for g, c := range out {
			keys[g.key] = true
			queued += c.queued
		}
		if len(keys) != 2 || !keys["big"] || !keys[metric.OtherKeys] {
			t.Fatalf("labels %v, want the largest backlog and %s", keys, metric.OtherKeys)
		}
		var want float64
		for _, c := range groups {
			want += c.queued
		}
		if queued != want {
			t.Fatalf("%v queued across the series, want all %v", queued, want)
		}
		if o := out[group{"create", metric.OtherKeys, "free"}]; o == nil || o.oldest != 999 {
			t.Fatalf("the free tier's other series %+v, want the oldest of them all (999)", o)
		}
	})

	t.Run("within the bound every key keeps its own", func(t *testing.T) {
		t.Parallel()
		groups := map[group]*counts{{"create", "a", ""}: {queued: 1}, {"restore", "b", ""}: {queued: 2}}
		if out := (&backlog{keys: 100}).bounded(groups); len(out) != 2 || out[group{"create", "a", ""}] == nil {
			t.Fatalf("bounded = %v", out)
		}
	})
}
