// Package config reads space-api's configuration from environment variables.
//
// Every variable is declared once, in vars.go: its name, its default, one line of help
// and the parser that stores it in a field of Config. Load, Default, `space-api config`
// and docs/configuration.md all come from that declaration, so a default cannot differ
// between the code, the help and the docs. Packages take their settings from Config;
// they keep no defaults of their own for them.
//
// Every variable is parsed and validated at start. A bad value is reported as one line
// naming the variable, the value and what it accepts, so that a typo in a Helm value
// stops a rollout at the first pod instead of misbehaving in production.
package config

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/space-sandbox/space"
)

// Config is the whole configuration, grouped by the component that uses it. vars.go
// says which variable sets each field, and its default.
type Config struct {
	// HTTPAddr is the public listener.
	HTTPAddr string
	// InternalHTTPAddr serves /internal/v1 and /metrics. It must never be reachable by
	// clients.
	InternalHTTPAddr string
	// DatabaseURL is the Postgres URL.
	DatabaseURL string
	// LogLevel is debug, info, warn or error.
	LogLevel string
	// MetricsBudgetKeys bounds the budget keys that label series of their own; the
	// rest are summed under budget_key="_other".
	MetricsBudgetKeys int
	// ShutdownTimeout bounds the drain of in-flight requests and running jobs on
	// SIGTERM; its default stays under Kubernetes' 30s grace period.
	ShutdownTimeout time.Duration
	// IdempotencyKeyTTL is how long an Idempotency-Key names the request it came with:
	// a repeat within it gets the first request's outcome, and the key can name a new
	// request after it.
	IdempotencyKeyTTL time.Duration

	Auth       Auth
	Redis      Redis
	Admission  Admission
	Flags      Flags
	Sandbox    Sandbox
	Pool       Pool
	Dispatcher Dispatcher
	Reconcile  Reconcile
	Lifecycle  Lifecycle
	Retention  Retention
	Overload   Overload
	Kubernetes Kubernetes
}

// Pool configures the warm pool's replenisher (internal/pool).
type Pool struct {
	// RefillReserve is the share of the cluster bucket's burst that a warm-up never
	// takes: a refill is charged only while the bucket would keep at least
	// ceil(RefillReserve × burst) tokens after it, so that the users' activations find
	// those tokens whatever the refills do.
	RefillReserve float64
}

// Reconcile configures the reconciler that settles what crashes and outages leave
// behind (internal/sandbox.Reconciler).
type Reconcile struct {
	// Interval is how often the replica holding the reconciler's lock looks.
	Interval time.Duration
	// Grace is added to the substrate's timeout to get the bound after which a
	// sandbox still starting, restoring or pausing is settled; resources younger than
	// it are never taken for orphans.
	Grace time.Duration
}

// Overload bounds what a replica takes on at once (docs/operations.md, "Overload").
type Overload struct {
	// MaxInFlight is how many public requests may be at work at once; the rest wait
	// their turn, shared between budget keys, or are answered 503. 0: no bound.
	MaxInFlight int
	// MaxQueued and MaxQueuedPerClient bound the requests waiting, in all and of one
	// budget key; MaxQueueWait how long one waits before its 503.
	MaxQueued, MaxQueuedPerClient int
	MaxQueueWait                  time.Duration
	// MaxConnections bounds the public listener's open connections: one over it is
	// closed as it is accepted. 0: no bound.
	MaxConnections int
}

// Retention bounds how long what has ended is kept (docs/operations.md, "Retention"):
// deleted in small batches once older; 0 keeps it for ever.
type Retention struct {
	// Sandboxes is how long a terminated or failed sandbox's row is kept after it
	// ended.
	Sandboxes time.Duration
	// Operations is how long a finished operation is kept after it finished (River
	// deletes its job itself: a day after it completed).
	Operations time.Duration
}

// Lifecycle configures the enforcement of the sandbox lifecycle (internal/sandbox.
// Lifecycle; docs/lifecycle.md).
type Lifecycle struct {
	// Interval is how often the replica holding the lifecycle's lock takes the due
	// actions: none is more than about one interval late.
	Interval time.Duration
}

