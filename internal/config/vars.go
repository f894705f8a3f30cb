package config

import (
	"strconv"
	"time"

	"github.com/space-sandbox/space"
)

// Var is one environment variable as declared in declare: what Load reads, Default
// applies, and `space-api config` and docs/configuration.md print.
type Var struct {
	// Name is the variable, e.g. SPACE_HTTP_ADDR.
	Name string
	// Group is the component it configures: the section of the docs it is listed in.
	Group string
	// Default is the value an unset variable takes, written as an operator would set
	// it: Load and Default pass it through the same parser as a set value. Empty: an
	// unset variable leaves its field at the zero value, which Unset describes.
	Default string
	// Unset says, for the docs, what an unset variable without a Default means.
	Unset string
	// Required, when not empty, makes the variable required: it says what a value looks
	// like, for the error of a missing one.
	Required string
	// Help is one line on what the variable does.
	Help string
	// Secret keeps the value out of errors; Raw takes it as it is, spaces included
	// (every other value is trimmed). Both are for passwords.
	Secret, Raw bool

	// parse stores a value in the field the variable sets. Parsers run in declaration
	// order, so one may look at what an earlier one stored: the Redis parts override
	// what SPACE_REDIS_URL set.
	parse func(string) error
}

// The names that code outside this package uses, to name the variable to fix in a
// message. Each is the Name of exactly one declaration below.
const (
	EnvDatabaseURL = "SPACE_DATABASE_URL"
	EnvLogLevel    = "SPACE_LOG_LEVEL"

	EnvRedisURL           = "SPACE_REDIS_URL"
	EnvRedisAddrs         = "SPACE_REDIS_ADDRS"
	EnvRedisMode          = "SPACE_REDIS_MODE"
	EnvRedisUsername      = "SPACE_REDIS_USERNAME"
	EnvRedisPassword      = "SPACE_REDIS_PASSWORD"
	EnvRedisPasswordFile  = "SPACE_REDIS_PASSWORD_FILE"
	EnvRedisTLS           = "SPACE_REDIS_TLS"
	EnvRedisTLSCAFile     = "SPACE_REDIS_TLS_CA_FILE"
	EnvRedisTLSServerName = "SPACE_REDIS_TLS_SERVER_NAME"

	EnvKubernetesNamespace = "SPACE_KUBERNETES_NAMESPACE"
)

// The defaults a component also falls back to when its Options leave the value zero
// (a test's server, say): the declarations below are written from these constants,
// so the component's fallback and the variable's default are one value.
const (
	// DefaultMaxBodyBytes is SPACE_MAX_BODY_BYTES': 64 KiB.
	DefaultMaxBodyBytes = 64 << 10
	// DefaultMaxInFlight, DefaultMaxQueued, DefaultMaxQueuedPerClient and
	// DefaultMaxQueueWait are SPACE_MAX_IN_FLIGHT's, SPACE_MAX_QUEUED's,
	// SPACE_MAX_QUEUED_PER_CLIENT's and SPACE_MAX_QUEUE_WAIT's (docs/operations.md,
	// "Overload"). The seats are the Postgres pool's connections (store.DefaultMaxConns,
	// held equal by a test): a request at work beyond them waits for a connection in
	// the pool's first-come line, where a quiet client waits behind a flooder's, instead
	// of in the gate's turns. Measured beside a flood of 5×C (docs/benchmarks.md,
	// "Seats as many as the pool's connections"): the quiet client's p99 71–98 ms against
	// 133–142 at 64 seats, at the same capacity. A create whose sandbox takes over 10 ms to start
	// gives its seat back meanwhile (space.WithIdle), so the seats bound the work, not
	// the starts waited on.
	DefaultMaxInFlight        = 32
	DefaultMaxQueued          = 1024
	DefaultMaxQueuedPerClient = 32
	DefaultMaxQueueWait       = time.Second
)

// The names the rules between variables (Config.check) name.
const (
	envAuthMode          = "SPACE_AUTH_MODE"
	envTrustedProxyCIDRs = "SPACE_TRUSTED_PROXY_CIDRS"
	envClientRefillRPS   = "SPACE_CLUSTER_ACTIVATION_ADMISSION_CLIENT_REFILL_RPS"
	envClientBurst       = "SPACE_CLUSTER_ACTIVATION_ADMISSION_CLIENT_BURST"
)

