package sandbox

import (
	"regexp"
	"testing"
)

func TestTemplateName(t *testing.T) {
	t.Parallel()

	// The rule as a regexp, which templateName replaced on the create path.
	rule := regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
	check := func(s string) {
		t.Helper()
		if got, want := templateName(s), rule.MatchString(s); got != want {
			t.Fatalf("templateName(%q) = %v, the rule says %v", s, got, want)
		}
	}

	t.Run("every string of up to two bytes agrees with the rule", func(t *testing.T) {
		t.Parallel()
		check("")
		for a := range 256 {
			check(string([]byte{byte(a)}))
			for b := range 256 {
				check(string([]byte{byte(a), byte(b)}))
			}
		}
	})

	t.Run("longer names agree with the rule wherever the odd byte is", func(t *testing.T) {
		t.Parallel()
		for _, odd := range []byte{'.', '_', '-', '/', ' ', 0, 0x80, 0xff, 'Z', '9'} {
			for at := range 5 {
				b := []byte("python-3.12")
				b[at] = odd
				check(string(b))
			}
		}
		check("python-3.12")
		check("a..b")
		check("é")
	})
}