// Auth decides how a caller's client id is established.
type Auth struct {
	// Mode is AuthAPIKey (Authorization: Bearer, keys hashed in Postgres) or
	// AuthTrustedHeader (X-Client-ID from a trusted proxy).
	Mode AuthMode
	// TrustedProxyCIDRs are the peers whose X-Client-ID is believed in trusted_header
	// mode (required there).
	TrustedProxyCIDRs []netip.Prefix
	// FailureRate limits failed authentications per source address.
	FailureRate space.Rate
}

// GCPercent is space-api's GOGC when the environment sets none; Go's own is 100.
// space-api holds little (a live heap of about 14 MB under a flood of 25,000 refusals
// a second) and allocates per request: at 100 a flood of 5,000 refusals a second made
// it collect every ~0.45 s, each collection with stop-the-world phases of up to 9 ms
// on 2 busy cores, landing on every request in flight. At 400 the heap may grow to
// five times the live one (about 70 MB) and collections come four times less often:
// across seven interleaved runs of the bench's flood, a quiet client's p99 beside the
// 5,000/s flood was lower in six, median 9.9 ms against 13.9 (docs/benchmarks.md).
// GOGC, when set, wins; GOMEMLIMIT, when set, still bounds the heap. The bench runs
// its peers at it too.
const GCPercent = 400

// AuthMode is the value of SPACE_AUTH_MODE.
type AuthMode string

const (
	AuthAPIKey        AuthMode = "api_key"
	AuthTrustedHeader AuthMode = "trusted_header"
)

// FailureMode says what admission does when Redis cannot answer.
type FailureMode string

const (
	// FailOpen admits (and counts an error): a Redis outage must not stop the fleet.
	// Each replica still spends the buckets as it last knew them, so that a client
	// keeps its rate and a flooder does not get more than its own (see
	// admission.Admitter.spendLocally).
	FailOpen FailureMode = "open"
	// FailClosed rejects with 503: for fleets where an unbudgeted activation costs more
	// than a refused one.
	FailClosed FailureMode = "closed"
)

// Admission configures the activation buckets (docs/design.md, "Admission buckets").
type Admission struct {
	// Enabled turns charging on. Off, nothing is charged and the flag's rate entries
	// are ignored.
	Enabled bool
	// Cluster is the shared bucket.
	Cluster space.Rate
	// Client is the rate of every client key, unknown included, unless the quota flag
	// says otherwise. Nil when both of its variables are unset: no per-client bucket.
	// Setting one of the two without the other is an error.
	Client *space.Rate
	// FailureMode is what a Redis error or timeout does.
	FailureMode FailureMode
	// Shadow decides and records but admits.
	Shadow bool
	// RefusalCacheMaxAge bounds how old a replica's memory of a bucket may be and still
	// refuse a create without asking Redis; 0 refuses nothing from memory. A bucket
	// reset by hand is seen within it.
	RefusalCacheMaxAge time.Duration
	// RefusalPace holds a create refused from memory that long before its answer while
	// another budget key's request is at work on the replica; 0 answers at once.
	RefusalPace time.Duration
}

// parseClientRefill and parseClientBurst each set one half of Client; check refuses
// one half without the other.
func (a *Admission) parseClientRefill(s string) error {
	rps, err := refill(s)
	if err == nil {
		a.client().RefillRPS = rps
	}
	return err
}

func (a *Admission) parseClientBurst(s string) error {
	burst, err := tokens(s)
	if err == nil {
		a.client().Burst = burst
	}
	return err
}

func (a *Admission) client() *space.Rate {
	if a.Client == nil {
		a.Client = &space.Rate{}
	}
	return a.Client
}

// Flags locates the flag-definition file.
type Flags struct {
	// File is the flagd file; empty means no overrides: env defaults apply.
	File string
	// PollInterval is how often the file is checked for a change.
	PollInterval time.Duration
	// FallbackTier is the floor tier: the tier of every client whose tier cannot be
	// resolved. A quota flag with a tier table must name it among its tiers.
	FallbackTier string
}

