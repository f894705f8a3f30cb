package app

import (
	"io"
	"net"
	"net/http"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/space-sandbox/space/internal/api"
	"github.com/space-sandbox/space/internal/config"
)

func TestActiveConnections(t *testing.T) {
	t.Parallel()

	t.Run("a connection counts while a request is in flight on it, and not once it closes", func(t *testing.T) {
		t.Parallel()
		m := NewMain(config.Default(), NewLogger(io.Discard, "error"))
		pa, pb := net.Pipe()
		defer pa.Close()
		defer pb.Close()
		a, b := &trackedConn{Conn: pa}, &trackedConn{Conn: pb}
		steps := []struct {
			state http.ConnState
			want  float64
		}{
			{http.StateNew, 0}, {http.StateActive, 1}, {http.StateIdle, 0}, {http.StateActive, 1},
			{http.StateActive, 1}, {http.StateClosed, 0},
		}
		for i, s := range steps {
			m.trackConn(a, s.state)
			if got := testutil.ToFloat64(m.inFlight); got != s.want {
				t.Fatalf("step %d (%v): %v active, want %v", i, s.state, got, s.want)
			}
		}
		m.trackConn(pa, http.StateActive) // a connection no listener of Main accepted is not counted
		if got := testutil.ToFloat64(m.inFlight); got != 0 {
			t.Fatalf("%v active after an untracked connection's request, want 0", got)
		}
		m.trackConn(b, http.StateActive)
		m.trackConn(b, http.StateHijacked)
		if got := testutil.ToFloat64(m.inFlight); got != 0 {
			t.Fatalf("%v active after a hijack, want 0", got)
		}
		m.trackConn(b, http.StateClosed) // after a hijack net/http says nothing more; a late close changes nothing
		if got := testutil.ToFloat64(m.inFlight); got != 0 {
			t.Fatalf("%v active, want 0", got)
		}
	})

	t.Run("many connections changing state at once add up", func(t *testing.T) {
		t.Parallel()
		m := NewMain(config.Default(), NewLogger(io.Discard, "error"))
		var wg sync.WaitGroup
		conns := make([]net.Conn, 64)
		for i := range conns {
			pa, pb := net.Pipe()
			t.Cleanup(func() { pa.Close(); pb.Close() })
			a := &trackedConn{Conn: pa}
			conns[i] = a
			wg.Go(func() {
				m.trackConn(a, http.StateNew)
				for range 100 {
					m.trackConn(a, http.StateActive)
					m.trackConn(a, http.StateIdle)
				}
				m.trackConn(a, http.StateActive)
			})
		}
		wg.Wait()
		if got := testutil.ToFloat64(m.inFlight); got != 64 {
			t.Fatalf("%v active, want the 64 connections mid-request", got)
		}
		for _, c := range conns {
			wg.Go(func() { m.trackConn(c, http.StateClosed) })
		}
		wg.Wait()
		if got := testutil.ToFloat64(m.inFlight); got != 0 {
			t.Fatalf("%v active once all closed, want 0", got)
		}
	})
}

func TestTrackedConnHalfCloses(t *testing.T) {
	t.Parallel()

	// net/http half-closes a connection whose request body went over its limit before
	// it closes it, so that the client reads the answer; the wrappers of the public
	// listener's connections must pass that on.
	t.Run("a half-close through the wrappers reaches the socket, and the answer still flows", func(t *testing.T) {
		t.Parallel()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		wrapped := trackedListener{api.LimitConnections(ln, 4, prometheus.NewRegistry())}
		client, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer client.Close()
		server, err := wrapped.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer server.Close()
		if _, err := server.Write([]byte("answer")); err != nil {
			t.Fatal(err)
		}
		if err := server.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
			t.Fatalf("CloseWrite: %v", err)
		}
		got, err := io.ReadAll(client) // ends only at the half-close's end of stream
		if err != nil || string(got) != "answer" {
			t.Fatalf("client read %q, %v; want the answer then the end of the stream", got, err)
		}
		if _, err := client.Write([]byte("x")); err != nil { // the other half is still open
			t.Fatalf("client write after the half-close: %v", err)
		}
		buf := make([]byte, 1)
		if _, err := io.ReadFull(server, buf); err != nil {
			t.Fatalf("server read after its half-close: %v", err)
		}
	})
}
