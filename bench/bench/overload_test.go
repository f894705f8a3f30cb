package bench

import (
	"strings"
	"testing"
)

func TestOverloadDefaults(t *testing.T) {
	t.Parallel()

	t.Run("the overload section states space-api's defaults as the product declares them", func(t *testing.T) {
		t.Parallel()
		got := overloadDefaults()
		want := "32 requests at work, 32 waiting per budget key and 1,024 in all, a wait of 1s at most"
		if got != want {
			t.Fatalf("overloadDefaults() = %q, want %q (if a default changed, change want with it)", got, want)
		}
	})

	t.Run("a count is written with a comma between each three digits", func(t *testing.T) {
		t.Parallel()
		for n, want := range map[int]string{0: "0", 999: "999", 1000: "1,000", 1024: "1,024", 100000: "100,000", 1234567: "1,234,567", -1024: "-1,024", -100: "-100"} {
			if got := thousands(n); got != want {
				t.Errorf("thousands(%d) = %q, want %q", n, got, want)
			}
		}
	})

	t.Run("the section names the defaults", func(t *testing.T) {
		t.Parallel()
		var b strings.Builder
		(&OverloadResult{}).markdown(&b)
		if !strings.Contains(b.String(), "its defaults: "+overloadDefaults()+")") {
			t.Fatalf("the overload section does not state the defaults: %.300s", b.String())
		}
	})
}
