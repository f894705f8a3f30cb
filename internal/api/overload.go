package api

import (
	"context"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/config"
	"github.com/space-sandbox/space/internal/metric"
)

// Overload bounds the work a replica takes on at once, and shares it fairly between
// budget keys while it is full (GateOptions; docs/operations.md, "Overload").
//
// Past its capacity a server that accepts everything piles up requests, goroutines and
// connections, and every client's latency grows with the pile: a quiet client waits
// in the same queue as a flooder's backlog, and the server answers less than its
// capacity because it spends its CPU on work whose callers have given up. The gate
// keeps Seats requests at work and holds the rest, per budget key, before their body
// is read: when a seat frees it goes to the next key in turn (round robin over the
// keys with requests waiting), so a key that sends one request now and then is
// served ahead of a flooder's backlog, and a flooder holds no more than its turns.
// A request that cannot wait (its key's queue full, every queue full, or held past
// MaxWait) is answered 503 overloaded with a Retry-After at once, for nothing; one
// whose caller has gone while it waited is dropped unserved. Counted in
// space_http_shed_total{reason}.
//
// The gate is the public /v1 routes' only: the internal listener, the health checks
// and a request already at work are never held or shed by it.
type gate struct {
	opts GateOptions

	mu     sync.Mutex
	inUse  int
	queued int
	// waiting holds each key's waiters, oldest first; turns the keys with waiters in
	// the order they get the next seats.
	waiting map[space.ClientKey][]*waiter
	turns   []space.ClientKey

	shed   *prometheus.CounterVec
	seats  prometheus.GaugeFunc
	queue  prometheus.GaugeFunc
	waited prometheus.Histogram
}

// GateOptions size the gate. Zero values take the variables' defaults, config's
// constants named below; Seats < 0 turns the gate off.
type GateOptions struct {
	// Seats is how many requests may be at work at once (SPACE_MAX_IN_FLIGHT,
	// config.DefaultMaxInFlight: 32).
	Seats int
	// MaxQueue bounds the requests waiting in all (SPACE_MAX_QUEUED,
	// config.DefaultMaxQueued: 1024), and MaxQueuePerKey those of one budget key
	// (SPACE_MAX_QUEUED_PER_CLIENT, config.DefaultMaxQueuedPerClient: 32).
	MaxQueue, MaxQueuePerKey int
	// MaxWait is the longest a request waits for a seat (SPACE_MAX_QUEUE_WAIT,
	// config.DefaultMaxQueueWait: 1s): past it, it is answered 503 rather than served
	// late.
	MaxWait time.Duration
}

// waiter is one request waiting for a seat: given closes when it is handed one.
type waiter struct {
	given chan struct{}
	done  bool // handed a seat (under gate.mu)
}

// The reasons of space_http_shed_total.
const (
	shedQueueFull  = "queue_full"
	shedQueueWait  = "queue_timeout"
	shedCallerGone = "caller_gone"
)

func newGate(opts GateOptions, reg prometheus.Registerer) *gate {
	if opts.Seats == 0 {
		opts.Seats = config.DefaultMaxInFlight
	}
	if opts.MaxQueue <= 0 {
		opts.MaxQueue = config.DefaultMaxQueued
	}
	if opts.MaxQueuePerKey <= 0 {
		opts.MaxQueuePerKey = config.DefaultMaxQueuedPerClient
	}
	if opts.MaxWait <= 0 {
		opts.MaxWait = config.DefaultMaxQueueWait
	}
	g := &gate{opts: opts, waiting: map[space.ClientKey][]*waiter{}}
	g.shed = metric.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "space_http_shed_total",
		Help: "Public requests answered 503 overloaded before any work, or dropped, because the replica was at its SPACE_MAX_IN_FLIGHT: queue_full (their key's queue or every queue full), queue_timeout (waited SPACE_MAX_QUEUE_WAIT), caller_gone (the caller left while it waited).",
	}, []string{"reason"}))
	for _, r := range []string{shedQueueFull, shedQueueWait, shedCallerGone} {
		g.shed.WithLabelValues(r)
	}
	g.seats = metric.Register(reg, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "space_http_seats_in_use",
		Help: "Public requests at work, of SPACE_MAX_IN_FLIGHT.",
	}, func() float64 { g.mu.Lock(); defer g.mu.Unlock(); return float64(g.inUse) }))
	g.queue = metric.Register(reg, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "space_http_queued_requests",
		Help: "Public requests waiting for a seat, all budget keys together.",
	}, func() float64 { g.mu.Lock(); defer g.mu.Unlock(); return float64(g.queued) }))
	g.waited = metric.Register(reg, prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "space_http_queue_wait_seconds",
		Help:    "How long the public requests that waited for a seat waited, served or not.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
	}))
	return g
}

