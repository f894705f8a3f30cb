package api

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/space-sandbox/space"
)

// gated is a Server whose gate has the test's options, and whose GET of a sandbox
// holds its seat until the test lets it go: work in flight, under the test's control.
type gated struct {
	*handlers
	reg     *prometheus.Registry
	mu      sync.Mutex
	holding map[string]chan struct{} // by client: closed to let its requests finish
	started chan string              // the client of each request that got to work
}

func setupGated(t *testing.T, opts GateOptions) *gated {
	t.Helper()
	g := &gated{handlers: &handlers{t: t, sandboxes: &fakeSandboxes{owner: "acme"}, operations: &fakeOperations{}, leases: &fakeLeases{},
		callers: &fakeCallers{}, tiers: &fakeTiers{}}, reg: prometheus.NewRegistry(),
		holding: map[string]chan struct{}{}, started: make(chan string, 1000)}
	g.sandboxes.get = func(client space.ClientID, _ string) (*space.Sandbox, error) {
		g.started <- string(client)
		<-g.hold(string(client))
		return running, nil
	}
	s := New(Options{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Registry: g.reg,
		Identity: space.IdentityTrustedHeader,
		Auth:     &TrustedHeader{Trusted: []netip.Prefix{netip.MustParsePrefix("192.0.2.1/32")}},
		Callers:  g.callers, Tiers: g.tiers, Concurrency: g.leases, Budgets: fakeBudgets{},
		Sandboxes: g.sandboxes, Operations: g.operations, Gate: opts,
	})
	g.server, g.public, g.internal = s, s.Public(), s.Internal()
	return g
}

func (g *gated) hold(client string) chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	c, ok := g.holding[client]
	if !ok {
		c = make(chan struct{})
		g.holding[client] = c
	}
	return c
}

// get sends a GET of a sandbox as client, in the background, on ctx; its answer
// comes on the channel.
func (g *gated) get(ctx context.Context, client string) <-chan *httptest.ResponseRecorder {
	out := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		r := httptest.NewRequest("GET", "/v1/sandboxes/"+running.ID, nil).WithContext(ctx)
		r.RemoteAddr = "192.0.2.1:40000"
		r.Header.Set(HeaderClientID, client)
		w := httptest.NewRecorder()
		g.public.ServeHTTP(w, r)
		out <- w
	}()
	return out
}

