// Package flags is space-api's OpenFeature wiring: the flags-file provider, and the
// Resolver that turns the quota flag into a caller's bounded identity and the limits
// enforced on it (identity and the concurrency cap of the create path, and flags and limits, in docs/design.md).
//
// # The file provider
//
// FileProvider is an OpenFeature provider that serves SPACE_FLAGS_FILE, a file in
// flagd's flag-definition format with static defaultVariant values only (a flag with
// targeting rules is refused, naming the flag; parseFlagsFile lists what else flagd's
// schema accepts and refuses). It polls the file by content hash
// (SPACE_FLAGS_POLL_INTERVAL, 2s by default), so an atomic rename and a Kubernetes ConfigMap update (the
// ..data symlink swap) are both picked up, emits PROVIDER_CONFIGURATION_CHANGED on a
// change, and keeps the last good flags when a new file is invalid or missing (logged,
// space_flags_reloads_total{result="error"}). Validators run at every load, so a quota
// flag that is malformed as a whole never reaches the Resolver. Any other OpenFeature
// provider can replace it: the Resolver only needs an *openfeature.Client.
//
// # The Resolver
//
// Resolve evaluates the quota flag once per request, with the client id as the
// OpenFeature targetingKey (a flag change applies to the next request), maps the authenticated client id through the allowlist to its budget key (anything not on it is
// space.Unknown) and layers the limits: built-in Defaults, then the flag's "default",
// then the client's entry, field by field; the client activation rate is the env rate
// unless the flag's "rate" object has an entry for the key (a rate replaces it, null
// exempts the key, a malformed entry falls back to the env rate with a warning at most
// once a minute per key), and only while admission is enabled. Caller.ClientRate is
// exactly what admission's Admit must be given.
//
// # Wiring
//
//	provider, err := flags.NewFileProvider(flags.FileProviderOptions{
//		Path: cfg.Flags.File, PollInterval: cfg.Flags.PollInterval, Logger: log, Registerer: reg,
//	})
//	if err != nil { ... } // a configuration error naming SPACE_FLAGS_FILE
//	err = openfeature.SetNamedProviderWithContextAndWait(ctx, domain, provider) // starts polling
//	resolver := flags.NewResolver(flags.ResolverOptions{
//		Client: openfeature.NewClient(domain),
//		Env:    flags.Env{AdmissionEnabled: cfg.Admission.Enabled, Cluster: cfg.Admission.Cluster, ClientRate: cfg.Admission.Client},
//		Logger: log, Registerer: reg,
//	})
//	caller := resolver.Resolve(ctx, clientID) // the authenticated id
//	decision, err := admitter.Admit(ctx, caller.Key, caller.ClientRate)
//
// Tests use isolated.NewAPI() (go-sdk ≥ 1.20) for an OpenFeature API of their own
// instead of the global one, so that they run in parallel.
package flags
