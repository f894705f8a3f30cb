package config

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// Redis locates the Redis that holds the buckets and leases, and says how to log in to
// it.
//
// It comes either from SPACE_REDIS_ADDRS or from SPACE_REDIS_URL (one of the two, never
// both); SPACE_REDIS_USERNAME, SPACE_REDIS_PASSWORD(_FILE) and SPACE_REDIS_TLS override
// the URL's parts (TLS only upwards: a rediss:// URL always speaks TLS). Printed with
// fmt or logged with slog, the password shows as [redacted].
type Redis struct {
	// Addrs is one address for a standalone Redis, or for one node of a Redis Cluster
	// (Mode says which); several for a Redis Cluster.
	Addrs []string
	// Mode says whether Addrs are a standalone server or a cluster.
	Mode RedisMode
	// Username is the ACL user; empty: the default user.
	Username string
	// Password is SPACE_REDIS_PASSWORD, the content of SPACE_REDIS_PASSWORD_FILE (read
	// at load, one trailing newline trimmed), or the URL's. Empty: no password.
	Password Secret
	// DB is the database number of SPACE_REDIS_URL's path, 0 without one. A Redis
	// Cluster has database 0 only.
	DB int
	// TLS connects with TLS 1.2 or later.
	TLS bool
	// TLSCAFile is a PEM bundle of the CAs that may sign the server's certificate;
	// TLSRootCAs is that bundle, parsed at load. Unset (nil): the system roots.
	TLSCAFile  string
	TLSRootCAs *x509.CertPool
	// TLSServerName is the name to verify in the server's certificate; empty: the host
	// of the address dialled.
	TLSServerName string
	// Timeout bounds every Redis call on the request path: a slow Redis must not make
	// every create slow.
	Timeout time.Duration
	// PipelineAbove is how many scripts of the concurrency limiter and of the
	// failed-authentication limiter go to Redis each on its own at once before the
	// next wait to go together in one round trip (admission.DefaultPipelineAbove, 8,
	// by default); 0 never pipelines, as the limiters' PipelineAbove of 0, which it
	// is passed as.
	PipelineAbove int
	// BatchAbove is how many admission decisions (the activation charge) go to Redis
	// each on its own at once before the next wait to go together as one batch script
	// call (admission.DefaultBatchAbove, 8, by default); 0 never batches, as
	// admission.Options.BatchAbove of 0, which it is passed as.
	BatchAbove int
	// KeyPrefix namespaces every Redis key ("space" gives exactly the keys of the
	// design): deployments sharing one Redis each set their own. No braces: the
	// cluster key is the client keys' Redis Cluster hash tag.
	KeyPrefix string
	// From names the variable each setting came from, so that a start-up error (refused
	// credentials, a failed TLS handshake) names what to fix. Empty: not set.
	From RedisSources
}

// RedisSources names the variables the Redis settings came from: EnvRedisURL or the
// setting's own variable.
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

// The parsers of the Redis variables, in the order they are declared: the URL first,
// so that the separate variables override its parts.

// parseURL reads SPACE_REDIS_URL: redis://[user:password@]host:port[/db], or rediss://
// for TLS. Errors show the URL with its user and password replaced, or not at all.
func (r *Redis) parseURL(raw string) error {
	const accepts = "redis://[user:password@]host:port[/db], or rediss:// for TLS"
	u, err := url.Parse(raw)
	if err != nil {
		// url.Parse's error quotes the whole URL, password included: not shown.
		return &VarError{Hidden: true, Accepts: accepts}
	}
	shown := redactURL(u)
	refuse := func(more string) error { return &VarError{Value: shown, Accepts: accepts + more} }
	switch {
	case u.Scheme != "redis" && u.Scheme != "rediss":
		return refuse("")
	case u.RawQuery != "" || u.Fragment != "":
		return refuse(", without query options: SPACE_REDIS_TIMEOUT and the SPACE_REDIS_TLS_* variables set those")
	case u.Hostname() == "":
		return refuse(", with a host")
	}
	// The path is the database number: "/2", or nothing for 0.
	db := 0
	switch path := strings.FieldsFunc(u.Path, func(c rune) bool { return c == '/' }); len(path) {
	case 0:
	case 1:
		if db, err = strconv.Atoi(path[0]); err != nil {
			return refuse(fmt.Sprintf(" (invalid database number: %q)", path[0]))
		}
		if db < 0 {
			return refuse(", with a database number >= 0")
		}
	default:
		return refuse(", with one database number for a path")
	}
	port := u.Port()
	if port == "" {
		port = "6379"
	}
	addr := net.JoinHostPort(u.Hostname(), port)
	if hostPort(addr) != nil {
		return refuse(", with a port number up to 65535")
	}

	r.Addrs, r.DB = []string{addr}, db
	r.From.Addrs = EnvRedisURL
	if name := u.User.Username(); name != "" {
		r.Username, r.From.Username = name, EnvRedisURL
	}
	if pw, _ := u.User.Password(); pw != "" {
		r.Password, r.From.Password = Secret(pw), EnvRedisURL
	}
	if u.Scheme == "rediss" {
		r.TLS, r.From.TLS = true, EnvRedisURL
	}
	return nil
}

