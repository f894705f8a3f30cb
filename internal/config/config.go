// Package config reads space-api's configuration from SPACE_* environment variables.
//
// Every variable is parsed and validated at start. A bad value is reported as one line
// naming the variable, the value and what it accepts, so that a typo in a Helm value
// stops a rollout at the first pod instead of misbehaving in production. Defaults live
// in one place, Default.
package config

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

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

// Redis locates the Redis that holds the buckets and leases, and says how to log in to
// it.
//
// It comes either from SPACE_REDIS_ADDRS or from SPACE_REDIS_URL (one of the two, never
// both); SPACE_REDIS_USERNAME, SPACE_REDIS_PASSWORD(_FILE) and SPACE_REDIS_TLS override
// the URL's parts (TLS only upwards: a rediss:// URL always speaks TLS). Printed with
// fmt or logged with slog, the password shows as [redacted].
type Redis struct {
	// Addrs is SPACE_REDIS_ADDRS (required unless SPACE_REDIS_URL is set): one address
	// for a standalone Redis, or for one node of a Redis Cluster (Mode says which);
	// several for a Redis Cluster.
	Addrs []string
	// Mode is SPACE_REDIS_MODE (default auto): auto asks the server at start (INFO
	// cluster) when there is one address, and takes several for a cluster.
	Mode RedisMode
	// Username is the ACL user (SPACE_REDIS_USERNAME, or the URL's); empty: the
	// default user.
	Username string
	// Password is SPACE_REDIS_PASSWORD, the content of SPACE_REDIS_PASSWORD_FILE (read
	// at load, one trailing newline trimmed), or the URL's. Empty: no password.
	Password Secret
	// DB is the database number of SPACE_REDIS_URL's path (default 0). A Redis Cluster
	// has database 0 only.
	DB int
	// TLS connects with TLS 1.2 or later (SPACE_REDIS_TLS, or a rediss:// URL).
	TLS bool
	// TLSCAFile is SPACE_REDIS_TLS_CA_FILE, a PEM bundle of the CAs that may sign the
	// server's certificate; TLSRootCAs is that bundle, parsed at load. Unset (nil): the
	// system roots.
	TLSCAFile  string
	TLSRootCAs *x509.CertPool
	// TLSServerName is the name to verify in the server's certificate
	// (SPACE_REDIS_TLS_SERVER_NAME); empty: the host of the address dialled.
	TLSServerName string
	// Timeout bounds every Redis call on the request path (SPACE_REDIS_TIMEOUT, default
	// 100ms): a slow Redis must not make every create slow.
	Timeout time.Duration
	// KeyPrefix namespaces every Redis key (SPACE_REDIS_KEY_PREFIX, default "space",
	// which gives exactly the keys of the design): deployments sharing one Redis (a
	// staging beside a production) each set their own. No braces: the cluster key is
	// the client keys' Redis Cluster hash tag.
	KeyPrefix string
	// From names the variable each setting came from, so that a start-up error (refused
	// credentials, a failed TLS handshake) names what to fix. Empty: not set.
	From RedisSources
}

// RedisSources names the variables the Redis settings came from: SPACE_REDIS_URL or
// the setting's own variable.
type RedisSources struct {
	Addrs, Username, Password, TLS string
}

// LogValue logs the Redis settings without the password (only whether one is set).
func (r Redis) LogValue() slog.Value {
	return slog.GroupValue(
		slog.Any("addrs", r.Addrs),
		slog.String("mode", string(r.Mode)),
		slog.String("username", r.Username),
		slog.Bool("password_set", r.Password != ""),
		slog.Int("db", r.DB),
		slog.Bool("tls", r.TLS),
		slog.String("tls_ca_file", r.TLSCAFile),
		slog.String("tls_server_name", r.TLSServerName),
		slog.Duration("timeout", r.Timeout),
		slog.String("key_prefix", r.KeyPrefix),
	)
}

// RedisMode is the value of SPACE_REDIS_MODE.
type RedisMode string

const (
	// RedisAuto takes several addresses for a Redis Cluster and asks a single address
	// what it is (INFO cluster): a managed cluster's one configuration endpoint is a
	// cluster, and is never taken for a standalone server.
	RedisAuto RedisMode = "auto"
	// RedisStandalone is one standalone server; a cluster node there is a start-up
	// error.
	RedisStandalone RedisMode = "standalone"
	// RedisCluster is a Redis Cluster, found from the addresses given (one is enough);
	// a server not in cluster mode there is a start-up error.
	RedisCluster RedisMode = "cluster"
)

// Secret is a string that must never be printed: fmt (every verb), slog and
// encoding/json all see "[redacted]" for a non-empty one. Reveal returns the value.
type Secret string

const redacted = "[redacted]"

// Reveal returns the secret itself, for the one place that sends it (the Redis client).
func (s Secret) Reveal() string { return string(s) }

func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return redacted
}

// GoString keeps %#v from printing the value.
func (s Secret) GoString() string { return `"` + s.String() + `"` }

