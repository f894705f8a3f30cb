// Package redisconn builds the Redis client of a replica from config.Redis:
// credentials and TLS for every connection, and a mode (standalone or cluster) that
// the server itself confirms. A single address taken for a standalone server when it
// is one node of a cluster answers every decision with MOVED, which fail-open
// admission turns into unbudgeted activations for as long as the replica lives; so
// the mode is never guessed from the number of addresses alone.
//
// At start the replica asks the first address that answers (INFO cluster):
//
//   - it answers: the mode follows from what it says (SPACE_REDIS_MODE=auto) or must
//     match it (standalone, cluster); a mismatch, refused credentials or a failed TLS
//     handshake stops the start with an error naming the variables to fix.
//   - nothing answers (Redis down, a network partition): that is a Redis outage like
//     any other, not a reason to crash-loop, so the replica starts (admission fails
//     open or closed as configured; /readyz says so). Its client then asks again each
//     time it needs to know where keys live, and starts sending commands only once a
//     server has answered and passed the same checks; a problem found then is logged
//     and fails every Redis call with the same message, never silently.
package redisconn

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/space-sandbox/space/internal/config"
)

const (
	// dialTimeout bounds one connection's dial and TLS handshake.
	dialTimeout = time.Second
	// checkTimeout bounds the start-up check: a Redis that has not answered within
	// it is down for now, and the start goes on without it.
	checkTimeout = 2 * time.Second
)

// setupError is a Redis setting that cannot work: refused credentials, a failed
// TLS handshake, a server of the other mode. Its message names the variables to fix
// and never holds the password.
type setupError struct {
	msg string
	err error
}

func (e *setupError) Error() string {
	if e.err == nil {
		return e.msg
	}
	return e.msg + ": " + e.err.Error()
}

func (e *setupError) Unwrap() error { return e.err }

// Open returns the client of the Redis of cfg, a *redis.Client or a
// *redis.ClusterClient, after checking what that Redis is; logger is told what was
// found, and later, when nothing answered at start, what is found once something
// does. Only a setup error (refused credentials, a failed TLS handshake, a server of
// the other mode; its message names the variables to fix) stops the start: an
// unreachable Redis does not (see the package comment). The caller closes the client.
func Open(ctx context.Context, cfg config.Redis, logger *slog.Logger) (redis.UniversalClient, error) {
	check := &checker{cfg: cfg}
	checkCtx, cancel := context.WithTimeout(ctx, checkTimeout)
	found, err := check.detect(checkCtx, false)
	cancel()
	var setup *setupError
	switch {
	case errors.As(err, &setup):
		return nil, err
	case err != nil:
		logger.Warn("redis does not answer at start: its mode is checked when it does, and until then every Redis call fails",
			"redis", cfg, "err", err)
		check.logger = logger
		return check.deferredClient(), nil
	case found.cluster:
		logger.Info("redis is a cluster", "redis", cfg, "answered", found.addr)
		return redis.NewClusterClient(clusterOptions(cfg)), nil
	default:
		logger.Info("redis is a standalone server", "redis", cfg, "answered", found.addr)
		return redis.NewClient(options(cfg, found.addr)), nil
	}
}

// options are the options of a standalone client of addr. ContextTimeoutEnabled
// makes each call's socket deadlines those of its context, so that the admission
// components run their calls directly instead of racing each in a goroutine of its own
// against the timeout (see admission.Options.Redis): one goroutine, channel and select
// fewer per Redis call, three calls per create.
func options(cfg config.Redis, addr string) *redis.Options {
	return &redis.Options{
		Addr:                  addr,
		Username:              cfg.Username,
		Password:              cfg.Password.Reveal(),
		DB:                    cfg.DB,
		TLSConfig:             tlsConfig(cfg),
		DialTimeout:           dialTimeout,
		ReadTimeout:           cfg.Timeout,
		WriteTimeout:          cfg.Timeout,
		ContextTimeoutEnabled: true,
	}
}