// redactURL is u for an error message: its user and password, if any, replaced.
func redactURL(u *url.URL) string {
	shown := *u
	if shown.User != nil {
		shown.User = url.User("REDACTED")
	}
	return shown.String()
}

func (r *Redis) parseAddrs(s string) error {
	if r.From.Addrs == EnvRedisURL {
		return &VarError{Var: EnvRedisURL, With: EnvRedisAddrs, Accepts: "one of the two: the URL names one address, the list one or several"}
	}
	addrs, err := hostPorts(s)
	if err != nil {
		return err
	}
	r.Addrs, r.From.Addrs = addrs, EnvRedisAddrs
	return nil
}

func (r *Redis) parseUsername(s string) error {
	r.Username, r.From.Username = s, EnvRedisUsername
	return nil
}

// parsePassword takes the password as it is, spaces included; only an empty one is
// unset. It replaces the URL's.
func (r *Redis) parsePassword(s string) error {
	r.Password, r.From.Password = Secret(s), EnvRedisPassword
	return nil
}

// parsePasswordFile reads the password from a file, which replaces the URL's password.
// No error shows the password.
func (r *Redis) parsePasswordFile(file string) error {
	if r.From.Password == EnvRedisPassword {
		return &VarError{Var: EnvRedisPassword, With: EnvRedisPasswordFile, Accepts: "one of the two (prefer the file: it keeps the password out of the environment)"}
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return errors.New("a readable file holding the Redis password (" + pathErr(err) + ")")
	}
	s := string(b)
	if strings.HasSuffix(s, "\r\n") {
		s = s[:len(s)-2]
	} else {
		s = strings.TrimSuffix(s, "\n")
	}
	if s == "" {
		return errors.New("a file holding the Redis password; this one is empty")
	}
	r.Password, r.From.Password = Secret(s), EnvRedisPasswordFile
	return nil
}

// parseTLS turns TLS on, never off: "false", which the chart renders by default, never
// turns off the TLS a rediss:// URL asks for.
func (r *Redis) parseTLS(s string) error {
	on, err := boolean(s)
	if err == nil && on && !r.TLS {
		r.TLS, r.From.TLS = true, EnvRedisTLS
	}
	return err
}

// tlsOff is the error of a TLS setting while TLS is off.
func tlsOff(what string) error {
	return fmt.Errorf("%s, which is off: set %s=true (or use a rediss:// %s)", what, EnvRedisTLS, EnvRedisURL)
}

func (r *Redis) parseCAFile(file string) error {
	if !r.TLS {
		return tlsOff("a CA bundle for TLS")
	}
	pool, err := readCAFile(file)
	if err != nil {
		return errors.New("a readable PEM file of CA certificates (" + err.Error() + ")")
	}
	r.TLSCAFile, r.TLSRootCAs = file, pool
	return nil
}

func (r *Redis) parseServerName(name string) error {
	if !r.TLS {
		return tlsOff("a name to verify with TLS")
	}
	r.TLSServerName = name
	return nil
}

// check applies the Redis rules that span variables, once all are parsed.
func (r *Redis) check() error {
	if len(r.Addrs) == 0 {
		return &VarError{Var: EnvRedisAddrs, Accepts: "host:port, or several comma separated for a Redis Cluster (or set " + EnvRedisURL + ")"}
	}
	if r.Mode == RedisStandalone && len(r.Addrs) > 1 {
		return &VarError{Var: EnvRedisMode, Value: string(r.Mode), Accepts: fmt.Sprintf("auto or cluster for the %d addresses of %s: a standalone server has one", len(r.Addrs), EnvRedisAddrs)}
	}
	if r.Mode == RedisCluster && r.DB != 0 {
		return &VarError{Var: EnvRedisMode, Value: string(r.Mode), Accepts: fmt.Sprintf("standalone or auto for database %d of %s: a Redis Cluster has database 0 only", r.DB, EnvRedisURL)}
	}
	return nil
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