// LogValue keeps slog from printing the value.
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.String()) }

// MarshalText keeps encoding/json (and every text encoder) from printing the value.
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

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
	// RefusalCacheMaxAge bounds how old a replica's memory of a bucket may be and still
	// refuse a create without asking Redis (SPACE_REFUSAL_CACHE_MAX_AGE, default 1s; 0
	// refuses nothing from memory). A bucket reset by hand is seen within it.
	RefusalCacheMaxAge time.Duration
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
		Redis:             Redis{Mode: RedisAuto, Timeout: 100 * time.Millisecond, KeyPrefix: "space"},
		Admission: Admission{
			Enabled:            true,
			Cluster:            space.Rate{RefillRPS: 100, Burst: 200},
			FailureMode:        FailOpen,
			RefusalCacheMaxAge: time.Second,
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

	r.redis(&c.Redis)
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
	r.durationOrZero("SPACE_REFUSAL_CACHE_MAX_AGE", &c.Admission.RefusalCacheMaxAge)

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
	// Hidden is set for a variable whose value may hold a secret (a password, a URL
	// that cannot be parsed to redact its password): the message leaves the value out.
	Hidden bool
	// With names a variable that must not be set together with Var.
	With string
}

func (e *VarError) Error() string {
	switch {
	case e.With != "":
		return fmt.Sprintf("%s and %s are both set: want %s", e.Var, e.With, e.Accepts)
	case e.Hidden:
		return fmt.Sprintf("%s is invalid (its value is not shown): want %s", e.Var, e.Accepts)
	case e.Value == "":
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

func (r *reader) failErr(err *VarError) {
	if r.err == nil {
		r.err = err
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

// durationOrZero is duration where 0 is a value of its own (off).
func (r *reader) durationOrZero(name string, dst *time.Duration) {
	v, ok := r.lookup(name)
	if !ok {
		return
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		r.fail(name, v, "a Go duration >= 0 such as 500ms or 1s (0 turns it off)")
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

// The Redis variables whose names the errors and RedisSources use.
const (
	envRedisURL           = "SPACE_REDIS_URL"
	envRedisAddrs         = "SPACE_REDIS_ADDRS"
	envRedisMode          = "SPACE_REDIS_MODE"
	envRedisUsername      = "SPACE_REDIS_USERNAME"
	envRedisPassword      = "SPACE_REDIS_PASSWORD"
	envRedisPasswordFile  = "SPACE_REDIS_PASSWORD_FILE"
	envRedisTLS           = "SPACE_REDIS_TLS"
	envRedisTLSCAFile     = "SPACE_REDIS_TLS_CA_FILE"
	envRedisTLSServerName = "SPACE_REDIS_TLS_SERVER_NAME"
)

// redis reads where Redis is and how to log in to it (see Redis for the precedence).
func (r *reader) redis(c *Redis) {
	_, hasURL := r.lookup(envRedisURL)
	_, hasAddrs := r.lookup(envRedisAddrs)
	switch {
	case hasURL && hasAddrs:
		r.failErr(&VarError{Var: envRedisURL, With: envRedisAddrs, Accepts: "one of the two: the URL names one address, the list one or several"})
		return
	case hasURL:
		r.redisURL(c)
	default:
		r.addrs(envRedisAddrs, &c.Addrs)
		if len(c.Addrs) == 0 {
			r.required(envRedisAddrs, "", "host:port, or several comma separated for a Redis Cluster (or set "+envRedisURL+")")
		}
		c.From.Addrs = envRedisAddrs
	}

	mode := string(c.Mode)
	r.oneOf(envRedisMode, &mode, string(RedisAuto), string(RedisStandalone), string(RedisCluster))
	c.Mode = RedisMode(mode)
	if c.Mode == RedisStandalone && len(c.Addrs) > 1 {
		r.fail(envRedisMode, mode, fmt.Sprintf("auto or cluster for the %d addresses of %s: a standalone server has one", len(c.Addrs), envRedisAddrs))
	}
	if c.Mode == RedisCluster && c.DB != 0 {
		r.fail(envRedisMode, mode, fmt.Sprintf("standalone or auto for database %d of %s: a Redis Cluster has database 0 only", c.DB, envRedisURL))
	}

	if v, ok := r.lookup(envRedisUsername); ok {
		c.Username, c.From.Username = v, envRedisUsername
	}
	r.redisPassword(c)

	var tlsOn bool
	r.boolean(envRedisTLS, &tlsOn)
	if tlsOn && !c.TLS {
		// Only upwards: "false", which the chart renders by default, never turns off
		// the TLS a rediss:// URL asks for.
		c.TLS, c.From.TLS = true, envRedisTLS
	}
	if v, ok := r.lookup(envRedisTLSCAFile); ok {
		if !c.TLS {
			r.fail(envRedisTLSCAFile, v, "a CA bundle for TLS, which is off: set "+envRedisTLS+"=true (or use a rediss:// "+envRedisURL+")")
			return
		}
		pool, err := readCAFile(v)
		if err != nil {
			r.fail(envRedisTLSCAFile, v, "a readable PEM file of CA certificates ("+err.Error()+")")
			return
		}
		c.TLSCAFile, c.TLSRootCAs = v, pool
	}
	if v, ok := r.lookup(envRedisTLSServerName); ok {
		if !c.TLS {
			r.fail(envRedisTLSServerName, v, "a name to verify with TLS, which is off: set "+envRedisTLS+"=true (or use a rediss:// "+envRedisURL+")")
			return
		}
		c.TLSServerName = v
	}
}

// redisURL reads SPACE_REDIS_URL: redis://[user:password@]host:port[/db], or rediss://
// for TLS. Errors show the URL with its user and password replaced, or not at all.
func (r *reader) redisURL(c *Redis) {
	const accepts = "redis://[user:password@]host:port[/db], or rediss:// for TLS"
	raw := r.getenv(envRedisURL) // untrimmed: a password is taken as it is
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil {
		// url.Parse's error quotes the whole URL, password included: not shown.
		r.failErr(&VarError{Var: envRedisURL, Hidden: true, Accepts: accepts})
		return
	}
	shown := redactURL(u)
	switch {
	case u.Scheme != "redis" && u.Scheme != "rediss":
		r.fail(envRedisURL, shown, accepts)
		return
	case u.RawQuery != "" || u.Fragment != "":
		r.fail(envRedisURL, shown, accepts+", without query options: SPACE_REDIS_TIMEOUT and the SPACE_REDIS_TLS_* variables set those")
		return
	case u.Hostname() == "":
		r.fail(envRedisURL, shown, accepts+", with a host")
		return
	}
	opts, err := redis.ParseURL(u.String())
	if err != nil {
		// Past url.Parse, go-redis' errors are about the scheme or the path (the
		// database number), never the user info.
		r.fail(envRedisURL, shown, accepts+" ("+err.Error()+")")
		return
	}
	if opts.DB < 0 {
		r.fail(envRedisURL, shown, accepts+", with a database number >= 0")
		return
	}
	if checkHostPort(opts.Addr) != "" {
		r.fail(envRedisURL, shown, accepts+", with a port number up to 65535")
		return
	}
	c.Addrs, c.DB = []string{opts.Addr}, opts.DB
	c.From.Addrs = envRedisURL
	if opts.Username != "" {
		c.Username, c.From.Username = opts.Username, envRedisURL
	}
	if opts.Password != "" {
		c.Password, c.From.Password = Secret(opts.Password), envRedisURL
	}
	if u.Scheme == "rediss" {
		c.TLS, c.From.TLS = true, envRedisURL
	}
}

// redactURL is u for an error message: its user and password, if any, replaced.
func redactURL(u *url.URL) string {
	shown := *u
	if shown.User != nil {
		shown.User = url.User("REDACTED")
	}
	return shown.String()
}

// redisPassword reads SPACE_REDIS_PASSWORD or SPACE_REDIS_PASSWORD_FILE (not both);
// either replaces the URL's password. No error shows the password.
func (r *reader) redisPassword(c *Redis) {
	// The password is taken as it is, spaces included; only an empty one is unset.
	pw := r.getenv(envRedisPassword)
	file, hasFile := r.lookup(envRedisPasswordFile)
	switch {
	case pw != "" && hasFile:
		r.failErr(&VarError{Var: envRedisPassword, With: envRedisPasswordFile, Accepts: "one of the two (prefer the file: it keeps the password out of the environment)"})
	case pw != "":
		c.Password, c.From.Password = Secret(pw), envRedisPassword
	case hasFile:
		b, err := os.ReadFile(file)
		if err != nil {
			r.fail(envRedisPasswordFile, file, "a readable file holding the Redis password ("+pathErr(err)+")")
			return
		}
		s := string(b)
		if strings.HasSuffix(s, "\r\n") {
			s = s[:len(s)-2]
		} else {
			s = strings.TrimSuffix(s, "\n")
		}
		if s == "" {
			r.fail(envRedisPasswordFile, file, "a file holding the Redis password; this one is empty")
			return
		}
		c.Password, c.From.Password = Secret(s), envRedisPasswordFile
	}
}

// readCAFile parses a PEM bundle of CA certificates: every block a certificate, at
// least one.
func readCAFile(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, errors.New(pathErr(err))
	}
	pool := x509.NewCertPool()
	n := 0
	for rest := b; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			switch {
			case n == 0:
				return nil, errors.New("no PEM certificate in it")
			case len(bytes.TrimSpace(rest)) != 0:
				return nil, errors.New("text that is not PEM after certificate " + strconv.Itoa(n))
			}
			break
		}
		if block.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("a %s block, not a CERTIFICATE", block.Type)
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d: %w", n+1, err)
		}
		pool.AddCert(cert)
		n++
	}
	return pool, nil
}

// pathErr is an os error without the path, which the message names already.
func pathErr(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}
