package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/admission"
	"github.com/space-sandbox/space/internal/api"
	"github.com/space-sandbox/space/internal/apikey"
	"github.com/space-sandbox/space/internal/config"
	"github.com/space-sandbox/space/internal/flags"
	"github.com/space-sandbox/space/internal/pool"
	"github.com/space-sandbox/space/internal/redisconn"
	"github.com/space-sandbox/space/internal/reload"
	"github.com/space-sandbox/space/internal/replicas"
	"github.com/space-sandbox/space/internal/sandbox"
	"github.com/space-sandbox/space/internal/store"
	"github.com/space-sandbox/space/internal/substrate"
)

// Main is the whole service, wired: end-to-end tests start it on ":0" with a config of
// their own and talk to it over HTTP, exactly as clients do.
type Main struct {
	Config   config.Config
	Logger   *slog.Logger
	Registry *prometheus.Registry

	// RedisPrefix namespaces every Redis key (SPACE_REDIS_KEY_PREFIX, default "space",
	// the design's keys); tests set a prefix of their own so that servers can share one
	// Redis.
	RedisPrefix string
	// OnFlagsReload, when set before Run, is told of every flags file reload: tests
	// wait on it instead of sleeping.
	OnFlagsReload func(flags.ReloadResult)
	// OnPoolView, when set before Run, is told of every change of the warm pool view
	// (internal/pool.View).
	OnPoolView func()
	// OnTemplatesReload, when set before Run, is told of every reload of the templates
	// file that saw something new.
	OnTemplatesReload func(reload.Result)

	DB          *pgxpool.Pool
	Redis       redis.UniversalClient // *redis.Client or *redis.ClusterClient (internal/redisconn)
	API         *api.Server
	Resolver    *flags.Resolver
	Admitter    *admission.Admitter
	Breaker     *admission.Breaker
	Substrate   substrate.Substrate
	Templates   *substrate.TemplateStore
	Pool        *pool.Pool
	PoolView    *pool.View
	Replenisher *pool.Replenisher
	Reconciler  *sandbox.Reconciler
	Lifecycle   *sandbox.Lifecycle
	Roster      *replicas.Roster
	Sandboxes   *sandbox.Service
	Keys        *apikey.Store // api_key mode only

	publicLn, internalLn net.Listener
	public, internal     *http.Server
	serveErr             chan error

	// inFlight counts connections with a request being read or answered
	// (space_http_active_connections); Shutdown itself waits for the requests, not
	// for this gauge.
	inFlight prometheus.Gauge

	// noReplenisher leaves the warm pool to the test that drives it round by round;
	// noReconciler does the same for the reconciler, noLifecycle for the lifecycle.
	noReplenisher, noReconciler, noLifecycle bool
	// readHeaderTimeout is how long a client may take to send its headers (5s); tests
	// shorten it.
	readHeaderTimeout time.Duration

	closeOnce sync.Once
	closeErr  error
	// closers run in reverse order on Close, after the listeners have drained.
	closers []func(context.Context) error
}

// NewMain returns a Main for cfg; nothing is opened until Run.
func NewMain(cfg config.Config, logger *slog.Logger) *Main {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	inFlight := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "space_http_active_connections",
		Help: "Connections with a request in flight, both listeners.",
	})
	reg.MustRegister(inFlight, buildInfo())
	return &Main{Config: cfg, Logger: logger, Registry: reg, RedisPrefix: cfg.Redis.KeyPrefix, inFlight: inFlight, readHeaderTimeout: 5 * time.Second, serveErr: make(chan error, 2)}
}

