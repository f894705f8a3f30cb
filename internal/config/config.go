// Package config reads space-api's configuration from SPACE_* environment variables.
//
// Every variable is parsed and validated at start. A bad value is reported as one line
// naming the variable, the value and what it accepts, so that a typo in a Helm value
// stops a rollout at the first pod instead of misbehaving in production. Defaults live
// in one place, Default.
package config

import (
	"fmt"
	"math"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/space-sandbox/space"
)

// Config is the whole configuration, grouped by the component that uses it.
type Config struct {
	// HTTPAddr is the public listener (SPACE_HTTP_ADDR, default ":8080").
	HTTPAddr string
	// InternalHTTPAddr serves /internal/v1 and /metrics (SPACE_INTERNAL_HTTP_ADDR,
	// default ":8081"). It must never be reachable by clients.
	InternalHTTPAddr string
	// DatabaseURL is the Postgres URL (SPACE_DATABASE_URL, required).
	DatabaseURL string
	// LogLevel is debug, info, warn or error (SPACE_LOG_LEVEL, default info).
	LogLevel string
	// ShutdownTimeout bounds the drain of in-flight requests and running jobs on
	// SIGTERM (SPACE_SHUTDOWN_TIMEOUT, default 25s, under Kubernetes' 30s grace period).
	ShutdownTimeout time.Duration
	// IdempotencyKeyTTL is how long an Idempotency-Key names the request it came with;
	// a repeat within it gets the first request's outcome, and the key can name a new
	// request after it (SPACE_IDEMPOTENCY_KEY_TTL, default 24h).
	IdempotencyKeyTTL time.Duration

	Auth       Auth
	Redis      Redis
	Admission  Admission
	Flags      Flags
	Sandbox    Sandbox
	Dispatcher Dispatcher
	Reconcile  Reconcile
}

// Reconcile configures the reconciler that settles what crashes and outages leave
// behind (internal/sandbox.Reconciler).
type Reconcile struct {
	// Interval is how often the replica holding the reconciler's lock looks
	// (SPACE_RECONCILE_INTERVAL, default 10s).
	Interval time.Duration
	// Grace is added to the substrate's timeout to get the bound after which a
	// sandbox still starting, restoring or pausing is settled; resources younger than
	// it are never taken for orphans (SPACE_RECONCILE_GRACE, default 30s).
	Grace time.Duration
}

// Auth decides how a caller's client id is established.
type Auth struct {
	// Mode is AuthAPIKey (Authorization: Bearer, keys hashed in Postgres) or
	// AuthTrustedHeader (X-Client-ID from a trusted proxy) (SPACE_AUTH_MODE, default
	// api_key).
	Mode AuthMode
	// TrustedProxyCIDRs are the peers whose X-Client-ID is believed in trusted_header
	// mode (SPACE_TRUSTED_PROXY_CIDRS, comma separated; required in that mode).
	TrustedProxyCIDRs []netip.Prefix
	// FailureRate limits failed authentications per source address
	// (SPACE_AUTH_FAILURE_REFILL_RPS, default 0.2, and SPACE_AUTH_FAILURE_BURST, default
	// 20): twenty wrong keys, then one every five seconds.
	FailureRate space.Rate
}

// AuthMode is the value of SPACE_AUTH_MODE.
type AuthMode string

const (
	AuthAPIKey        AuthMode = "api_key"
	AuthTrustedHeader AuthMode = "trusted_header"
)

// Redis locates the Redis that holds the buckets and leases.
type Redis struct {
	// Addrs is SPACE_REDIS_ADDRS (required): one address for a standalone Redis,
	// several for a Redis Cluster.
	Addrs []string
	// Timeout bounds every Redis call on the request path (SPACE_REDIS_TIMEOUT, default
	// 100ms): a slow Redis must not make every create slow.
	Timeout time.Duration
	// KeyPrefix namespaces every Redis key (SPACE_REDIS_KEY_PREFIX, default "space",
	// which gives exactly the keys of the design): deployments sharing one Redis (a
	// staging beside a production) each set their own. No braces: the cluster key is
	// the client keys' Redis Cluster hash tag.
	KeyPrefix string
}

// FailureMode says what admission does when Redis cannot answer.
type FailureMode string

const (
	// FailOpen admits (and counts an error): a Redis outage must not stop the fleet.
	FailOpen FailureMode = "open"
	// FailClosed rejects with 503: for fleets where an unbudgeted activation costs more
	// than a refused one.
	FailClosed FailureMode = "closed"
)

