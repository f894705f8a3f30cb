package apikey

import (
	"testing"

	"github.com/space-sandbox/space/internal/testenv"
)

// BenchmarkLookup is the per-request key lookup of SPACE_AUTH_MODE=api_key: a live
// key (one indexed read by hash; its last_used_at write is at most once a minute),
// an unknown well-formed key (the same read, no row), and a malformed one (refused
// without a round trip).
func BenchmarkLookup(b *testing.B) {
	db := testenv.DB(b)
	ctx := testenv.Context(b)
	s := NewStore(db, nil)
	_, secret, err := s.Create(ctx, "acme", "bench")
	if err != nil {
		b.Fatal(err)
	}
	unknown := Prefix + "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
	for _, c := range []struct {
		name, secret string
		ok           bool
	}{
		{"live", secret, true},
		{"unknown", unknown, false},
		{"malformed", "spk_not-a-key", false},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := s.Lookup(ctx, c.secret); (err == nil) != c.ok {
					b.Fatalf("Lookup = %v, want ok %v", err, c.ok)
				}
			}
		})
	}
}