// clusterOptions are the options of a cluster client seeded with every configured
// address (one is enough: the cluster names the others).
func clusterOptions(cfg config.Redis) *redis.ClusterOptions {
	return &redis.ClusterOptions{
		Addrs:                 cfg.Addrs,
		Username:              cfg.Username,
		Password:              cfg.Password.Reveal(),
		TLSConfig:             tlsConfig(cfg),
		DialTimeout:           dialTimeout,
		ReadTimeout:           cfg.Timeout,
		WriteTimeout:          cfg.Timeout,
		ContextTimeoutEnabled: true,
	}
}

// tlsConfig is the TLS configuration of every connection, nil without TLS. An empty
// ServerName verifies the host of the address dialled (crypto/tls fills it in per
// connection), so cluster nodes found by IP are verified by IP.
func tlsConfig(cfg config.Redis) *tls.Config {
	if !cfg.TLS {
		return nil
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		RootCAs:    cfg.TLSRootCAs, // nil: the system roots
		ServerName: cfg.TLSServerName,
	}
}

// checker asks the configured Redis what it is, and judges the answer against the
// configuration.
type checker struct {
	cfg config.Redis
	// logger, set for a deferred client, is told when the answer changes.
	logger *slog.Logger

	mu sync.Mutex
	// learnt are the node addresses of the last CLUSTER SLOTS: asked after the
	// configured ones, so that a deferred client follows a cluster whose configured
	// node is gone.
	learnt []string
	// last is the outcome last logged.
	last string
}

// answer is what a Redis said it is.
type answer struct {
	addr    string
	cluster bool
	// slots are the cluster's, when asked for.
	slots []redis.ClusterSlot
}

// detect asks the configured addresses in turn until one answers. The error is a
// *setupError when the answer (or the refusal) shows the settings cannot work,
// and any other error when no address answered.
func (c *checker) detect(ctx context.Context, withSlots bool) (answer, error) {
	var firstErr error
	for _, addr := range c.candidates() {
		found, err := c.probe(ctx, addr, withSlots)
		if err == nil {
			return found, c.judge(found)
		}
		if setup := c.classify(addr, err); setup != nil {
			return answer{}, setup
		}
		if firstErr == nil {
			firstErr = fmt.Errorf("redis at %s: %w%s", addr, err, c.hint(err))
		}
		if ctx.Err() != nil {
			break
		}
	}
	return answer{}, fmt.Errorf("detect redis mode: %w", firstErr)
}

func (c *checker) candidates() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := slices.Clone(c.cfg.Addrs)
	for _, a := range c.learnt {
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// probe asks addr for INFO cluster (and CLUSTER SLOTS of a cluster, withSlots) on a
// connection of its own.
func (c *checker) probe(ctx context.Context, addr string, withSlots bool) (answer, error) {
	opts := options(c.cfg, addr)
	opts.DB = 0 // every server has database 0; a cluster has no other
	opts.PoolSize, opts.MaxRetries = 1, -1
	client := redis.NewClient(opts)
	defer client.Close()

	found := answer{addr: addr}
	info, err := client.Info(ctx, "cluster").Result()
	switch {
	case err == nil:
		found.cluster = clusterEnabled(info)
	case redis.IsPermissionError(err) && c.cfg.Mode != config.RedisAuto:
		// A user that may not run INFO: the mode set explicitly is believed.
		found.cluster = c.cfg.Mode == config.RedisCluster
	default:
		return found, err
	}
	if found.cluster && withSlots {
		if found.slots, err = client.ClusterSlots(ctx).Result(); err != nil {
			return found, fmt.Errorf("CLUSTER SLOTS: %w", err)
		}
	}
	return found, nil
}

// clusterEnabled reads cluster_enabled from INFO cluster; a server without the line
// (an old or Redis-compatible one) is not a cluster.
func clusterEnabled(info string) bool {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "cluster_enabled:"); ok {
			return v == "1"
		}
	}
	return false
}