// waitQueued waits until n requests wait for a seat.
func (g *gated) waitQueued(n int) {
	g.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		g.server.gate.mu.Lock()
		q := g.server.gate.queued
		g.server.gate.mu.Unlock()
		if q == n {
			return
		}
		if time.Now().After(deadline) {
			g.t.Fatalf("%d requests queued, want %d", q, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestOverload(t *testing.T) {
	t.Parallel()

	t.Run("past its seats a request waits its turn, and the seats go round the keys: a quiet key is served ahead of a flooder's backlog", func(t *testing.T) {
		t.Parallel()
		g := setupGated(t, GateOptions{Seats: 1, MaxWait: time.Minute})
		ctx := context.Background()
		first := g.get(ctx, "flood")
		if c := <-g.started; c != "flood" {
			t.Fatalf("%s got the seat", c)
		}
		var backlog []<-chan *httptest.ResponseRecorder
		for range 5 {
			backlog = append(backlog, g.get(ctx, "flood"))
		}
		g.waitQueued(5)
		quiet := g.get(ctx, "quiet")
		g.waitQueued(6)
		// The flooder's work finishes one request at a time: the seat it frees goes
		// first to its own oldest waiter (its key came first), then to the quiet key.
		close(g.hold("flood"))
		order := []string{<-g.started, <-g.started}
		if order[0] != "flood" || order[1] != "quiet" {
			t.Fatalf("the seats went to %v, want the flooder's next, then the quiet key, not the flooder's whole backlog", order)
		}
		close(g.hold("quiet"))
		for _, c := range append(backlog, first, quiet) {
			if w := <-c; w.Code != http.StatusOK {
				t.Fatalf("a request that waited its turn = %d %s", w.Code, w.Body)
			}
		}
	})

	t.Run("past its key's queue a request is answered 503 overloaded at once, with a Retry-After, and counted", func(t *testing.T) {
		t.Parallel()
		g := setupGated(t, GateOptions{Seats: 1, MaxQueuePerKey: 2, MaxWait: time.Minute})
		ctx := context.Background()
		g.get(ctx, "flood")
		<-g.started
		g.get(ctx, "flood")
		g.get(ctx, "flood")
		g.waitQueued(2)
		w := <-g.get(ctx, "flood")
		p := problemOf(t, w)
		if w.Code != http.StatusServiceUnavailable || p.Code != space.EOVERLOADED || w.Header().Get("Retry-After") == "" {
			t.Fatalf("a request over its key's queue = %d %+v (Retry-After %q), want 503 overloaded", w.Code, p, w.Header().Get("Retry-After"))
		}
		if got := testutil.ToFloat64(g.server.gate.shed.WithLabelValues(shedQueueFull)); got != 1 {
			t.Errorf("space_http_shed_total{reason=queue_full} = %v", got)
		}
		// Another key still has its own queue.
		g.get(ctx, "quiet")
		g.waitQueued(3)
		close(g.hold("flood"))
		close(g.hold("quiet"))
	})

	t.Run("a request waits at most its bound, then is answered 503", func(t *testing.T) {
		t.Parallel()
		g := setupGated(t, GateOptions{Seats: 1, MaxWait: 50 * time.Millisecond})
		ctx := context.Background()
		g.get(ctx, "busy")
		<-g.started
		w := <-g.get(ctx, "late")
		if w.Code != http.StatusServiceUnavailable || problemOf(t, w).Code != space.EOVERLOADED {
			t.Fatalf("a request past its wait = %d %s", w.Code, w.Body)
		}
		if got := testutil.ToFloat64(g.server.gate.shed.WithLabelValues(shedQueueWait)); got != 1 {
			t.Errorf("space_http_shed_total{reason=queue_timeout} = %v", got)
		}
		close(g.hold("busy"))
	})

	t.Run("a waiting request whose caller leaves is dropped unserved, and its place goes on", func(t *testing.T) {
		t.Parallel()
		g := setupGated(t, GateOptions{Seats: 1, MaxWait: time.Minute})
		g.get(context.Background(), "busy")
		<-g.started
		ctx, cancel := context.WithCancel(context.Background())
		left := g.get(ctx, "gone")
		g.waitQueued(1)
		next := g.get(context.Background(), "next")
		g.waitQueued(2)
		cancel()
		<-left
		g.waitQueued(1)
		close(g.hold("busy"))
		if c := <-g.started; c != "next" {
			t.Fatalf("the seat went to %s, want the request still waiting", c)
		}
		close(g.hold("next"))
		if w := <-next; w.Code != http.StatusOK {
			t.Fatalf("next = %d", w.Code)
		}
		if got := testutil.ToFloat64(g.server.gate.shed.WithLabelValues(shedCallerGone)); got != 1 {
			t.Errorf("space_http_shed_total{reason=caller_gone} = %v", got)
		}
		select {
		case c := <-g.started:
			t.Fatalf("the request whose caller left was served (%s)", c)
		default:
		}
	})

	t.Run("a create or a restore waiting on its start gives its seat to the next request in turn", func(t *testing.T) {
		t.Parallel()
		g := setupGated(t, GateOptions{Seats: 1, MaxWait: time.Minute})
		starting := make(chan struct{}, 2)
		g.sandboxes.starting = func(ctx context.Context) {
			space.Idle(ctx) // as the service does once a start has waited on the substrate
			starting <- struct{}{}
			<-g.hold("starts")
		}
		close(g.hold("quiet"))
		answers := make(chan *httptest.ResponseRecorder, 2)
		for _, path := range []string{"/v1/sandboxes", "/v1/sandboxes/" + running.ID + "/restore"} {
			go func() {
				answers <- g.do(g.public, "POST", path, `{"template":"python-3.12","cpu_millis":1000,"memory_mib":2048,"disk_gib":10}`)
			}()
			select {
			case <-starting:
			case <-time.After(10 * time.Second):
				t.Fatalf("POST %s did not reach its start: its seat was not free", path)
			}
			// The one seat went on: another key's request is served while the
			// create or the restore waits on its start.
			select {
			case w := <-g.get(context.Background(), "quiet"):
				if w.Code != http.StatusOK {
					t.Fatalf("a request beside a start = %d %s", w.Code, w.Body)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("a request waited for the seat of POST %s, which waits on its start", path)
			}
		}
		close(g.hold("starts"))
		for range 2 {
			if w := <-answers; w.Code != http.StatusCreated && w.Code != http.StatusOK {
				t.Errorf("a create or restore that gave its seat on = %d %s", w.Code, w.Body)
			}
		}
	})

	t.Run("health checks, the caller's limits and the internal listener are never held", func(t *testing.T) {
		t.Parallel()
		g := setupGated(t, GateOptions{Seats: 1, MaxQueue: 1, MaxWait: time.Minute})
		g.get(context.Background(), "busy")
		<-g.started
		g.get(context.Background(), "busy")
		g.waitQueued(1)
		for _, tc := range []struct {
			handler http.Handler
			path    string
		}{{g.public, "/healthz"}, {g.public, "/v1/limits"}, {g.internal, "/metrics"}, {g.internal, "/healthz"}} {
			if w := g.do(tc.handler, "GET", tc.path, ""); w.Code != http.StatusOK {
				t.Errorf("GET %s with every seat and the queue full = %d", tc.path, w.Code)
			}
		}
		close(g.hold("busy"))
	})
}

func TestLimitConnections(t *testing.T) {
	t.Parallel()

	t.Run("a connection over the bound is closed as it is accepted, and a closed one frees its place", func(t *testing.T) {
		t.Parallel()
		inner, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		reg := prometheus.NewRegistry()
		ln := LimitConnections(inner, 2, reg)
		defer ln.Close()
		accepted := make(chan net.Conn, 10)
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				accepted <- c
			}
		}()
		var clients []net.Conn
		for range 3 {
			c, err := net.Dial("tcp", inner.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			clients = append(clients, c)
		}
		first, second := <-accepted, <-accepted
		// The third was closed by the listener: a read on it ends.
		_ = clients[2].SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := clients[2].Read(make([]byte, 1)); err == nil || strings.Contains(err.Error(), "timeout") {
			t.Fatalf("the connection over the bound reads %v, want it closed", err)
		}
		first.Close()
		c, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		select {
		case got := <-accepted:
			got.Close()
		case <-time.After(10 * time.Second):
			t.Fatal("a connection after one closed was not accepted")
		}
		second.Close()
		for _, c := range clients {
			c.Close()
		}
	})
}
