package app

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/open-feature/go-sdk/openfeature"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/space-sandbox/space/internal/admission"
	"github.com/space-sandbox/space/internal/api"
	"github.com/space-sandbox/space/internal/apikey"
	"github.com/space-sandbox/space/internal/config"
	"github.com/space-sandbox/space/internal/dispatcher"
	"github.com/space-sandbox/space/internal/flags"
	"github.com/space-sandbox/space/internal/idempotency"
	"github.com/space-sandbox/space/internal/metric"
	"github.com/space-sandbox/space/internal/pool"
	"github.com/space-sandbox/space/internal/replicas"
	"github.com/space-sandbox/space/internal/sandbox"
	"github.com/space-sandbox/space/internal/store"
	"github.com/space-sandbox/space/internal/substrate"
	"github.com/space-sandbox/space/internal/substrate/kubernetes"
)

// domain wires the components of the create path (docs/design.md, "The create path")
// onto m's Postgres and Redis: flags, admission, the substrate, the warm pool and the
// sandbox flow.
func (m *Main) domain(ctx context.Context) (api.Options, error) {
	cfg := m.Config
	opts := api.Options{}

	templates, err := substrate.OpenTemplates(substrate.TemplateStoreOptions{
		Path:         cfg.Sandbox.TemplatesFile,
		PollInterval: cfg.Sandbox.TemplatesPollInterval,
		Check:        m.checkTemplates,
		Registerer:   m.Registry,
		Logger:       m.Logger,
		OnReload:     m.OnTemplatesReload,
	})
	if err != nil {
		return opts, err
	}
	m.Templates = templates

	flagClient, provider, err := m.flags(ctx)
	if err != nil {
		return opts, err
	}
	var version func() uint64
	if provider != nil {
		version = provider.Version
	}
	m.Resolver = flags.NewResolver(flags.ResolverOptions{
		Client:     flagClient,
		Version:    version,
		Env:        m.flagsEnv(),
		Logger:     m.Logger,
		Registerer: m.Registry,
	})
	if provider != nil {
		// A new quota flag is parsed before the file is in service, so that a reload's
		// signal (OnFlagsReload) means its limits are what requests meet.
		provider.Prepare(m.Resolver.Prepare)
	}

	// The roster of live replicas, in Postgres: how many share the cluster bucket, so
	// that while Redis cannot decide each fails open within its share of it.
	m.Roster, err = replicas.New(replicas.Options{DB: store.Wrap(m.DB), Registerer: m.Registry, Logger: m.Logger.With("component", "replicas")})
	if err != nil {
		return opts, err
	}

	// One breaker for every Redis call on this replica's request path: once Redis is
	// known to be down, the failure mode applies at once instead of after a timeout
	// per call.
	m.Breaker = admission.NewBreaker(admission.BreakerOptions{Registerer: m.Registry, Logger: m.Logger})
	m.Admitter, err = admission.New(admission.Options{
		Redis:         m.Redis,
		Prefix:        m.RedisPrefix,
		Enabled:       cfg.Admission.Enabled,
		Cluster:       cfg.Admission.Cluster,
		FailClosed:    cfg.Admission.FailureMode == config.FailClosed,
		Shadow:        cfg.Admission.Shadow,
		Timeout:       cfg.Redis.Timeout,
		BatchAbove:    cfg.Redis.BatchAbove,
		RefusalMaxAge: cfg.Admission.RefusalCacheMaxAge,
		Reservations:  m.Resolver.Reservations,
		Replicas:      m.Roster.Count,
		Breaker:       m.Breaker,
		Registerer:    m.Registry,
		BudgetKeys:    metric.NewKeys(cfg.MetricsBudgetKeys),
		Logger:        m.Logger,
	})
	if err != nil {
		return opts, fmt.Errorf("admission: %w", err)
	}
	concurrency, err := admission.NewConcurrencyLimiter(admission.ConcurrencyOptions{
		Redis:         m.Redis,
		Prefix:        m.RedisPrefix,
		Timeout:       cfg.Redis.Timeout,
		PipelineAbove: cfg.Redis.PipelineAbove,
		Breaker:       m.Breaker,
		FailClosed:    cfg.Admission.FailureMode == config.FailClosed,
		Registerer:    m.Registry,
		Logger:        m.Logger,
	})
	if err != nil {
		return opts, fmt.Errorf("concurrency limiter: %w", err)
	}
	m.onClose(func(context.Context) error { concurrency.Close(); return nil })

	sub, err := m.substrate()
	if err != nil {
		return opts, err
	}
	m.Substrate = sub
	m.Pool = pool.New(pool.Options{DB: m.DB, Substrate: sub, Targets: m.poolTargets, Registerer: m.Registry, Logger: m.Logger})
	m.PoolView = pool.NewView(pool.ViewOptions{DB: m.DB, Targets: m.poolTargets, Logger: m.Logger, OnChange: m.onPoolView})
	catalog := sandbox.Catalog{Templates: templates, Max: cfg.Sandbox.MaxShape}
	m.Replenisher = pool.NewReplenisher(pool.ReplenisherOptions{
		Pool: m.Pool, Substrate: sub, Resolve: catalog.Resolve, Charger: m.Admitter,
		Reserve:    refillReserve(cfg.Pool.RefillReserve, cfg.Admission.Cluster.Burst),
		Targets:    m.poolTargets,
		Registerer: m.Registry,
		Logger:     m.Logger,
	})
	m.Sandboxes = sandbox.New(sandbox.Options{
		DB: m.DB, Pool: m.Pool, Substrate: sub, Charger: m.Admitter, View: m.PoolView,
		Catalog:        catalog,
		IdempotencyTTL: cfg.IdempotencyKeyTTL,
		OnClaim:        m.Replenisher.Kick,
		Registerer:     m.Registry,
		Logger:         m.Logger,
	})
	operations, err := m.dispatcher(ctx)
	if err != nil {
		return opts, err
	}
	opts.Operations = operations
	if cfg.Dispatcher.UI {
		if opts.RiverUI, err = m.riverUI(operations); err != nil {
			return opts, err
		}
	}
	m.Reconciler, err = sandbox.NewReconciler(sandbox.ReconcilerOptions{
		Service:  m.Sandboxes,
		Interval: cfg.Reconcile.Interval,
		Grace:    cfg.Reconcile.Grace,
		// Purging expired idempotency keys is housekeeping rather than settling (an
		// expired key names nothing whether or not it is deleted), but it wants the
		// same one-replica-at-a-time round.
		Also: []func(context.Context) (int, error){operations.SettleLost, operations.Tidy, m.purgeIdempotencyKeys,
			store.NewPurger(store.Wrap(m.DB), m.Registry, sandbox.Retained(cfg.Retention.Sandboxes), dispatcher.Retained(cfg.Retention.Operations)).Purge},
		Registerer: m.Registry,
		Logger:     m.Logger.With("component", "reconciler"),
	})
	if err != nil {
		return opts, err
	}

	m.Lifecycle, err = sandbox.NewLifecycle(sandbox.LifecycleOptions{
		Service:    m.Sandboxes,
		Interval:   cfg.Lifecycle.Interval,
		Resolve:    m.Resolver.Resolve,
		Registerer: m.Registry,
		Logger:     m.Logger.With("component", "lifecycle"),
	})
	if err != nil {
		return opts, err
	}

	if opts.Auth, err = m.authenticator(); err != nil {
		return opts, err
	}
	opts.Callers = m.Resolver
	opts.Tiers = m.Resolver
	opts.Concurrency = concurrency
	opts.Budgets = m.Admitter
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
		Redis:         m.Redis,
		Prefix:        m.RedisPrefix + ":auth_failures",
		Rate:          cfg.FailureRate,
		Timeout:       m.Config.Redis.Timeout,
		PipelineAbove: m.Config.Redis.PipelineAbove,
		Breaker:       m.Breaker,
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

// flagsEnv is the configuration the flags are served under: the layer below them, and
// what the quota flag is held to at every load.
func (m *Main) flagsEnv() flags.Env {
	cfg := m.Config
	return flags.Env{
		AdmissionEnabled: cfg.Admission.Enabled,
		Cluster:          cfg.Admission.Cluster,
		ClientRate:       cfg.Admission.Client,
		OwnKeys:          cfg.Auth.Mode == config.AuthAPIKey,
		FallbackTier:     cfg.Flags.FallbackTier,
	}
}

// flags sets up the OpenFeature provider of SPACE_FLAGS_FILE under a domain of this
// Main's own (several Mains share a process in tests) and returns its client and the
// provider; nil when no file is configured.
func (m *Main) flags(ctx context.Context) (*openfeature.Client, *flags.FileProvider, error) {
	if m.Config.Flags.File == "" {
		return nil, nil, nil
	}
	provider, err := flags.NewFileProvider(flags.FileProviderOptions{
		Path:         m.Config.Flags.File,
		PollInterval: m.Config.Flags.PollInterval,
		Logger:       m.Logger,
		Registerer:   m.Registry,
		OnReload:     m.OnFlagsReload,
		Env:          m.flagsEnv(),
	})
	if err != nil {
		return nil, nil, fmt.Errorf("SPACE_FLAGS_FILE: %w", err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	domain := "space-api-" + hex.EncodeToString(b[:])
	if err := openfeature.SetNamedProviderWithContextAndWait(ctx, domain, provider); err != nil {
		return nil, nil, fmt.Errorf("SPACE_FLAGS_FILE: start provider: %w", err)
	}
	m.onClose(func(context.Context) error {
		provider.Shutdown()
		return nil
	})
	return openfeature.NewClient(domain), provider, nil
}

func (m *Main) poolTargets(ctx context.Context) ([]pool.Target, error) {
	ts, err := m.Resolver.PoolTargets(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]pool.Target, len(ts))
	for i, t := range ts {
		out[i] = pool.Target{Shape: t.Shape, Min: t.Min, Max: t.Max}
	}
	return out, nil
}

// refillReserve is the tokens of SPACE_POOL_REFILL_RESERVE: share of the cluster
// bucket's burst, rounded up, so that any share above 0 reserves at least a token.
func refillReserve(share float64, burst int64) int64 {
	return int64(math.Ceil(share * float64(burst)))
}

// checkTemplates refuses, at start and at every reload of the templates file, the
// templates this replica could not serve: one whose pod spec does not decode (the
// kubernetes substrate), and one whose activation cost is above a bucket's burst, which
// could never be admitted. A reload refused here keeps the last good templates.
func (m *Main) checkTemplates(ts substrate.Templates) error {
	if m.Config.Sandbox.Substrate == kubernetes.Name {
		if err := kubernetes.CheckTemplates(ts); err != nil {
			return err
		}
	}
	a := m.Config.Admission
	if !a.Enabled {
		return nil
	}
	for _, name := range ts.Names() {
		cost := int64(ts[name].ActivationCost())
		if cost > a.Cluster.Burst {
			return fmt.Errorf("template %q: activation_cost %d is above the cluster_activation bucket's burst %d (SPACE_CLUSTER_ACTIVATION_ADMISSION_BURST): it could never be admitted", name, cost, a.Cluster.Burst)
		}
		if a.Client != nil && cost > a.Client.Burst {
			return fmt.Errorf("template %q: activation_cost %d is above the client_activation bucket's burst %d (SPACE_CLUSTER_ACTIVATION_ADMISSION_CLIENT_BURST): it could never be admitted", name, cost, a.Client.Burst)
		}
	}
	return nil
}

func (m *Main) substrate() (substrate.Substrate, error) {
	switch m.Config.Sandbox.Substrate {
	case kubernetes.Name:
		k := m.Config.Kubernetes
		sub, err := kubernetes.Connect(kubernetes.Cluster{Kubeconfig: k.Kubeconfig, Namespace: k.Namespace, QPS: k.QPS, Burst: k.Burst},
			kubernetes.Options{ReadyTimeout: k.ReadyTimeout, StorageClass: k.StorageClass, SnapshotClass: k.SnapshotClass,
				MountPath: k.MountPath, SoftBreachPriorityClass: k.SoftBreachPriorityClass, Logger: m.Logger})
		if errors.Is(err, kubernetes.ErrNoNamespace) {
			return nil, &config.VarError{Var: config.EnvKubernetesNamespace, Accepts: "the namespace that holds sandbox Pods: neither the service account nor the kubeconfig context names one"}
		}
		return sub, err
	default: // "simulated"; config.Load accepts nothing else
		c := m.Config.Sandbox
		d := c.SimulatedColdStart
		return substrate.NewSimulated(substrate.SimulatedOptions{Latency: map[substrate.Op]time.Duration{
			substrate.OpStartCold: d, substrate.OpWarm: d, substrate.OpRestore: d, substrate.OpSnapshot: d,
			substrate.OpAdopt: d / 10,
		}, StateDir: c.SimulatedStateDir, Timeout: c.SimulatedTimeout}), nil
	}
}

// purgeIdempotencyKeys deletes expired idempotency keys, a batch a round.
func (m *Main) purgeIdempotencyKeys(ctx context.Context) (int, error) {
	return idempotency.Purge(ctx, m.DB)
}
