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

func TestSlowloris(t *testing.T) {
	t.Parallel()

	t.Run("a slowloris holds its connections, sends no request whole and opens one again for each the server closes", func(t *testing.T) {
		t.Parallel()
		var served, opened atomic.Int64
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			served.Add(1)
		}))
		// The server gives up on headers sooner than any real one, so that the
		// slowloris sees connections closed within the test.
		srv.Config.ReadHeaderTimeout = 1500 * time.Millisecond
		srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				opened.Add(1)
			}
		}
		srv.Start()
		t.Cleanup(srv.Close)
		const conns = 20
		s, err := startSlowloris(testenv.Context(t), srv.URL, conns)
		if err != nil {
			t.Fatal(err)
		}
		// Started means every connection was opened once: the server sees them all
		// (as its accept loop gets to each: a dial returns once the kernel has it).
		testenv.Eventually(t, 10*time.Second, "the server to see the slowloris's connections", func() bool {
			return opened.Load() >= conns
		})
		time.Sleep(4 * time.Second)
		st, err := s.stop()
		if err != nil {
			t.Fatal(err)
		}
		if served.Load() != 0 {
			t.Errorf("the server served %d requests: a slowloris sends none whole", served.Load())
		}
		if st.Conns != conns || st.MaxOpen > conns || st.MaxOpen < 1 || st.Bytes < conns {
			t.Errorf("figures %+v: want %d connections, at most that many open, a byte a second each", st, conns)
		}
		// Each connection is closed 1.5 s after it opened and opened again: over 4 s,
		// every one at least once (on a busy machine, a connection may see its close
		// late, never early).
		if st.Closed < conns || st.Dials < max(conns, st.Closed) || st.Lifetime < 1500*time.Millisecond {
			t.Errorf("figures %+v: want each of the %d connections closed by the server at least once, after its header timeout, and opened again", st, conns)
		}
		// A connection being opened again as the slowloris stops may reach the server
		// and still be given up by the slowloris: at most one a connection.
		if n := int(opened.Load()); n < st.Dials || n > st.Dials+conns {
			t.Errorf("the server saw %d connections, the slowloris opened %d", n, st.Dials)
		}
	})
}