// acquire takes a seat for a request of key, waiting its turn when none is free: ""
// when it has one, to give back with release once the request's work is done, or the
// reason the request is shed.
func (g *gate) acquire(ctx context.Context, key space.ClientKey) string {
	g.mu.Lock()
	if g.inUse < g.opts.Seats && g.queued == 0 {
		g.inUse++
		g.mu.Unlock()
		return ""
	}
	if g.queued >= g.opts.MaxQueue || len(g.waiting[key]) >= g.opts.MaxQueuePerKey {
		g.mu.Unlock()
		return shedQueueFull
	}
	w := &waiter{given: make(chan struct{})}
	if len(g.waiting[key]) == 0 {
		g.turns = append(g.turns, key)
	}
	g.waiting[key] = append(g.waiting[key], w)
	g.queued++
	g.mu.Unlock()

	began := time.Now()
	timer := time.NewTimer(g.opts.MaxWait)
	defer timer.Stop()
	var reason string
	select {
	case <-w.given:
		g.waited.Observe(time.Since(began).Seconds())
		return ""
	case <-timer.C:
		reason = shedQueueWait
	case <-ctx.Done():
		reason = shedCallerGone
	}
	g.waited.Observe(time.Since(began).Seconds())
	g.mu.Lock()
	defer g.mu.Unlock()
	if w.done {
		// Handed a seat as it gave up: the seat goes on to the next in turn.
		g.handOn()
		return reason
	}
	g.remove(key, w)
	return reason
}

// release gives a seat back: to the next key in turn when any waits.
func (g *gate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.handOn()
}

// handOn passes a seat being given back to the oldest waiter of the next key in turn,
// or frees it. g.mu is held.
func (g *gate) handOn() {
	for len(g.turns) > 0 {
		key := g.turns[0]
		g.turns = g.turns[1:]
		ws := g.waiting[key]
		w := ws[0]
		if len(ws) == 1 {
			delete(g.waiting, key)
		} else {
			g.waiting[key] = ws[1:]
			g.turns = append(g.turns, key) // its next request waits for its next turn
		}
		g.queued--
		w.done = true
		close(w.given)
		return
	}
	g.inUse--
}

// remove takes waiter w of key out of the queue. g.mu is held.
func (g *gate) remove(key space.ClientKey, w *waiter) {
	ws := g.waiting[key]
	for i, x := range ws {
		if x == w {
			ws = append(ws[:i:i], ws[i+1:]...)
			break
		}
	}
	g.queued--
	if len(ws) > 0 {
		g.waiting[key] = ws
		return
	}
	delete(g.waiting, key)
	for i, k := range g.turns {
		if k == key {
			g.turns = append(g.turns[:i:i], g.turns[i+1:]...)
			break
		}
	}
}

// admitSeat holds a public request until it has a seat, or sheds it: 503 overloaded
// with a jittered Retry-After of a second or two, before its body is read. A caller
// that left while it waited is answered nothing: nobody reads the answer.
func (s *Server) admitSeat(next http.Handler) http.Handler {
	if s.gate == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		shed := s.gate.acquire(r.Context(), callerFrom(r.Context()).Key)
		if shed != "" {
			s.gate.shed.WithLabelValues(shed).Inc()
			if shed == shedCallerGone {
				return
			}
			w.Header().Set("Retry-After", strconv.Itoa(1+rand.IntN(2)))
			writeProblem(w, Problem{
				Type: ProblemType(space.EOVERLOADED), Title: http.StatusText(http.StatusServiceUnavailable),
				Status: http.StatusServiceUnavailable, Code: space.EOVERLOADED, Instance: r.URL.Path, RequestID: RequestID(r.Context()),
				Detail: "this replica is at its capacity and your request would have waited too long for it; retry after the Retry-After delay",
			})
			return
		}
		// The handler may give the seat back before it ends (giveSeatBack, space.Idle
		// from the goroutine that waits on a start): once.
		st := stateFrom(r.Context())
		if st == nil {
			st = &requestState{}
		}
		st.holdSeat(s.gate)
		defer st.giveSeat()
		next.ServeHTTP(w, r)
	})
}

// LimitConnections returns ln accepting at most max connections open at once: one over
// it is closed as soon as it is accepted (the kernel's backlog never holds it), and
// counted in space_http_connections_refused_total. A bound on connections, not on
// requests: a slowloris's connections are cut by the server's header timeout, and this
// keeps their number from exhausting the replica's file descriptors meanwhile.
func LimitConnections(ln net.Listener, max int, reg prometheus.Registerer) net.Listener {
	if max <= 0 {
		return ln
	}
	refused := metric.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "space_http_connections_refused_total",
		Help: "Connections to the public listener closed as they were accepted, the listener being at SPACE_MAX_CONNECTIONS.",
	}))
	return &limitedListener{Listener: ln, slots: make(chan struct{}, max), refused: refused}
}

type limitedListener struct {
	net.Listener
	slots   chan struct{}
	refused prometheus.Counter
}

func (l *limitedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.slots <- struct{}{}:
			return &limitedConn{Conn: c, release: func() { <-l.slots }}, nil
		default:
			l.refused.Inc()
			c.Close()
		}
	}
}

// limitedConn gives its slot back once, when it is closed.
type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// CloseWrite half-closes the connection beneath (see CloseWrite).
func (c *limitedConn) CloseWrite() error { return CloseWrite(c.Conn) }

// CloseWrite half-closes c when it can (a TCP connection, or a wrapper of one that
// says so), and does nothing otherwise. net/http half-closes a connection before it
// closes it after a request body over its limit, so that the client reads the answer
// rather than a reset; a wrapper of the connection that hid the method would turn
// that into a reset.
func CloseWrite(c net.Conn) error {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