// Admission configures the activation buckets (docs/design.md, admission buckets).
type Admission struct {
	// Enabled turns charging on (SPACE_CLUSTER_ACTIVATION_ADMISSION_ENABLED, default
	// true). Off, nothing is charged and the flag's rate entries are ignored.
	Enabled bool
	// Cluster is the shared bucket (SPACE_CLUSTER_ACTIVATION_ADMISSION_REFILL_RPS,
	// default 100, and _BURST, default 200).
	Cluster space.Rate
	// Client is the rate of every client key, unknown included, unless the quota flag
	// says otherwise (SPACE_CLUSTER_ACTIVATION_ADMISSION_CLIENT_REFILL_RPS and
	// _CLIENT_BURST). Nil when both are unset: no per-client bucket. Setting one of the
	// two without the other is an error.
	Client *space.Rate
	// FailureMode is SPACE_CLUSTER_ACTIVATION_ADMISSION_FAILURE_MODE (default open).
	FailureMode FailureMode
	// Shadow decides and records but admits (SPACE_CLUSTER_ACTIVATION_ADMISSION_SHADOW).
	Shadow bool
}

// Flags locates the flag-definition file.
type Flags struct {
	// File is SPACE_FLAGS_FILE; empty means no overrides: env defaults apply.
	File string
	// PollInterval is how often the file is checked for a change
	// (SPACE_FLAGS_POLL_INTERVAL, default 2s).
	PollInterval time.Duration
}

// Sandbox configures the create path.
type Sandbox struct {
	// TemplatesFile is SPACE_TEMPLATES_FILE: template name to what the substrate needs.
	TemplatesFile string
	// TemplatesPollInterval is how often the templates file is checked for a change
	// (SPACE_TEMPLATES_POLL_INTERVAL, default 2s): it is reloaded live.
	TemplatesPollInterval time.Duration
	// Substrate is "simulated" (default) or "kubernetes" (SPACE_SUBSTRATE).
	Substrate string
	// MaxShape holds the shape caps (SPACE_MAX_CPU_MILLIS default 16000,
	// SPACE_MAX_MEMORY_MIB default 65536, SPACE_MAX_DISK_GIB default 100). A shape over a
	// cap does not resolve: 422.
	MaxShape space.Shape
	// MaxBodyBytes caps a request body (SPACE_MAX_BODY_BYTES, default 64 KiB).
	MaxBodyBytes int64
	// SimulatedColdStart is how long the simulated substrate takes to cold start,
	// warm, snapshot or restore a sandbox (SPACE_SIMULATED_COLD_START, default 0; make
	// run uses 300ms so that warm hits visibly win). Adopting a warm slot takes a tenth.
	SimulatedColdStart time.Duration
	// SimulatedTimeout is the simulated substrate's timeout, from which the recovery
	// bounds are counted (SPACE_SIMULATED_TIMEOUT, default the cold start plus 5s).
	SimulatedTimeout time.Duration
	// SimulatedStateDir, when set, keeps what the simulated substrate runs in a file
	// there, shared by every process pointed at it (SPACE_SIMULATED_STATE_DIR): replicas
	// of one test share one simulated cluster, and a killed one leaves its sandboxes
	// behind as a real substrate would.
	SimulatedStateDir string
}

// Dispatcher configures queued operations.
type Dispatcher struct {
	// Workers is SPACE_DISPATCHER_WORKERS (default 10; 0 runs no worker on this
	// replica, which still accepts async requests).
	Workers int
	// AdmissionDeadline is how long an operation may wait for admission before it fails
	// as admission_timeout (SPACE_DISPATCHER_ADMISSION_DEADLINE, default 10m).
	AdmissionDeadline time.Duration
	// MaxSnooze caps how long one admission snooze of a queued operation lasts
	// (SPACE_DISPATCHER_MAX_SNOOZE, default 1m): snoozes grow while a client stays over
	// its rate, and the cap bounds how late a refilled bucket (or a raised rate) is
	// noticed.
	MaxSnooze time.Duration
	// MaxAttempts is how many real attempts a queued operation gets before it fails
	// (SPACE_DISPATCHER_MAX_ATTEMPTS, default 5); admission snoozes are not attempts.
	MaxAttempts int
	// UI mounts River UI at /riverui/ on the internal listener (SPACE_RIVER_UI,
	// default false): the queue's jobs, their errors and attempts, in a browser. Off
	// by default because it can also cancel, retry and delete jobs, and the internal
	// listener has no authentication.
	UI bool
	// JobTimeout bounds one run of a queued operation (SPACE_DISPATCHER_JOB_TIMEOUT);
	// zero, the default, is the substrate's own timeout plus 20s, which no run of a live
	// replica outlasts. A dead replica's runs are run again 10s after it.
	JobTimeout time.Duration
}

