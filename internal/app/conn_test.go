package app

import (
	"io"
	"net"
	"net/http"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/space-sandbox/space/internal/config"
)

func TestActiveConnections(t *testing.T) {
	t.Parallel()

	t.Run("a connection counts while a request is in flight on it, and is forgotten when it closes", func(t *testing.T) {
		t.Parallel()
		m := NewMain(config.Default(), NewLogger(io.Discard, "error"))
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
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
		if _, ok := m.connState.Load(a); ok {
			t.Fatal("a closed connection is still tracked")
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
			a, b := net.Pipe()
			t.Cleanup(func() { a.Close(); b.Close() })
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