// Vars returns every variable, in the order of the docs.
func Vars() []Var {
	var c Config
	vars := declare(&c)
	for i := range vars {
		vars[i].parse = nil // bound to a Config nobody else sees
	}
	return vars
}

// group sets the Group of vars.
func group(name string, vars ...Var) []Var {
	for i := range vars {
		vars[i].Group = name
	}
	return vars
}

// declare declares every variable, bound to the fields of c. It is the one list of
// the configuration: a variable missing here is not read, documented or rendered by
// the chart tests.
func declare(c *Config) []Var {
	a, r, s, k := &c.Admission, &c.Redis, &c.Sandbox, &c.Kubernetes
	var vars []Var
	vars = append(vars, group("Server",
		Var{Name: "SPACE_HTTP_ADDR", Default: ":8080", parse: into(&c.HTTPAddr, checked(listenAddr)),
			Help: "The public listener: the `/v1` routes."},
		Var{Name: "SPACE_INTERNAL_HTTP_ADDR", Default: ":8081", parse: into(&c.InternalHTTPAddr, checked(listenAddr)),
			Help: "The internal listener: `/internal/v1/...`, `/metrics`, probes. Never expose it to clients."},
		Var{Name: EnvDatabaseURL, Required: "a postgres:// URL", parse: into(&c.DatabaseURL, checked(postgresURL)),
			Help: "The Postgres URL (`pool_max_conns` in it sizes the pool)."},
		Var{Name: EnvLogLevel, Default: "info", parse: into(&c.LogLevel, oneOf("debug", "info", "warn", "error")),
			Help: "`debug`, `info`, `warn` or `error`; JSON logs on stderr."},
		Var{Name: "SPACE_METRICS_BUDGET_KEYS", Default: "100", parse: into(&c.MetricsBudgetKeys, atLeast(0)),
			Help: "How many budget keys label a series per key of their own (`space_sandbox_soft_breaches_total`: the first seen; the queue's gauges: the largest backlogs); the rest are summed under `budget_key=\"_other\"`, so that `/metrics` does not grow with tenants. 0: per tier only."},
		Var{Name: "SPACE_SHUTDOWN_TIMEOUT", Default: "25s", parse: into(&c.ShutdownTimeout, duration),
			Help: "Drain time on SIGTERM, under Kubernetes' 30s grace period; a cold start cut by it is settled by the reconciler."},
		Var{Name: "SPACE_IDEMPOTENCY_KEY_TTL", Default: "24h", parse: into(&c.IdempotencyKeyTTL, duration),
			Help: "How long an `Idempotency-Key` names its request: a repeat within it gets the first outcome and is not charged."},
	)...)
	vars = append(vars, group("Overload",
		Var{Name: "SPACE_MAX_IN_FLIGHT", Default: strconv.Itoa(DefaultMaxInFlight), parse: into(&c.Overload.MaxInFlight, atLeast(0)),
			Help: "Public requests at work at once on a replica, by default as many as its Postgres connections; the rest wait their turn, round robin between budget keys, or are answered 503 `overloaded`. A create or restore waiting over 10 ms for its sandbox to start gives its seat back. 0: no bound. Health checks and the internal listener are never held."},
		Var{Name: "SPACE_MAX_QUEUED", Default: strconv.Itoa(DefaultMaxQueued), parse: into(&c.Overload.MaxQueued, atLeast(1)),
			Help: "Public requests that may wait for their turn, all budget keys together; one more is answered 503 at once."},
		Var{Name: "SPACE_MAX_QUEUED_PER_CLIENT", Default: strconv.Itoa(DefaultMaxQueuedPerClient), parse: into(&c.Overload.MaxQueuedPerClient, atLeast(1)),
			Help: "Public requests of one budget key that may wait for their turn; one more is answered 503 at once."},
		Var{Name: "SPACE_MAX_QUEUE_WAIT", Default: DefaultMaxQueueWait.String(), parse: into(&c.Overload.MaxQueueWait, duration),
			Help: "The longest a public request waits for its turn before its 503; one whose caller leaves meanwhile is dropped unserved."},
		Var{Name: "SPACE_MAX_CONNECTIONS", Default: "10000", parse: into(&c.Overload.MaxConnections, atLeast(0)),
			Help: "Open connections of the public listener; one over it is closed as it is accepted. 0: no bound."},
	)...)
	vars = append(vars, group("Auth",
		Var{Name: envAuthMode, Default: string(AuthAPIKey), parse: into(&c.Auth.Mode, oneOf(AuthAPIKey, AuthTrustedHeader)),
			Help: "`api_key` (`Authorization: Bearer`, keys hashed in Postgres) or `trusted_header` (`X-Client-ID` from a trusted proxy)."},
		Var{Name: envTrustedProxyCIDRs, Unset: "none; required with `trusted_header`", parse: into(&c.Auth.TrustedProxyCIDRs, cidrs),
			Help: "Comma-separated CIDRs of the proxies whose `X-Client-ID` is believed, and whose `X-Forwarded-For` names the source of failed logins."},
		Var{Name: "SPACE_AUTH_FAILURE_REFILL_RPS", Default: "0.2", parse: into(&c.Auth.FailureRate.RefillRPS, refill),
			Help: "Failed authentications allowed per source address and second, after the burst (`api_key` mode)."},
		Var{Name: "SPACE_AUTH_FAILURE_BURST", Default: "20", parse: into(&c.Auth.FailureRate.Burst, tokens),
			Help: "Failed authentications a source address may make at once (`api_key` mode)."},
	)...)
	vars = append(vars, group("Redis",
		Var{Name: EnvRedisURL, Secret: true, parse: r.parseURL,
			Help: "`redis://[user:password@]host:port[/db]`, or `rediss://` for TLS, instead of `SPACE_REDIS_ADDRS`; the variables below override its parts."},
		Var{Name: EnvRedisAddrs, Unset: "required unless `SPACE_REDIS_URL` is set", parse: r.parseAddrs,
			Help: "`host:port` of a standalone server or of one cluster node; several, comma separated, for a Redis Cluster."},
		Var{Name: EnvRedisMode, Default: string(RedisAuto), parse: into(&r.Mode, oneOf(RedisAuto, RedisStandalone, RedisCluster)),
			Help: "`auto` asks one address at start (`INFO cluster`) and takes several for a cluster; `standalone` and `cluster` must match what the server says."},
		Var{Name: EnvRedisUsername, Unset: "the default user", parse: r.parseUsername,
			Help: "The Redis ACL user."},
		Var{Name: EnvRedisPassword, Unset: "no password", Secret: true, Raw: true, parse: r.parsePassword,
			Help: "The password itself (prefer the file); never logged, the configuration logs `password_set`."},
		Var{Name: EnvRedisPasswordFile, Unset: "no password", parse: r.parsePasswordFile,
			Help: "A file holding the password, read at start with one trailing newline trimmed; what the Helm chart sets."},
		Var{Name: EnvRedisTLS, Default: "false", parse: r.parseTLS,
			Help: "Connect with TLS 1.2 or later; `true` also upgrades a `redis://` URL, `false` never downgrades a `rediss://` one."},
		Var{Name: EnvRedisTLSCAFile, Unset: "the system roots", parse: r.parseCAFile,
			Help: "A PEM bundle of the CAs that may sign the server's certificate, parsed at start; needs TLS on."},
		Var{Name: EnvRedisTLSServerName, Unset: "the host of the address dialled", parse: r.parseServerName,
			Help: "The name to verify in the server's certificate; needs TLS on."},
		Var{Name: "SPACE_REDIS_TIMEOUT", Default: "100ms", parse: into(&r.Timeout, duration),
			Help: "Bounds every Redis call on the request path: a slow Redis must not make every create slow."},
		// The two thresholds' defaults are admission.DefaultPipelineAbove and
		// admission.DefaultBatchAbove, written out because config cannot import
		// admission (whose tests import config); TestCoalescingDefaultsAreAdmissions
		// holds them equal. 0 means what it means in the admission options: never.
		Var{Name: "SPACE_REDIS_PIPELINE_ABOVE", Default: "8", parse: into(&r.PipelineAbove, atLeast(0)),
			Help: "Concurrency-lease and failed-authentication scripts in flight at once, each on its own, before the next wait and go together as one pipeline: fewer round trips under load, no wait below it; `0` never pipelines."},
		Var{Name: "SPACE_REDIS_BATCH_ABOVE", Default: "8", parse: into(&r.BatchAbove, atLeast(0)),
			Help: "Admission decisions in flight at once, each on its own, before the next wait and go together as one script call deciding each in turn: far less Redis and replica CPU a decision under load, no wait below it; `0` never batches."},
		Var{Name: "SPACE_REDIS_KEY_PREFIX", Default: "space", parse: into(&r.KeyPrefix, checked(keyPrefix)),
			Help: "Namespaces every Redis key; deployments sharing one Redis (a staging beside a production) set one each."},
	)...)
	vars = append(vars, group("Admission",
		Var{Name: "SPACE_CLUSTER_ACTIVATION_ADMISSION_ENABLED", Default: "true", parse: into(&a.Enabled, boolean),
			Help: "Charge activations at all; off, nothing is charged and the flag's rate entries are ignored."},
		Var{Name: "SPACE_CLUSTER_ACTIVATION_ADMISSION_REFILL_RPS", Default: "100", parse: into(&a.Cluster.RefillRPS, refill),
			Help: "The cluster bucket's refill, in tokens per second."},
		Var{Name: "SPACE_CLUSTER_ACTIVATION_ADMISSION_BURST", Default: "200", parse: into(&a.Cluster.Burst, tokens),
			Help: "The cluster bucket's capacity."},
		Var{Name: envClientRefillRPS, Unset: "no per-client bucket", parse: a.parseClientRefill,
			Help: "Every client key's refill unless the quota flag says otherwise; set together with `_CLIENT_BURST`."},
		Var{Name: envClientBurst, Unset: "no per-client bucket", parse: a.parseClientBurst,
			Help: "Every client key's capacity; set together with `_CLIENT_REFILL_RPS`."},
		Var{Name: "SPACE_CLUSTER_ACTIVATION_ADMISSION_FAILURE_MODE", Default: string(FailOpen), parse: into(&a.FailureMode, oneOf(FailOpen, FailClosed)),
			Help: "On a Redis error, `open` admits within what the replica knows of each bucket (refusing a client its last decision found empty) and `closed` answers 503; both are counted."},
		Var{Name: "SPACE_CLUSTER_ACTIVATION_ADMISSION_SHADOW", Default: "false", parse: into(&a.Shadow, boolean),
			Help: "Decide and record, but admit."},
		Var{Name: "SPACE_REFUSAL_CACHE_MAX_AGE", Default: "1s", parse: into(&a.RefusalCacheMaxAge, durationOrOff),
			Help: "How old a replica's memory of an empty bucket may be and still refuse without asking Redis (`0`: never); a bucket reset by hand is seen within it."},
		Var{Name: "SPACE_REFUSAL_PACE", Default: "10ms", parse: into(&a.RefusalPace, refusalPace),
			Help: "How long at most a create refused from memory waits before its 429 while another client key's request (a create, a restore, any budgeted route) is at work on the replica; it is answered as soon as nothing is at work there. A flood's refusals yield the CPU to its neighbours (`0`: answer at once; at most 1s)."},
	)...)
	vars = append(vars, group("Flags",
		Var{Name: "SPACE_FLAGS_FILE", Unset: "the env defaults alone", parse: into(&c.Flags.File, text),
			Help: "The flagd flag-definition file (quotas, warm pool targets), reloaded live."},
		Var{Name: "SPACE_FLAGS_POLL_INTERVAL", Default: "2s", parse: into(&c.Flags.PollInterval, duration),
			Help: "How often the flags file is checked for a change."},
		Var{Name: "SPACE_FALLBACK_TIER", Unset: "none: a quota flag with tiers is then refused", parse: into(&c.Flags.FallbackTier, checked(space.CheckTierName)),
			Help: "The floor tier: the tier of every client whose tier cannot be resolved (a name the table lacks, an evaluation error, a provider not ready); must be in the tier table."},
	)...)
	vars = append(vars, group("Sandbox",
		Var{Name: "SPACE_TEMPLATES_FILE", Required: `a templates file: {"templates": {"<name>": {"image": ...}}}`, parse: into(&s.TemplatesFile, text),
			Help: "Sandbox templates: name to image, pod spec and per-template caps (`make run` uses `deploy/demo/templates.json`)."},
		Var{Name: "SPACE_TEMPLATES_POLL_INTERVAL", Default: "2s", parse: into(&s.TemplatesPollInterval, duration),
			Help: "How often the templates file is checked for a change: it is reloaded live."},
		Var{Name: "SPACE_SUBSTRATE", Default: "simulated", parse: into(&s.Substrate, oneOf(Substrates...)),
			Help: "`simulated` (in-process) or `kubernetes` (sandboxes as Pods)."},
		Var{Name: "SPACE_MAX_CPU_MILLIS", Default: "16000", parse: into(&s.MaxShape.CPUMillis, atLeast(1)),
			Help: "The largest CPU a shape may ask for; over it, a 422."},
		Var{Name: "SPACE_MAX_MEMORY_MIB", Default: "65536", parse: into(&s.MaxShape.MemoryMiB, atLeast(1)),
			Help: "The largest memory a shape may ask for; over it, a 422."},
		Var{Name: "SPACE_MAX_DISK_GIB", Default: "100", parse: into(&s.MaxShape.DiskGiB, atLeast(1)),
			Help: "The largest disk a shape may ask for; over it, a 422."},
		Var{Name: "SPACE_MAX_BODY_BYTES", Default: strconv.Itoa(DefaultMaxBodyBytes), parse: into(&s.MaxBodyBytes, atLeast[int64](1)),
			Help: "The largest request body accepted."},
		Var{Name: "SPACE_SIMULATED_COLD_START", Unset: "instant (`make run`: 300ms)", parse: into(&s.SimulatedColdStart, duration),
			Help: "How long the simulated substrate takes per cold start, warm-up, snapshot or restore; adopting a warm slot takes a tenth."},
		Var{Name: "SPACE_SIMULATED_TIMEOUT", Unset: "the cold start plus 5s", parse: into(&s.SimulatedTimeout, duration),
			Help: "The simulated substrate's timeout, from which the recovery bounds count."},
		Var{Name: "SPACE_SIMULATED_STATE_DIR", Unset: "in memory", parse: into(&s.SimulatedStateDir, text),
			Help: "Keep what the simulated substrate runs in a file there, shared by every process pointed at it."},
	)...)
	vars = append(vars, group("Warm pool",
		Var{Name: "SPACE_POOL_REFILL_RESERVE", Default: "0.2", parse: into(&c.Pool.RefillReserve, share),
			Help: "The share of the cluster bucket's burst that a warm-up never takes: refills are charged only while the bucket keeps `ceil(share × burst)` tokens after them, for the users' activations (`0`: refills may take the last token)."},
	)...)
	vars = append(vars, group("Dispatcher",
		Var{Name: "SPACE_DISPATCHER_WORKERS", Default: "10", parse: into(&c.Dispatcher.Workers, atLeast(0)),
			Help: "Queued operations this replica runs at once; `0` runs none (the replica still accepts async requests)."},
		Var{Name: "SPACE_DISPATCHER_ADMISSION_DEADLINE", Default: "10m", parse: into(&c.Dispatcher.AdmissionDeadline, duration),
			Help: "A queued operation still not admitted after this fails as `admission_timeout`."},
		Var{Name: "SPACE_DISPATCHER_MAX_SNOOZE", Default: "1m", parse: into(&c.Dispatcher.MaxSnooze, duration),
			Help: "The longest admission snooze of a queued operation: a snooze lasts until the bucket that turned it away refills, but never longer."},
		Var{Name: "SPACE_DISPATCHER_OWNER_LANES", Default: "4", parse: into(&c.Dispatcher.OwnerLanes, atLeast(1)),
			Help: "How many of one owner's queued operations may be runnable at once, per unit of its tier's queue_weight; the rest wait their turn, so one owner's backlog never holds another's work."},
		Var{Name: "SPACE_DISPATCHER_MAX_ATTEMPTS", Default: "5", parse: into(&c.Dispatcher.MaxAttempts, atLeast(1)),
			Help: "Real attempts of a queued operation before it fails; admission snoozes are not attempts."},
		Var{Name: "SPACE_DISPATCHER_JOB_TIMEOUT", Unset: "the substrate's timeout plus 20s", parse: into(&c.Dispatcher.JobTimeout, duration),
			Help: "The longest one run of a queued operation; a dead replica's runs are run again 10s after it."},
		Var{Name: "SPACE_RIVER_UI", Default: "false", parse: into(&c.Dispatcher.UI, boolean),
			Help: "Serve River UI at `/riverui/` on the internal listener; it can cancel, retry and delete jobs, and that listener has no authentication."},
	)...)
	vars = append(vars, group("Reconcile",
		Var{Name: "SPACE_RECONCILE_INTERVAL", Default: "10s", parse: into(&c.Reconcile.Interval, duration),
			Help: "How often the reconciler settles what crashes and outages left transitional."},
		Var{Name: "SPACE_RECONCILE_GRACE", Default: "30s", parse: into(&c.Reconcile.Grace, duration),
			Help: "Added to the substrate's timeout: how long a sandbox may stay starting, restoring or pausing before it is settled."},
	)...)
	vars = append(vars, group("Lifecycle",
		Var{Name: "SPACE_LIFECYCLE_INTERVAL", Default: "5s", parse: into(&c.Lifecycle.Interval, duration),
			Help: "How often idle sandboxes are paused, old ones ended and paused ones past their retention deleted (docs/lifecycle.md): no action is more than about one interval late."},
	)...)
	vars = append(vars, group("Retention",
		Var{Name: "SPACE_RETENTION_SANDBOXES", Default: "168h", parse: into(&c.Retention.Sandboxes, durationOrOff),
			Help: "How long a terminated or failed sandbox's row is kept after it ended, then deleted in small batches; 0 keeps it for ever."},
		Var{Name: "SPACE_RETENTION_OPERATIONS", Default: "168h", parse: into(&c.Retention.Operations, durationOrOff),
			Help: "How long a finished queued operation is kept after it finished, then deleted in small batches; 0 keeps it for ever. River deletes its job itself, a day after it completed."},
	)...)
	vars = append(vars, group("Kubernetes",
		Var{Name: EnvKubernetesNamespace, Unset: "the namespace space-api runs in, else the kubeconfig context's", parse: into(&k.Namespace, checked(namespace)),
			Help: "The namespace of the sandbox Pods (`SPACE_SUBSTRATE=kubernetes`; see docs/kubernetes.md)."},
		Var{Name: "SPACE_KUBERNETES_READY_TIMEOUT", Default: "2m", parse: into(&k.ReadyTimeout, duration),
			Help: "A Pod not Ready by then is deleted and its start fails."},
		Var{Name: "SPACE_KUBERNETES_CLIENT_QPS", Default: "50", parse: into(&k.QPS, perSecond),
			Help: "The API client's request rate, above client-go's 5 so that a burst of cold starts queues in the admission buckets, not in the client."},
		Var{Name: "SPACE_KUBERNETES_CLIENT_BURST", Default: "100", parse: into(&k.Burst, atLeast(1)),
			Help: "The API client's burst of requests."},
		Var{Name: "KUBECONFIG", Unset: "the in-cluster service account, else `~/.kube/config`", parse: into(&k.Kubeconfig, text),
			Help: "Kubeconfig files (a path list), for runs outside a cluster."},
		Var{Name: "SPACE_KUBERNETES_STORAGE_CLASS", Unset: "the cluster's default StorageClass", parse: into(&k.StorageClass, checked(objectName)),
			Help: "The StorageClass of each sandbox's volume claim, which keeps its filesystem across a pause."},
		Var{Name: "SPACE_KUBERNETES_VOLUME_SNAPSHOT_CLASS", Unset: "no snapshots: a pause keeps the claim alone", parse: into(&k.SnapshotClass, checked(objectName)),
			Help: "The CSI VolumeSnapshotClass a pause snapshots the sandbox's claim with."},
		Var{Name: "SPACE_KUBERNETES_VOLUME_MOUNT_PATH", Default: "/workspace", parse: into(&k.MountPath, checked(mountPath)),
			Help: "Where the claim is mounted in the sandbox's first container: what a pause keeps is what the sandbox wrote there."},
		Var{Name: "SPACE_KUBERNETES_SOFT_BREACH_PRIORITY_CLASS", Unset: "the template's own", parse: into(&k.SoftBreachPriorityClass, checked(objectName)),
			Help: "The PriorityClass of the Pods of sandboxes admitted over their client's soft limit, so that the scheduler preempts them first."},
	)...)
	return vars
}