// Run opens the dependencies, refuses an unmigrated database, starts the listeners and
// returns once both are accepting connections. Call Close to stop.
func (m *Main) Run(ctx context.Context) error {
	cfg := m.Config

	db, err := store.Open(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	m.DB = db
	m.onClose(func(context.Context) error { db.Close(); return nil })
	if err := store.CheckMigrated(ctx, db); err != nil {
		return err
	}

	// Redis is asked what it is, but an outage at start is a Redis outage like any
	// other (admission fails open, /readyz says so), not a reason to crash-loop: only
	// settings that cannot work stop the start (internal/redisconn).
	rdb, err := redisconn.Open(ctx, cfg.Redis, m.Logger)
	if err != nil {
		return err
	}
	m.Redis = rdb
	m.onClose(func(context.Context) error { return rdb.Close() })

	opts, err := m.domain(ctx)
	if err != nil {
		return err
	}
	opts.Logger, opts.Registry, opts.MaxBodyBytes = m.Logger, m.Registry, cfg.Sandbox.MaxBodyBytes
	opts.Checks = append([]api.Check{
		{Name: "postgres", Check: db.Ping},
		// With fail-open admission the replica serves without Redis (admitting within
		// its own view of the buckets, counted): Redis down is degraded, not unready.
		{Name: "redis", Check: func(ctx context.Context) error { return m.Redis.Ping(ctx).Err() },
			Degrades: cfg.Admission.FailureMode == config.FailOpen},
	}, opts.Checks...)
	opts.Identity = space.IdentityMode(cfg.Auth.Mode)
	opts.RefusalPace = cfg.Admission.RefusalPace
	opts.Gate = api.GateOptions{Seats: cfg.Overload.MaxInFlight, MaxQueue: cfg.Overload.MaxQueued,
		MaxQueuePerKey: cfg.Overload.MaxQueuedPerClient, MaxWait: cfg.Overload.MaxQueueWait}
	if opts.Gate.Seats == 0 {
		opts.Gate.Seats = -1 // SPACE_MAX_IN_FLIGHT=0: no bound
	}
	m.API = api.New(opts)

	// Counted before serving, so that a replica that starts during a Redis outage
	// fails open within its share from its first create; a failed heartbeat is logged
	// and the next one tries again.
	m.Roster.Beat(ctx) //nolint:errcheck // logged by the roster
	if err := m.listen(); err != nil {
		return err
	}
	m.background(func(ctx context.Context) { m.Roster.Run(ctx, nil) })
	if !m.noReplenisher {
		m.background(func(ctx context.Context) { m.Replenisher.Run(ctx, nil) })
	}
	if !m.noReconciler {
		m.background(func(ctx context.Context) { m.Reconciler.Run(ctx, nil) })
	}
	if !m.noLifecycle {
		m.background(func(ctx context.Context) { m.Lifecycle.Run(ctx, nil) })
	}
	m.background(m.PoolView.Run)
	m.background(func(ctx context.Context) { m.Pool.RunDemand(ctx, pool.DefaultDemandFlush) })
	m.background(m.Templates.Run)
	m.Logger.Info("space-api serving", "version", Version(),
		"public", m.publicLn.Addr().String(), "internal", m.internalLn.Addr().String())
	return nil
}

func (m *Main) listen() error {
	var err error
	if m.publicLn, err = net.Listen("tcp", m.Config.HTTPAddr); err != nil {
		return fmt.Errorf("listen SPACE_HTTP_ADDR %s: %w", m.Config.HTTPAddr, err)
	}
	if m.internalLn, err = net.Listen("tcp", m.Config.InternalHTTPAddr); err != nil {
		m.publicLn.Close()
		return fmt.Errorf("listen SPACE_INTERNAL_HTTP_ADDR %s: %w", m.Config.InternalHTTPAddr, err)
	}
	m.publicLn = trackedListener{api.LimitConnections(m.publicLn, m.Config.Overload.MaxConnections, m.Registry)}
	m.internalLn = trackedListener{m.internalLn}
	m.public = newHTTPServer(m.API.Public(), m.Logger, m.readHeaderTimeout)
	m.internal = newHTTPServer(m.API.Internal(), m.Logger, m.readHeaderTimeout)
	m.public.ConnState, m.internal.ConnState = m.trackConn, m.trackConn
	for _, s := range []struct {
		srv *http.Server
		ln  net.Listener
	}{{m.public, m.publicLn}, {m.internal, m.internalLn}} {
		go func() {
			if err := s.srv.Serve(s.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				m.Logger.Error("listener failed", "addr", s.ln.Addr().String(), "err", err)
				m.serveErr <- err
			}
		}()
	}
	return nil
}

// newHTTPServer sets the timeouts that keep a slow or malicious client from holding a
// connection forever (slowloris): headers within 5s, a whole request within 30s.
// WriteTimeout is generous because a synchronous create waits for a cold start.
func newHTTPServer(h http.Handler, logger *slog.Logger, readHeaderTimeout time.Duration) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      2 * time.Minute,
		IdleTimeout:       2 * time.Minute,
		// Above api.DefaultMaxHeaderBytes, so that oversized headers up to this size get
		// the handler's 431 problem+json; beyond it net/http answers in plain text.
		MaxHeaderBytes: 1 << 20,
		ErrorLog:       slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
}