// Sandbox configures the create path.
type Sandbox struct {
	// TemplatesFile maps a template name to what the substrate needs.
	TemplatesFile string
	// TemplatesPollInterval is how often the templates file is checked for a change:
	// it is reloaded live.
	TemplatesPollInterval time.Duration
	// Substrate is one of Substrates.
	Substrate string
	// MaxShape holds the shape caps. A shape over a cap does not resolve: 422.
	MaxShape space.Shape
	// MaxBodyBytes caps a request body.
	MaxBodyBytes int64
	// SimulatedColdStart is how long the simulated substrate takes to cold start,
	// warm, snapshot or restore a sandbox (make run uses 300ms so that warm hits
	// visibly win). Adopting a warm slot takes a tenth.
	SimulatedColdStart time.Duration
	// SimulatedTimeout is the simulated substrate's timeout, from which the recovery
	// bounds are counted; zero leaves it to the substrate (the cold start plus 5s).
	SimulatedTimeout time.Duration
	// SimulatedStateDir, when set, keeps what the simulated substrate runs in a file
	// there, shared by every process pointed at it: replicas of one test share one
	// simulated cluster, and a killed one leaves its sandboxes behind as a real
	// substrate would.
	SimulatedStateDir string
}

// Substrates are the accepted values of SPACE_SUBSTRATE.
var Substrates = []string{"simulated", "kubernetes"}

// Dispatcher configures queued operations.
type Dispatcher struct {
	// Workers is how many queued operations this replica runs at once; 0 runs none,
	// and the replica still accepts async requests.
	Workers int
	// AdmissionDeadline is how long an operation may wait for admission before it fails
	// as admission_timeout.
	AdmissionDeadline time.Duration
	// MaxSnooze caps how long one admission snooze of a queued operation lasts: a
	// snooze lasts until the bucket refills, and the cap bounds how late a raised rate
	// is noticed.
	MaxSnooze time.Duration
	// MaxAttempts is how many real attempts a queued operation gets before it fails;
	// admission snoozes are not attempts.
	MaxAttempts int
	// OwnerLanes is how many of one owner's queued operations may be runnable at once,
	// per unit of its queue weight: the rest wait parked, so that the queue holds a
	// bounded share of any owner's backlog and serves the owners in turn.
	OwnerLanes int
	// UI mounts River UI at /riverui/ on the internal listener: the queue's jobs, their
	// errors and attempts, in a browser. Off by default because it can also cancel,
	// retry and delete jobs, and the internal listener has no authentication.
	UI bool
	// JobTimeout bounds one run of a queued operation; zero is the substrate's own
	// timeout plus a margin (internal/app), which no run of a live replica outlasts.
	JobTimeout time.Duration
}

// Kubernetes configures the kubernetes substrate (SPACE_SUBSTRATE=kubernetes); the
// substrate builds its client from it.
type Kubernetes struct {
	// Namespace holds the sandbox Pods. Empty: the namespace space-api itself runs in,
	// else the kubeconfig context's namespace.
	Namespace string
	// ReadyTimeout bounds the wait for a Pod to become Ready: long enough for a cold
	// image pull on a fresh node, short enough that a sandbox stuck Pending (no
	// capacity, bad image) fails instead of holding its client's live-sandbox place.
	ReadyTimeout time.Duration
	// QPS and Burst are the client's rate limit towards the API server. client-go's
	// own default, 5 and 10, would queue a burst of cold starts in the client rather
	// than in the admission buckets, where they belong.
	QPS   float32
	Burst int
	// Kubeconfig is KUBECONFIG: one or more kubeconfig files (a path list). Empty: the
	// in-cluster service account, else ~/.kube/config.
	Kubeconfig string
	// StorageClass of every sandbox's volume claim; empty: the claim names none, and
	// the cluster's default StorageClass provisions it.
	StorageClass string
	// SnapshotClass is the CSI VolumeSnapshotClass a pause snapshots the claim with;
	// empty: a pause keeps the claim only.
	SnapshotClass string
	// MountPath is where the claim is mounted in the sandbox's first container: what a
	// pause keeps is what the sandbox wrote under it.
	MountPath string
	// SoftBreachPriorityClass, when set, is the PriorityClass of the Pods of sandboxes
	// admitted over their client's soft limit, so that the scheduler preempts them
	// first under pressure.
	SoftBreachPriorityClass string
}