// Substrates are the accepted values of SPACE_SUBSTRATE.
var Substrates = []string{"simulated", "kubernetes"}

// Default returns the configuration with every default filled in and nothing required
// set.
func Default() Config {
	return Config{
		HTTPAddr:          ":8080",
		InternalHTTPAddr:  ":8081",
		LogLevel:          "info",
		ShutdownTimeout:   25 * time.Second,
		IdempotencyKeyTTL: 24 * time.Hour,
		Auth:              Auth{Mode: AuthAPIKey, FailureRate: space.Rate{RefillRPS: 0.2, Burst: 20}},
		Redis:             Redis{Timeout: 100 * time.Millisecond, KeyPrefix: "space"},
		Admission: Admission{
			Enabled:     true,
			Cluster:     space.Rate{RefillRPS: 100, Burst: 200},
			FailureMode: FailOpen,
		},
		Flags: Flags{PollInterval: 2 * time.Second},
		Sandbox: Sandbox{
			Substrate:             "simulated",
			TemplatesPollInterval: 2 * time.Second,
			MaxShape:              space.Shape{CPUMillis: 16000, MemoryMiB: 65536, DiskGiB: 100},
			MaxBodyBytes:          64 << 10,
		},
		Dispatcher: Dispatcher{Workers: 10, AdmissionDeadline: 10 * time.Minute, MaxSnooze: time.Minute, MaxAttempts: 5},
		Reconcile:  Reconcile{Interval: 10 * time.Second, Grace: 30 * time.Second},
	}
}

