package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/open-feature/go-sdk/openfeature"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/space-sandbox/space/internal/admission"
	"github.com/space-sandbox/space/internal/api"
	"github.com/space-sandbox/space/internal/apikey"
	"github.com/space-sandbox/space/internal/config"
	"github.com/space-sandbox/space/internal/flags"
	"github.com/space-sandbox/space/internal/pool"
	"github.com/space-sandbox/space/internal/sandbox"
	"github.com/space-sandbox/space/internal/substrate"
	"github.com/space-sandbox/space/internal/substrate/kubernetes"
)

// domain wires the components of the create path (docs/design.md) onto m's Postgres and Redis: flags,
// admission, the substrate, the warm pool and the sandbox flow.
func (m *Main) domain(ctx context.Context) (api.Options, error) {
	cfg := m.Config
	opts := api.Options{}

	templates, err := substrate.LoadTemplates(cfg.Sandbox.TemplatesFile)
	if err != nil {
		return opts, err
	}

	flagClient, err := m.flags(ctx)
	if err != nil {
		return opts, err
	}
	m.Resolver = flags.NewResolver(flags.ResolverOptions{
		Client: flagClient,
		Env: flags.Env{
			AdmissionEnabled: cfg.Admission.Enabled,
			Cluster:          cfg.Admission.Cluster,
			ClientRate:       cfg.Admission.Client,
		},
		Logger:     m.Logger,
		Registerer: m.Registry,
	})

	// One breaker for every Redis call on this replica's request path: once Redis is
	// known to be down, the failure mode applies at once instead of after a timeout
	// per call.
	m.Breaker = admission.NewBreaker(admission.BreakerOptions{Registerer: m.Registry, Logger: m.Logger})
	m.Admitter, err = admission.New(admission.Options{
		Redis:      m.Redis,
		Prefix:     m.RedisPrefix,
		Enabled:    cfg.Admission.Enabled,
		Cluster:    cfg.Admission.Cluster,
		FailClosed: cfg.Admission.FailureMode == config.FailClosed,
		Shadow:     cfg.Admission.Shadow,
		Timeout:    cfg.Redis.Timeout,
		Breaker:    m.Breaker,
		Registerer: m.Registry,
		Logger:     m.Logger,
	})
	if err != nil {
		return opts, fmt.Errorf("admission: %w", err)
	}
	concurrency, err := admission.NewConcurrencyLimiter(admission.ConcurrencyOptions{
		Redis:      m.Redis,
		Prefix:     m.RedisPrefix,
		Timeout:    cfg.Redis.Timeout,
		Breaker:    m.Breaker,
		FailClosed: cfg.Admission.FailureMode == config.FailClosed,
		Registerer: m.Registry,
		Logger:     m.Logger,
	})
	if err != nil {
		return opts, fmt.Errorf("concurrency limiter: %w", err)
	}
	m.onClose(func(context.Context) error { concurrency.Close(); return nil })

	sub, err := m.substrate(templates)
	if err != nil {
		return opts, err
	}
	m.Substrate = sub
	m.Pool = pool.New(pool.Options{DB: m.DB, Substrate: sub, Registerer: m.Registry, Logger: m.Logger})
	m.PoolView = pool.NewView(pool.ViewOptions{DB: m.DB, Targets: m.poolTargets, Logger: m.Logger, OnChange: m.onPoolView})
	m.Replenisher = pool.NewReplenisher(pool.ReplenisherOptions{
		Pool: m.Pool, Substrate: sub, Templates: templates, Charger: m.Admitter,
		Targets:    m.poolTargets,
		Registerer: m.Registry,
		Logger:     m.Logger,
	})
	m.Sandboxes = sandbox.New(sandbox.Options{
		DB: m.DB, Pool: m.Pool, Substrate: sub, Charger: m.Admitter, View: m.PoolView,
		Catalog:    sandbox.Catalog{Templates: templates, Max: cfg.Sandbox.MaxShape},
		OnClaim:    m.Replenisher.Kick,
		Registerer: m.Registry,
		Logger:     m.Logger,
	})
	if opts.Operations, err = m.dispatcher(ctx); err != nil {
		return opts, err
	}
	m.Reconciler = sandbox.NewReconciler(sandbox.ReconcilerOptions{
		Service:    m.Sandboxes,
		Interval:   cfg.Reconcile.Interval,
		Grace:      cfg.Reconcile.Grace,
		Also:       []func(context.Context) (int, error){opts.Operations.SettleLost},
		Registerer: m.Registry,
		Logger:     m.Logger.With("component", "reconciler"),
	})

	if opts.Auth, err = m.authenticator(); err != nil {
		return opts, err
	}
	opts.Resolver = m.Resolver
	opts.Concurrency = concurrency
	opts.Admitter = m.Admitter
	opts.Sandboxes = m.Sandboxes
	opts.Checks = append(opts.Checks, api.Check{Name: "substrate", Check: sub.Check, Detail: sub.Describe()})
	return opts, nil
}

