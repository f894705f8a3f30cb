package admission

import (
	"strings"
	"testing"

	"github.com/space-sandbox/space"
)

func TestJoined(t *testing.T) {
	t.Parallel()

	// The refusal from memory looks a client bucket up under joined(clientPrefix, key):
	// it must be the key its decisions are remembered under, ClientKey's.
	for _, c := range []struct {
		name, prefix string
		key          space.ClientKey
	}{
		{"a client key that fits the buffer", "space", "acme"},
		{"a client key of the longest client id", "space", space.ClientKey(strings.Repeat("k", space.MaxClientIDLen))},
		{"a prefix and key longer than the buffer", strings.Repeat("p", 100), space.ClientKey(strings.Repeat("k", space.MaxClientIDLen))},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var buf [192]byte
			prefix := "{" + ClusterKey(c.prefix) + "}:client:"
			if got, want := joined(&buf, prefix, string(c.key)), ClientKey(c.prefix, c.key); got != want {
				t.Fatalf("joined = %q, want %q", got, want)
			}
		})
	}
}