// Default returns the configuration with every declared default applied and nothing
// required set.
func Default() Config {
	var c Config
	if _, err := load(&c, nil, []string{}); err != nil {
		// A default its own parser refuses: TestDefaultsAreTheDocumentedValues fails.
		panic("config: a declared default does not parse: " + err.Error())
	}
	return c
}

// Load reads the configuration through getenv. Variables are parsed in declaration
// order, an unset one taking its default, and the first that does not parse is the
// error; then the rules between variables are checked (a client rate set in pairs,
// trusted_header with proxies, one source of Redis addresses). Every error is a
// *VarError naming a variable.
func Load(getenv func(string) string) (Config, error) {
	var c Config
	set, err := load(&c, getenv, nil)
	if err != nil {
		return Config{}, err
	}
	if err := c.check(set); err != nil {
		return Config{}, err
	}
	return c, nil
}

// LoadDatabase reads only what the commands that work on the database alone need
// (`space-api migrate`, `space-api keys`): SPACE_DATABASE_URL and SPACE_LOG_LEVEL;
// everything else keeps its default. A migration job has no templates or Redis to
// point at.
func LoadDatabase(getenv func(string) string) (Config, error) {
	var c Config
	if _, err := load(&c, getenv, []string{EnvDatabaseURL, EnvLogLevel}); err != nil {
		return Config{}, err
	}
	return c, nil
}

// load parses the declared variables into c. only, when not nil, names the variables
// read from getenv; the others take their defaults (an empty only reads nothing). It
// returns which variables were set.
func load(c *Config, getenv func(string) string, only []string) (map[string]bool, error) {
	set := map[string]bool{}
	for _, v := range declare(c) {
		raw, read := "", only == nil || slices.Contains(only, v.Name)
		if read {
			raw = getenv(v.Name)
		}
		if !v.Raw {
			raw = strings.TrimSpace(raw)
		}
		switch {
		case raw != "":
			set[v.Name] = true
			if err := v.parse(raw); err != nil {
				return nil, v.refusal(raw, err)
			}
		case v.Required != "" && read:
			return nil, &VarError{Var: v.Name, Accepts: v.Required}
		case v.Default != "":
			if err := v.parse(v.Default); err != nil {
				return nil, v.refusal(v.Default, err)
			}
		}
	}
	return set, nil
}

// check applies the rules between variables, once every one of them is parsed. set
// says which variables were set.
func (c *Config) check(set map[string]bool) error {
	if c.Auth.Mode == AuthTrustedHeader && len(c.Auth.TrustedProxyCIDRs) == 0 {
		return &VarError{Var: envTrustedProxyCIDRs, Accepts: "one or more CIDRs (e.g. 10.0.0.0/8); required when " + envAuthMode + "=trusted_header"}
	}
	if err := c.Redis.check(); err != nil {
		return err
	}
	rps, burst := envClientRefillRPS, envClientBurst
	switch {
	case set[rps] && !set[burst]:
		return &VarError{Var: burst, Accepts: "an integer number of tokens >= 1; set together with " + rps}
	case set[burst] && !set[rps]:
		return &VarError{Var: rps, Accepts: "a number of tokens per second >= 0; set together with " + burst}
	}
	return nil
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

// refusal turns what v's parser returned for value into the *VarError Load reports: a
// *VarError of the parser's own (a redacted value, two variables set together) keeps
// its fields, and any other error's text is what v accepts.
func (v Var) refusal(value string, err error) *VarError {
	var ve *VarError
	if errors.As(err, &ve) {
		if ve.Var == "" {
			ve.Var = v.Name
		}
		return ve
	}
	return &VarError{Var: v.Name, Value: value, Accepts: err.Error(), Hidden: v.Secret}
}