// authenticator returns the identity of SPACE_AUTH_MODE.
func (m *Main) authenticator() (api.Authenticator, error) {
	cfg := m.Config.Auth
	if cfg.Mode == config.AuthTrustedHeader {
		untrusted := prometheus.NewCounter(prometheus.CounterOpts{
			Name: "space_auth_untrusted_client_id_total",
			Help: "Requests that sent X-Client-ID from a peer outside SPACE_TRUSTED_PROXY_CIDRS; the header was ignored.",
		})
		m.Registry.MustRegister(untrusted)
		return &api.TrustedHeader{Trusted: cfg.TrustedProxyCIDRs, Untrusted: untrusted}, nil
	}
	failures, err := admission.NewLimiter(admission.LimiterOptions{
		Redis:   m.Redis,
		Prefix:  m.RedisPrefix + ":auth_failures",
		Rate:    cfg.FailureRate,
		Timeout: m.Config.Redis.Timeout,
		Breaker: m.Breaker,
	})
	if err != nil {
		return nil, fmt.Errorf("failed-auth limiter: %w", err)
	}
	rejected := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "space_auth_rejected_total",
		Help: "Refused authentications by reason: missing, invalid (unknown, malformed or revoked key), throttled (too many failures from the address).",
	}, []string{"reason"})
	m.Registry.MustRegister(rejected)
	m.Keys = apikey.NewStore(m.DB, m.Logger)
	return &api.APIKey{Keys: m.Keys, Failures: failures, TrustedProxies: cfg.TrustedProxyCIDRs, Rejected: rejected}, nil
}

// flags sets up the OpenFeature provider of SPACE_FLAGS_FILE under a domain of this
// Main's own (several Mains share a process in tests) and returns its client; nil when
// no file is configured.
func (m *Main) flags(ctx context.Context) (*openfeature.Client, error) {
	if m.Config.Flags.File == "" {
		return nil, nil
	}
	provider, err := flags.NewFileProvider(flags.FileProviderOptions{
		Path:         m.Config.Flags.File,
		PollInterval: m.Config.Flags.PollInterval,
		Logger:       m.Logger,
		Registerer:   m.Registry,
		OnReload:     m.OnFlagsReload,
	})
	if err != nil {
		return nil, fmt.Errorf("SPACE_FLAGS_FILE: %w", err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	domain := "space-api-" + hex.EncodeToString(b[:])
	if err := openfeature.SetNamedProviderWithContextAndWait(ctx, domain, provider); err != nil {
		return nil, fmt.Errorf("SPACE_FLAGS_FILE: start provider: %w", err)
	}
	m.onClose(func(context.Context) error {
		provider.Shutdown()
		return nil
	})
	return openfeature.NewClient(domain), nil
}

func (m *Main) poolTargets(ctx context.Context) ([]pool.Target, error) {
	ts, err := m.Resolver.PoolTargets(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]pool.Target, len(ts))
	for i, t := range ts {
		out[i] = pool.Target{Shape: t.Shape, Target: t.Target}
	}
	return out, nil
}

func (m *Main) substrate(templates substrate.Templates) (substrate.Substrate, error) {
	switch m.Config.Sandbox.Substrate {
	case "kubernetes":
		// A template whose pod spec does not decode fails the start, not the first
		// create of that template.
		if err := kubernetes.CheckTemplates(templates); err != nil {
			return nil, fmt.Errorf("SPACE_TEMPLATES_FILE: %w", err)
		}
		return kubernetes.NewFromEnv(m.Getenv, nil, m.Logger)
	default: // "simulated"; config.Load accepts nothing else
		c := m.Config.Sandbox
		d := c.SimulatedColdStart
		return substrate.NewSimulated(substrate.SimulatedOptions{Latency: map[substrate.Op]time.Duration{
			substrate.OpStartCold: d, substrate.OpWarm: d, substrate.OpRestore: d, substrate.OpSnapshot: d,
			substrate.OpAdopt: d / 10,
		}, StateDir: c.SimulatedStateDir, Timeout: c.SimulatedTimeout}), nil
	}
}
