package bench

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
)

func TestSameAnswer(t *testing.T) {
	t.Parallel()

	answer := func(id string) response {
		h := http.Header{}
		h.Set("Content-Type", "application/problem+json")
		h.Set("Ratelimit", `"client_activation";r=0;t=86400`)
		h.Set("X-Request-Id", id)
		h.Set("Date", "Mon, 07 Dec 2026 13:38:41 GMT")
		return response{status: http.StatusTooManyRequests, header: h,
			body: []byte(`{"code":"limited","request_id":"` + id + `"}` + "\n")}
	}
	space := answer("880faf7a1f348f13")

	t.Run("two answers alike but for their request ids and dates are the same answer", func(t *testing.T) {
		t.Parallel()
		peer := answer("0123456789abcdef")
		peer.header.Set("Date", "Mon, 07 Dec 2026 13:38:42 GMT")
		if err := sameAnswer(space, peer); err != nil {
			t.Fatal(err)
		}
	})
	for _, c := range []struct {
		name   string
		change func(*response)
		want   string
	}{
		{"another status is told", func(r *response) { r.status = http.StatusServiceUnavailable }, "answered 503"},
		{"a header value of its own is told", func(r *response) { r.header.Set("Ratelimit", `"client_activation";r=0;t=1`) }, "headers"},
		{"a header more is told", func(r *response) { r.header.Set("Cache-Control", "no-store") }, "headers"},
		{"a header fewer is told", func(r *response) { r.header.Del("Content-Type") }, "headers"},
		{"a request id of another length is told", func(r *response) { r.header.Set("X-Request-Id", "abc") }, "X-Request-Id"},
		{"another body is told", func(r *response) { r.body = bytes.Replace(r.body, []byte("limited"), []byte("limits!"), 1) }, "body"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			peer := answer("0123456789abcdef")
			c.change(&peer)
			err := sameAnswer(space, peer)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("sameAnswer: %v, want an error saying %q", err, c.want)
			}
		})
	}
}
