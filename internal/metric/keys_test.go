package metric

import (
	"fmt"
	"sync"
	"testing"
)

func TestKeys(t *testing.T) {
	t.Parallel()

	t.Run("the first keys keep their label for good, the rest are other, under any concurrency", func(t *testing.T) {
		t.Parallel()
		k := NewKeys(10)
		var wg sync.WaitGroup
		for i := range 1000 {
			wg.Go(func() { k.Label(fmt.Sprintf("k%d", i)) })
		}
		wg.Wait()
		named := 0
		for i := range 1000 {
			if l := k.Label(fmt.Sprintf("k%d", i)); l != OtherKeys {
				named++
				if l != fmt.Sprintf("k%d", i) {
					t.Fatalf("k%d labelled %q", i, l)
				}
			}
		}
		if named != 10 {
			t.Fatalf("%d keys named, want the bound of 10", named)
		}
	})

	t.Run("a bound of 0 names no key", func(t *testing.T) {
		t.Parallel()
		if l := NewKeys(0).Label("acme"); l != OtherKeys {
			t.Fatalf("label %q", l)
		}
	})

	t.Run("a gauge names its largest keys now, and sums the rest as other", func(t *testing.T) {
		t.Parallel()
		got := Top(map[string]float64{"a": 1, "b": 5, "c": 3, "d": 5}, 2)
		want := map[string]string{"b": "b", "d": "d", "c": OtherKeys, "a": OtherKeys}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s labelled %q, want %q", k, got[k], v)
			}
		}
	})
}