// Load reads the configuration through getenv, starting from Default. The error names
// the first bad variable; every error is a *VarError.
func Load(getenv func(string) string) (Config, error) {
	c := Default()
	r := reader{getenv: getenv}

	r.str("SPACE_HTTP_ADDR", &c.HTTPAddr, checkAddr)
	r.str("SPACE_INTERNAL_HTTP_ADDR", &c.InternalHTTPAddr, checkAddr)
	r.str("SPACE_DATABASE_URL", &c.DatabaseURL, checkDatabaseURL)
	r.required("SPACE_DATABASE_URL", c.DatabaseURL, "a postgres:// URL")
	r.oneOf("SPACE_LOG_LEVEL", &c.LogLevel, "debug", "info", "warn", "error")
	r.duration("SPACE_SHUTDOWN_TIMEOUT", &c.ShutdownTimeout)

	mode := string(c.Auth.Mode)
	r.oneOf("SPACE_AUTH_MODE", &mode, string(AuthAPIKey), string(AuthTrustedHeader))
	c.Auth.Mode = AuthMode(mode)
	r.cidrs("SPACE_TRUSTED_PROXY_CIDRS", &c.Auth.TrustedProxyCIDRs)
	if c.Auth.Mode == AuthTrustedHeader && len(c.Auth.TrustedProxyCIDRs) == 0 {
		r.fail("SPACE_TRUSTED_PROXY_CIDRS", "", "one or more CIDRs (e.g. 10.0.0.0/8); required when SPACE_AUTH_MODE=trusted_header")
	}

	r.rate("SPACE_AUTH_FAILURE_REFILL_RPS", &c.Auth.FailureRate.RefillRPS)
	r.burst("SPACE_AUTH_FAILURE_BURST", &c.Auth.FailureRate.Burst)

	r.addrs("SPACE_REDIS_ADDRS", &c.Redis.Addrs)
	if len(c.Redis.Addrs) == 0 {
		r.required("SPACE_REDIS_ADDRS", "", "host:port, or several comma separated for a Redis Cluster")
	}
	r.duration("SPACE_REDIS_TIMEOUT", &c.Redis.Timeout)
	r.str("SPACE_REDIS_KEY_PREFIX", &c.Redis.KeyPrefix, func(v string) string {
		if strings.ContainsAny(v, "{} ") {
			return "a key prefix without braces or spaces, such as space-staging"
		}
		return ""
	})

	r.boolean("SPACE_CLUSTER_ACTIVATION_ADMISSION_ENABLED", &c.Admission.Enabled)
	r.rate("SPACE_CLUSTER_ACTIVATION_ADMISSION_REFILL_RPS", &c.Admission.Cluster.RefillRPS)
	r.burst("SPACE_CLUSTER_ACTIVATION_ADMISSION_BURST", &c.Admission.Cluster.Burst)
	c.Admission.Client = r.clientRate()
	fm := string(c.Admission.FailureMode)
	r.oneOf("SPACE_CLUSTER_ACTIVATION_ADMISSION_FAILURE_MODE", &fm, string(FailOpen), string(FailClosed))
	c.Admission.FailureMode = FailureMode(fm)
	r.boolean("SPACE_CLUSTER_ACTIVATION_ADMISSION_SHADOW", &c.Admission.Shadow)

	r.str("SPACE_FLAGS_FILE", &c.Flags.File, nil)
	r.duration("SPACE_FLAGS_POLL_INTERVAL", &c.Flags.PollInterval)

	r.str("SPACE_TEMPLATES_FILE", &c.Sandbox.TemplatesFile, nil)
	r.required("SPACE_TEMPLATES_FILE", c.Sandbox.TemplatesFile, `a templates file: {"templates": {"<name>": {"image": ...}}}`)
	r.duration("SPACE_TEMPLATES_POLL_INTERVAL", &c.Sandbox.TemplatesPollInterval)
	r.oneOf("SPACE_SUBSTRATE", &c.Sandbox.Substrate, Substrates...)
	r.positive("SPACE_MAX_CPU_MILLIS", &c.Sandbox.MaxShape.CPUMillis)
	r.positive("SPACE_MAX_MEMORY_MIB", &c.Sandbox.MaxShape.MemoryMiB)
	r.positive("SPACE_MAX_DISK_GIB", &c.Sandbox.MaxShape.DiskGiB)
	var body int
	if r.positive("SPACE_MAX_BODY_BYTES", &body) {
		c.Sandbox.MaxBodyBytes = int64(body)
	}

	r.duration("SPACE_SIMULATED_COLD_START", &c.Sandbox.SimulatedColdStart)
	r.duration("SPACE_SIMULATED_TIMEOUT", &c.Sandbox.SimulatedTimeout)
	r.str("SPACE_SIMULATED_STATE_DIR", &c.Sandbox.SimulatedStateDir, nil)

	r.duration("SPACE_IDEMPOTENCY_KEY_TTL", &c.IdempotencyKeyTTL)

	r.duration("SPACE_RECONCILE_INTERVAL", &c.Reconcile.Interval)
	r.duration("SPACE_RECONCILE_GRACE", &c.Reconcile.Grace)

	r.nonNegative("SPACE_DISPATCHER_WORKERS", &c.Dispatcher.Workers)
	r.duration("SPACE_DISPATCHER_ADMISSION_DEADLINE", &c.Dispatcher.AdmissionDeadline)
	r.duration("SPACE_DISPATCHER_MAX_SNOOZE", &c.Dispatcher.MaxSnooze)
	r.positive("SPACE_DISPATCHER_MAX_ATTEMPTS", &c.Dispatcher.MaxAttempts)
	r.duration("SPACE_DISPATCHER_JOB_TIMEOUT", &c.Dispatcher.JobTimeout)
	r.boolean("SPACE_RIVER_UI", &c.Dispatcher.UI)

	if r.err != nil {
		return Config{}, r.err
	}
	return c, nil
}

// LoadDatabase reads only what the commands that work on the database alone need
// (`space-api migrate`, `space-api keys`): SPACE_DATABASE_URL and SPACE_LOG_LEVEL. A
// migration job has no templates or Redis to point at.
func LoadDatabase(getenv func(string) string) (Config, error) {
	c := Default()
	r := reader{getenv: getenv}
	r.str("SPACE_DATABASE_URL", &c.DatabaseURL, checkDatabaseURL)
	r.required("SPACE_DATABASE_URL", c.DatabaseURL, "a postgres:// URL")
	r.oneOf("SPACE_LOG_LEVEL", &c.LogLevel, "debug", "info", "warn", "error")
	if r.err != nil {
		return Config{}, r.err
	}
	return c, nil
}

// VarError is a bad environment variable: its name, its value and what it accepts.
type VarError struct {
	Var     string
	Value   string
	Accepts string
}

func (e *VarError) Error() string {
	if e.Value == "" {
		return fmt.Sprintf("%s is not set: want %s", e.Var, e.Accepts)
	}
	return fmt.Sprintf("%s=%q is invalid: want %s", e.Var, e.Value, e.Accepts)
}

// reader parses variables, keeping the first error so that Load reads as a list.
type reader struct {
	getenv func(string) string
	err    error
}

func (r *reader) fail(name, value, accepts string) {
	if r.err == nil {
		r.err = &VarError{Var: name, Value: value, Accepts: accepts}
	}
}