// judge checks what a server said it is against the configured mode.
func (c *checker) judge(f answer) error {
	cfg := c.cfg
	what := "not in cluster mode (cluster_enabled:0)"
	if f.cluster {
		what = "a Redis Cluster node (cluster_enabled:1)"
	}
	switch {
	case cfg.Mode == config.RedisStandalone && f.cluster:
		return &setupError{msg: fmt.Sprintf("%[1]s=standalone, but Redis at %[2]s is %[3]s: set %[1]s=cluster (or auto)", config.EnvRedisMode, f.addr, what)}
	case cfg.Mode == config.RedisCluster && !f.cluster:
		return &setupError{msg: fmt.Sprintf("%[1]s=cluster, but Redis at %[2]s is %[3]s: set %[1]s=standalone (or auto)", config.EnvRedisMode, f.addr, what)}
	case cfg.Mode == config.RedisAuto && len(cfg.Addrs) > 1 && !f.cluster:
		return &setupError{msg: fmt.Sprintf("%s=auto takes the %d addresses of %s for a Redis Cluster, but Redis at %s is %s: name one address for a standalone server", config.EnvRedisMode, len(cfg.Addrs), config.EnvRedisAddrs, f.addr, what)}
	case f.cluster && cfg.DB != 0:
		return &setupError{msg: fmt.Sprintf("%s names database %d, but Redis at %s is %s, which has database 0 only", config.EnvRedisURL, cfg.DB, f.addr, what)}
	}
	return nil
}

// classify returns the setup error that err shows, or nil when err may pass (an
// outage).
func (c *checker) classify(addr string, err error) *setupError {
	cfg := c.cfg
	switch {
	case redis.IsAuthError(err) || redis.HasErrorPrefix(err, "AUTH"):
		if cfg.Password == "" {
			return &setupError{msg: fmt.Sprintf("%s/%s: Redis at %s wants a password and none is set", config.EnvRedisPasswordFile, config.EnvRedisPassword, addr), err: err}
		}
		return &setupError{msg: fmt.Sprintf("%s: Redis at %s refused the credentials", c.credentialVars(), addr), err: err}
	case redis.IsPermissionError(err) && cfg.Mode == config.RedisAuto:
		return &setupError{msg: fmt.Sprintf("%[1]s/%[2]s: the Redis user %[3]s at %[4]s may not run INFO, which %[2]s=auto needs to tell a standalone server from a cluster: allow it (+info) or set %[2]s",
			config.EnvRedisUsername, config.EnvRedisMode, orDefault(cfg.Username, "default"), addr), err: err}
	case redis.IsPermissionError(err):
		return &setupError{msg: fmt.Sprintf("%s: the Redis user %s at %s may not run a command the replica needs", config.EnvRedisUsername, orDefault(cfg.Username, "default"), addr), err: err}
	}
	if !cfg.TLS {
		return nil
	}
	tlsVar := orDefault(cfg.From.TLS, config.EnvRedisTLS)
	var (
		unknownCA x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
		record    tls.RecordHeaderError
		opErr     *net.OpError
	)
	switch {
	case errors.As(err, &unknownCA):
		roots := "the system roots (" + config.EnvRedisTLSCAFile + " is not set)"
		if cfg.TLSCAFile != "" {
			roots = cfg.TLSCAFile
		}
		return &setupError{msg: fmt.Sprintf("%s: the TLS handshake with Redis at %s failed: its certificate is not signed by a CA of %s", config.EnvRedisTLSCAFile, addr, roots), err: err}
	case errors.As(err, &hostname):
		name := cfg.TLSServerName
		if name == "" {
			name, _, _ = net.SplitHostPort(addr)
		}
		return &setupError{msg: fmt.Sprintf("%s: the TLS handshake with Redis at %s failed: its certificate is not for %s", config.EnvRedisTLSServerName, addr, name), err: err}
	case errors.As(err, &invalid):
		return &setupError{msg: fmt.Sprintf("%s: the TLS handshake with Redis at %s failed: its certificate is not valid", config.EnvRedisTLSCAFile, addr), err: err}
	case errors.As(err, &record):
		return &setupError{msg: fmt.Sprintf("%s: Redis at %s does not speak TLS", tlsVar, addr), err: err}
	case errors.As(err, &opErr) && opErr.Op == "remote error":
		return &setupError{msg: fmt.Sprintf("%s/%s/%s: Redis at %s refused the TLS handshake", tlsVar, config.EnvRedisTLSCAFile, config.EnvRedisTLSServerName, addr), err: err}
	}
	return nil
}

