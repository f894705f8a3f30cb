package bench

import (
	"net"
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

func TestRunRaw(t *testing.T) {
	t.Parallel()

	t.Run("every due request is sent and answered, chunked, closing and plain answers alike", func(t *testing.T) {
		t.Parallel()
		var n, conns atomic.Int64
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("X-Client-ID") != "flood" || r.Method != http.MethodPost {
				w.WriteHeader(http.StatusBadRequest)
				return
			}
			i := n.Add(1)
			if i%7 == 0 {
				w.Header().Set("Connection", "close")
			}
			switch i % 3 {
			case 0: // chunked: flushed before the body is whole
				w.WriteHeader(http.StatusTooManyRequests)
				w.Write([]byte(`{"bucket":`))
				w.(http.Flusher).Flush()
				w.Write([]byte(`"client_activation"}`))
			case 1:
				w.WriteHeader(http.StatusTooManyRequests)
				w.Write([]byte(`{"bucket":"cluster_activation"}`))
			default:
				w.WriteHeader(http.StatusCreated)
				w.Write([]byte(`{"warm":true}`))
			}
		}))
		srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				conns.Add(1)
			}
		}
		srv.Start()
		t.Cleanup(srv.Close)
		l := load{Name: "flood", URL: srv.URL, Client: "flood", Body: coldBody, Rate: 500, Duration: 300 * time.Millisecond, Conns: 4, Raw: true}
		res, err := l.runApart(testenv.Context(t))
		if err != nil {
			t.Fatal(err)
		}
		if res.Requests != 150 || int(n.Load()) != 150 {
			t.Fatalf("%d answers counted, %d requests served; want the 150 due in 300ms at 500/s", res.Requests, n.Load())
		}
		if got := [3]int{res.count("429 client_activation"), res.count("429 cluster_activation"), res.count("201 warm")}; got != [3]int{50, 50, 50} {
			t.Fatalf("outcomes %v, want 50 of each the server gave", res.Outcomes)
		}
		// 21 answers closed their connection: each was opened again for the next
		// request, but those of the last few, which may have had none left.
		if c := conns.Load(); c < 4+21-4 || c > 4+21 {
			t.Fatalf("%d connections opened, want the 4 and one for (nearly) each of the 21 closed", c)
		}
		if res.latency("", 50) <= 0 || res.Elapsed < 290*time.Millisecond {
			t.Fatalf("p50 %v over %v: the stream did not run its schedule", res.latency("", 50), res.Elapsed)
		}
	})
}

func TestOfferedAndAnswered(t *testing.T) {
	t.Parallel()
	r := newLoadResult("flood")
	ms := time.Millisecond
	// due at, sent after, answered after (from due)
	r.addSent("201", 0, 0, 5*ms)
	r.addSent("429 client_activation", 10*ms, 90*ms, 95*ms) // sent at 100 ms, answered at 105 ms
	r.addSent("503", 20*ms, 0, 200*ms)                      // sent at 20 ms, answered at 220 ms
	r.addSent("error", 30*ms, 0, 1*ms)                      // no answer: neither sent nor answered
	if got := r.sentWithin(0, 50*ms); got != 2 {
		t.Errorf("sent in [0, 50 ms) = %d, want 2 (the one due at 10 ms went at 100 ms)", got)
	}
	if got := r.sentWithin(50*ms, time.Second); got != 1 {
		t.Errorf("sent in [50 ms, 1 s) = %d, want 1", got)
	}
	if got := r.answeredWithin("", 0, 150*ms); got != 2 {
		t.Errorf("answered in [0, 150 ms) = %d, want 2", got)
	}
	if got, want := [3]int{r.answeredWithin("201", 0, time.Second), r.answeredWithin("429", 0, time.Second), r.answeredWithin("503", 0, 210*ms)}, [3]int{1, 1, 0}; got != want {
		t.Errorf("answered by status %v, want %v", got, want)
	}
}