func (r *reader) lookup(name string) (string, bool) {
	v := strings.TrimSpace(r.getenv(name))
	return v, v != ""
}

func (r *reader) required(name, value, accepts string) {
	if value == "" {
		r.fail(name, "", accepts)
	}
}

func (r *reader) str(name string, dst *string, check func(string) string) {
	v, ok := r.lookup(name)
	if !ok {
		return
	}
	if check != nil {
		if accepts := check(v); accepts != "" {
			r.fail(name, v, accepts)
			return
		}
	}
	*dst = v
}

func (r *reader) oneOf(name string, dst *string, allowed ...string) {
	v, ok := r.lookup(name)
	if !ok {
		return
	}
	for _, a := range allowed {
		if v == a {
			*dst = v
			return
		}
	}
	r.fail(name, v, "one of "+strings.Join(allowed, ", "))
}

func (r *reader) boolean(name string, dst *bool) {
	v, ok := r.lookup(name)
	if !ok {
		return
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		r.fail(name, v, "true or false")
		return
	}
	*dst = b
}

func (r *reader) duration(name string, dst *time.Duration) {
	v, ok := r.lookup(name)
	if !ok {
		return
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		r.fail(name, v, "a positive Go duration such as 100ms, 2s or 10m")
		return
	}
	*dst = d
}

func (r *reader) rate(name string, dst *float64) bool {
	v, ok := r.lookup(name)
	if !ok {
		return false
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f < 0 || math.IsNaN(f) || math.IsInf(f, 0) {
		r.fail(name, v, "a number of tokens per second >= 0, such as 0.5 or 100")
		return false
	}
	*dst = f
	return true
}

func (r *reader) burst(name string, dst *int64) bool {
	v, ok := r.lookup(name)
	if !ok {
		return false
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 1 {
		r.fail(name, v, "an integer number of tokens >= 1")
		return false
	}
	*dst = n
	return true
}

func (r *reader) clientRate() *space.Rate {
	const rps, burst = "SPACE_CLUSTER_ACTIVATION_ADMISSION_CLIENT_REFILL_RPS", "SPACE_CLUSTER_ACTIVATION_ADMISSION_CLIENT_BURST"
	var rate space.Rate
	hasRPS := r.rate(rps, &rate.RefillRPS)
	hasBurst := r.burst(burst, &rate.Burst)
	switch {
	case hasRPS && hasBurst:
		return &rate
	case hasRPS:
		r.fail(burst, "", "an integer number of tokens >= 1; set together with "+rps)
	case hasBurst:
		r.fail(rps, "", "a number of tokens per second >= 0; set together with "+burst)
	}
	return nil
}

func (r *reader) integer(name string, dst *int, min int, accepts string) bool {
	v, ok := r.lookup(name)
	if !ok {
		return false
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < min {
		r.fail(name, v, accepts)
		return false
	}
	*dst = n
	return true
}

func (r *reader) positive(name string, dst *int) bool {
	return r.integer(name, dst, 1, "an integer >= 1")
}

func (r *reader) nonNegative(name string, dst *int) bool {
	return r.integer(name, dst, 0, "an integer >= 0")
}

func (r *reader) addrs(name string, dst *[]string) {
	v, ok := r.lookup(name)
	if !ok {
		return
	}
	var out []string
	for _, a := range strings.Split(v, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		if accepts := checkHostPort(a); accepts != "" {
			r.fail(name, v, accepts)
			return
		}
		out = append(out, a)
	}
	*dst = out
}

func (r *reader) cidrs(name string, dst *[]netip.Prefix) {
	v, ok := r.lookup(name)
	if !ok {
		return
	}
	var out []netip.Prefix
	for _, s := range strings.Split(v, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			// A bare address is a /32 (or /128).
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				r.fail(name, v, "comma-separated CIDRs such as 10.0.0.0/8,192.168.1.7/32")
				return
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		out = append(out, p.Masked())
	}
	*dst = out
}

func checkAddr(v string) string {
	if _, _, err := net.SplitHostPort(v); err != nil {
		return "a listen address such as :8080 or 127.0.0.1:8080"
	}
	return ""
}

func checkHostPort(v string) string {
	host, port, err := net.SplitHostPort(v)
	if err != nil || host == "" || port == "" {
		return "host:port, or several comma separated for a Redis Cluster"
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return "host:port with a numeric port"
	}
	return ""
}

func checkDatabaseURL(v string) string {
	if !strings.HasPrefix(v, "postgres://") && !strings.HasPrefix(v, "postgresql://") {
		return "a postgres:// URL"
	}
	return ""
}