// credentialVars names the variables the credentials came from (config.Redis.From),
// e.g. "SPACE_REDIS_USERNAME/SPACE_REDIS_PASSWORD_FILE".
func (c *checker) credentialVars() string {
	var vars []string
	for _, v := range []string{c.cfg.From.Username, c.cfg.From.Password} {
		if v != "" && !slices.Contains(vars, v) {
			vars = append(vars, v)
		}
	}
	return strings.Join(vars, "/")
}

// hint adds what an outage may really be: a plain client on a TLS port gets its
// connection closed without an answer, and a TLS client of a plain port (Redis waits
// for a line that the TLS hello never ends) gets no answer at all. Neither is certain
// enough to stop a start: a proxy without backends closes connections too, and a
// stalled server does not answer either.
func (c *checker) hint(err error) string {
	var ne net.Error
	switch {
	case !c.cfg.TLS && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)):
		// A TLS server closes on the first bytes that are not a handshake: EOF, or a
		// reset when some of them were still unread.
		return " (the server closed the connection without answering: if it serves TLS, set " + config.EnvRedisTLS + "=true)"
	case c.cfg.TLS && errors.As(err, &ne) && ne.Timeout():
		return " (no answer: if the server does not speak TLS, " + orDefault(c.cfg.From.TLS, config.EnvRedisTLS) + " must not ask for it)"
	}
	return ""
}

// orDefault is v, or fallback when v is empty.
func orDefault(v, fallback string) string {
	if v == "" {
		return fallback
	}
	return v
}

// deferredClient is the client of a replica that could not reach Redis at start: a
// cluster client whose view of the slots comes from detect, asked again at each state
// load, so that it serves a standalone server (every slot on it) or a cluster (its
// CLUSTER SLOTS) as found once one answers, and fails every call until then, or
// after a setup error.
func (c *checker) deferredClient() *redis.ClusterClient {
	opts := clusterOptions(c.cfg)
	opts.ClusterSlots = c.slots
	db := c.cfg.DB
	opts.NewClient = func(o *redis.Options) *redis.Client {
		o.DB = db // a standalone server's database; judge refuses a cluster with one
		return redis.NewClient(o)
	}
	return redis.NewClusterClient(opts)
}

// slots is deferredClient's ClusterSlots.
func (c *checker) slots(ctx context.Context) ([]redis.ClusterSlot, error) {
	if _, ok := ctx.Deadline(); !ok { // a background reload
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, checkTimeout)
		defer cancel()
	}
	found, err := c.detect(ctx, true)
	c.report(found, err)
	switch {
	case err != nil:
		return nil, err
	case !found.cluster:
		return []redis.ClusterSlot{{Start: 0, End: 16383, Nodes: []redis.ClusterNode{{Addr: found.addr}}}}, nil
	}
	var learnt []string
	for _, s := range found.slots {
		for _, n := range s.Nodes {
			learnt = append(learnt, n.Addr)
		}
	}
	c.mu.Lock()
	c.learnt = learnt
	c.mu.Unlock()
	return found.slots, nil
}

// report logs the deferred client's outcome when it changes: once when the mode is
// known, once per distinct problem.
func (c *checker) report(found answer, err error) {
	var outcome string
	var setup *setupError
	switch {
	case errors.As(err, &setup):
		outcome = "setup: " + err.Error()
	case err != nil:
		outcome = "unreachable"
	case found.cluster:
		outcome = "cluster"
	default:
		outcome = "standalone at " + found.addr
	}
	c.mu.Lock()
	changed := outcome != c.last
	c.last = outcome
	c.mu.Unlock()
	if !changed || c.logger == nil {
		return
	}
	switch {
	case setup != nil:
		c.logger.Error("redis answered, and cannot be used as configured: every Redis call fails until the configuration is fixed", "err", err)
	case err != nil:
		c.logger.Warn("redis does not answer; its mode is checked when it does", "err", err)
	case found.cluster:
		c.logger.Info("redis answered: it is a cluster", "answered", found.addr)
	default:
		c.logger.Info("redis answered: it is a standalone server", "answered", found.addr)
	}
}
