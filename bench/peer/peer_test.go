package peer

import (
	"net/http"
	"testing"

	"github.com/space-sandbox/space/internal/testenv"
)

// BenchmarkHandler is one refused create through a peer's handler alone, no socket
// and no net/http server: the request of space-api's BenchmarkRefusalHandler (package
// internal/app), testenv.CreateRequest, written to the same testenv.StatusWriter, so
// that the two compare the handlers themselves, apart from what serving them over
// loopback adds:
//
//	cd bench && go test -run '^$' -bench Handler -benchmem ./peer/
//	go test -run '^$' -bench RefusalHandler -benchmem ./internal/app/
//
// bare: chi, no store (peer-chi-bare); space_answer: the same answering space-api's
// own 429 (peer-chi-bare -space-answer); request: no handler but the writer's header
// map made, what building the request and its writer costs, to take from the others.
func BenchmarkHandler(b *testing.B) {
	cases := []struct {
		name string
		h    http.Handler
		want int
	}{
		{"bare", Handler(RefuseAll), http.StatusTooManyRequests},
		{"space_answer", SpaceAnswer(), http.StatusTooManyRequests},
		{"request", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Header() }), 0},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				w := &testenv.StatusWriter{}
				c.h.ServeHTTP(w, testenv.CreateRequest("bench"))
				if w.Status != c.want {
					b.Fatalf("status %d, want %d", w.Status, c.want)
				}
			}
		})
	}
}