// trackConn keeps inFlight: +1 when a connection starts a request, -1 when it leaves
// that state. The state of each connection lives in it (trackedConn), swapped at each
// change: a kept-alive connection changes state twice a request, and a map of every
// connection's state (a sync.Map keyed by the connection) cost its lookups 2% of a
// refused create's CPU (docs/benchmarks.md, "A refusal beside bare chi: the answer,
// and the rest").
func (m *Main) trackConn(c net.Conn, state http.ConnState) {
	tc, ok := c.(*trackedConn)
	if !ok {
		return // not accepted by a trackedListener: none of the listeners'
	}
	prev := http.ConnState(tc.state.Swap(int32(state)))
	if prev == http.StateActive && state != http.StateActive {
		m.inFlight.Dec()
	}
	if state == http.StateActive && prev != http.StateActive {
		m.inFlight.Inc()
	}
}

// trackedListener wraps each connection it accepts in a trackedConn.
type trackedListener struct{ net.Listener }

func (l trackedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &trackedConn{Conn: c}, nil
}

// trackedConn is an accepted connection and the http.ConnState trackConn last saw of
// it (http.StateNew, 0, until the first).
type trackedConn struct {
	net.Conn
	state atomic.Int32
}

// CloseWrite half-closes the connection beneath when it can: net/http does so before
// it closes a connection whose request body went over its limit, so that the client
// reads the answer rather than a reset.
func (c *trackedConn) CloseWrite() error { return api.CloseWrite(c.Conn) }

func (m *Main) onPoolView() {
	if m.OnPoolView != nil {
		m.OnPoolView()
	}
}

// PublicURL is the base URL of the public listener, e.g. http://127.0.0.1:41234.
func (m *Main) PublicURL() string { return "http://" + m.publicLn.Addr().String() }

// InternalURL is the base URL of the internal listener.
func (m *Main) InternalURL() string { return "http://" + m.internalLn.Addr().String() }

// Err receives a listener's failure after Run; nil channel reads block forever.
func (m *Main) Err() <-chan error { return m.serveErr }

// Serve waits, after Run, until ctx ends (SIGTERM) or a listener dies, then closes.
// A dead listener is an error even when the close goes well: a replica serving on one
// listener only must exit non-zero, so that Kubernetes restarts it rather than leave
// it half up.
func (m *Main) Serve(ctx context.Context) error {
	select {
	case <-ctx.Done():
		m.Logger.Info("shutting down")
		return m.Close()
	case err := <-m.serveErr:
		m.Logger.Error("a listener failed; shutting down", "err", err)
		return errors.Join(fmt.Errorf("listener failed: %w", err), m.Close())
	}
}

func (m *Main) onClose(f func(context.Context) error) { m.closers = append(m.closers, f) }

// background runs f until Close, which cancels its context and waits for it to return
// (after the listeners have drained).
func (m *Main) background(f func(ctx context.Context)) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(ctx)
	}()
	m.onClose(func(closeCtx context.Context) error {
		cancel()
		select {
		case <-done:
			return nil
		case <-closeCtx.Done():
			return fmt.Errorf("background work did not stop: %w", closeCtx.Err())
		}
	})
}

// Close shuts down gracefully within Config.ShutdownTimeout: readiness turns 503, the
// listeners stop accepting and drain in-flight requests, then background work stops and
// the dependencies close. It is safe to call more than once.
func (m *Main) Close() error {
	m.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), m.Config.ShutdownTimeout)
		defer cancel()
		if m.API != nil {
			m.API.Drain()
		}
		var errs []error
		for _, s := range []*http.Server{m.public, m.internal} {
			if s != nil {
				if err := s.Shutdown(ctx); err != nil {
					errs = append(errs, fmt.Errorf("drain listener: %w", err))
				}
			}
		}
		for i := len(m.closers) - 1; i >= 0; i-- {
			if err := m.closers[i](ctx); err != nil {
				errs = append(errs, err)
			}
		}
		m.closeErr = errors.Join(errs...)
	})
	return m.closeErr
}
