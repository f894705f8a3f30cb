package bench

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/testenv"
)

func TestRunApart(t *testing.T) {
	t.Parallel()

	t.Run("a stream in its own process brings back every answer with when it was sent", func(t *testing.T) {
		t.Parallel()
		var n atomic.Int64
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("X-Client-ID") != "quiet" || r.URL.Path != "/v1/sandboxes" {
				w.WriteHeader(http.StatusBadRequest)
				return
			}
			if n.Add(1)%2 == 0 {
				w.WriteHeader(http.StatusTooManyRequests)
				w.Write([]byte(`{"bucket":"client_activation"}`))
				return
			}
			w.WriteHeader(http.StatusCreated)
			w.Write([]byte(`{"warm":false}`))
		}))
		t.Cleanup(srv.Close)
		l := load{Name: "quiet", URL: srv.URL, Client: "quiet", Body: coldBody, Rate: 200, Duration: 200 * time.Millisecond, Conns: 2}
		began := time.Now()
		res, err := l.runApart(testenv.Context(t))
		if err != nil {
			t.Fatal(err)
		}
		sent := int(n.Load())
		if res.Requests != sent || sent < 10 {
			t.Fatalf("the stream counted %d answers of the %d the server gave", res.Requests, sent)
		}
		if created, refused := res.count("201"), res.count("429 client_activation"); created+refused != sent || created < sent/2-1 || refused < sent/2-1 {
			t.Fatalf("outcomes %v, want the server's 201 and 429 in turn", res.Outcomes)
		}
		if res.First.Before(began) || res.First.After(time.Now()) {
			t.Fatalf("the first request was sent at %v, not during the stream (from %v)", res.First, began)
		}
		last := res.answers[len(res.answers)-1]
		if last.at <= 0 || last.at > res.Elapsed || res.latency("", 99) <= 0 {
			t.Fatalf("last answer sent at %v of %v, p99 %v: the times did not come back", last.at, res.Elapsed, res.latency("", 99))
		}
		if got := res.latencyWithin(0, last.at+1, 100); got != res.latency("", 100) {
			t.Fatalf("the slowest answer within the whole stream is %v, but %v in all", got, res.latency("", 100))
		}
	})
}
