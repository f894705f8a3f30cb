// Package flags is space-api's OpenFeature wiring: the flags-file provider, and the
// Resolver that turns the quota flag into a caller's bounded identity and the limits
// enforced on it (docs/design.md, "Flags and limits"; the flag's format is in
// docs/contract.md, "Flags").
//
// # The file provider
//
// FileProvider is an OpenFeature provider that serves SPACE_FLAGS_FILE, a file in
// flagd's flag-definition format with static defaultVariant values only (a flag with
// targeting rules is refused, naming the flag; parseFlagsFile lists what else flagd's
// schema accepts and refuses). It polls the file by content hash
// (SPACE_FLAGS_POLL_INTERVAL, 2s by default), so an atomic rename and a Kubernetes
// ConfigMap update (the ..data symlink swap) are both picked up, emits
// PROVIDER_CONFIGURATION_CHANGED on a change, and keeps the last good flags when a new file is invalid or missing (logged,
// space_flags_reloads_total{result="error"}). Validators run at every load, so a quota
// flag that is malformed as a whole never reaches the Resolver. Any other OpenFeature
// provider can replace it: the Resolver only needs an *openfeature.Client.
//
// # The Resolver
//
// Resolve evaluates the quota flag once per request, with the client id as the
// OpenFeature targetingKey (a flag change applies to the next request), maps the
// authenticated client id through the allowlist to its budget key (anything not on it
// is space.Unknown) and layers the limits field by field, the most specific winning:
// the key's "rate" entry, its "clients" entry, its tier, the flag's "default", then the
// environment and the built-in Defaults. A "rate" entry replaces the env client rate
// (null exempts the key; a malformed entry falls back to the env rate with a warning at
// most once a minute per key), and only while admission is enabled. The Caller it
// returns is what the activation flow charges: Caller.Charge is the space.Charge that
// admission's Admitter.Charge takes.
//
// # Wiring
//
//	provider, err := flags.NewFileProvider(flags.FileProviderOptions{
//		Path: cfg.Flags.File, PollInterval: cfg.Flags.PollInterval, Logger: log, Registerer: reg, Env: env,
//	})
//	if err != nil { ... } // a configuration error naming SPACE_FLAGS_FILE
//	err = openfeature.SetNamedProviderWithContextAndWait(ctx, domain, provider) // starts polling
//	resolver := flags.NewResolver(flags.ResolverOptions{
//		Client: openfeature.NewClient(domain), Env: env, Logger: log, Registerer: reg,
//	})
//	caller := resolver.Resolve(ctx, clientID) // the authenticated id
//	charged, err := admitter.Charge(ctx, caller.Charge(template.ActivationCost()))
//
// Tests use isolated.NewAPI() (go-sdk ≥ 1.20) for an OpenFeature API of their own
// instead of the global one, so that they run in parallel.
package flags
