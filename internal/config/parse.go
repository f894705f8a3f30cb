package config

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"path"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// The parsers of vars.go. Each returns the value of a variable, or an error whose text
// says what the variable accepts; Load adds the name and the value. into binds one to
// the field it fills.

// into binds parse to *dst: a value that parses is stored there, one that does not
// leaves *dst as it was.
func into[T any](dst *T, parse func(string) (T, error)) func(string) error {
	return func(s string) error {
		v, err := parse(s)
		if err == nil {
			*dst = v
		}
		return err
	}
}

// text is any value.
func text(s string) (string, error) { return s, nil }

// checked is text that check accepts.
func checked(check func(string) error) func(string) (string, error) {
	return func(s string) (string, error) { return s, check(s) }
}

// oneOf is one of allowed.
func oneOf[T ~string](allowed ...T) func(string) (T, error) {
	return func(s string) (T, error) {
		names := make([]string, len(allowed))
		for i, a := range allowed {
			if s == string(a) {
				return a, nil
			}
			names[i] = string(a)
		}
		return "", errors.New("one of " + strings.Join(names, ", "))
	}
}

func boolean(s string) (bool, error) {
	b, err := strconv.ParseBool(s)
	if err != nil {
		return false, errors.New("true or false")
	}
	return b, nil
}

// duration is a positive Go duration.
func duration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, errors.New("a positive Go duration such as 100ms, 2s or 10m")
	}
	return d, nil
}

// durationOrOff is a Go duration where 0 is a value of its own: off.
func durationOrOff(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, errors.New("a Go duration >= 0 such as 500ms or 1s (0 turns it off)")
	}
	return d, nil
}

// refusalPace is a Go duration from 0 (off) to 1s: a held refusal keeps a goroutine
// and a connection, and its caller is told to retry after a second or more anyway.
func refusalPace(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 || d > time.Second {
		return 0, errors.New("a Go duration from 0 to 1s such as 10ms (0 answers at once)")
	}
	return d, nil
}

// refill is a bucket's refill rate: a finite number of tokens per second >= 0.
func refill(s string) (float64, error) {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f < 0 || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, errors.New("a number of tokens per second >= 0, such as 0.5 or 100")
	}
	return f, nil
}

// tokens is a bucket's burst: an integer number of tokens >= 1.
func tokens(s string) (int64, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 1 {
		return 0, errors.New("an integer number of tokens >= 1")
	}
	return n, nil
}

// atLeast is an integer >= min.
func atLeast[T ~int | ~int64](min T) func(string) (T, error) {
	return func(s string) (T, error) {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || T(n) < min || int64(T(n)) != n {
			return 0, fmt.Errorf("an integer >= %d", min)
		}
		return T(n), nil
	}
}

// share is a fraction of a whole, from 0 to under 1.
func share(s string) (float64, error) {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || !(f >= 0 && f < 1) {
		return 0, errors.New("a fraction from 0 to under 1, such as 0.2")
	}
	return f, nil
}

// perSecond is a request rate > 0, for a client's rate limit.
func perSecond(s string) (float32, error) {
	f, err := strconv.ParseFloat(s, 32)
	if err != nil || f <= 0 || math.IsInf(f, 0) || math.IsNaN(f) {
		return 0, errors.New("a number of requests per second > 0, such as 50")
	}
	return float32(f), nil
}

func listenAddr(s string) error {
	if _, _, err := net.SplitHostPort(s); err != nil {
		return errors.New("a listen address such as :8080 or 127.0.0.1:8080")
	}
	return nil
}

func postgresURL(s string) error {
	if !strings.HasPrefix(s, "postgres://") && !strings.HasPrefix(s, "postgresql://") {
		return errors.New("a postgres:// URL")
	}
	return nil
}

// hostPort is one Redis address.
func hostPort(s string) error {
	host, port, err := net.SplitHostPort(s)
	if err != nil || host == "" || port == "" {
		return errors.New("host:port, or several comma separated for a Redis Cluster")
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return errors.New("host:port with a numeric port")
	}
	return nil
}

// hostPorts is a comma-separated list of Redis addresses; empty items are skipped.
func hostPorts(s string) ([]string, error) {
	var out []string
	for _, a := range strings.Split(s, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		if err := hostPort(a); err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, nil
}

// cidrs is a comma-separated list of CIDRs, where a bare address is a /32 (or /128).
func cidrs(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		p, err := netip.ParsePrefix(item)
		if err != nil {
			a, aerr := netip.ParseAddr(item)
			if aerr != nil {
				return nil, errors.New("comma-separated CIDRs such as 10.0.0.0/8,192.168.1.7/32")
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// keyPrefix is a Redis key prefix. No braces: the cluster key is the client keys'
// Redis Cluster hash tag.
func keyPrefix(s string) error {
	if strings.ContainsAny(s, "{} ") {
		return errors.New("a key prefix without braces or spaces, such as space-staging")
	}
	return nil
}

// dnsLabel is the syntax of a namespace name (RFC 1123 label).
var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

func namespace(s string) error {
	if len(s) > 63 || !dnsLabel.MatchString(s) {
		return errors.New("a namespace name (lowercase letters, digits and '-')")
	}
	return nil
}

// dnsSubdomain is the syntax of most Kubernetes object names (RFC 1123 subdomain).
var dnsSubdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

// objectName is the name of a Kubernetes object: a StorageClass, a PriorityClass.
func objectName(s string) error {
	if len(s) > 253 || !dnsSubdomain.MatchString(s) {
		return errors.New("an object name (lowercase letters, digits, '-' and '.')")
	}
	return nil
}

// mountPath is an absolute directory in a container, other than the root.
func mountPath(s string) error {
	if !path.IsAbs(s) || path.Clean(s) != s || s == "/" || strings.Contains(s, ":") {
		return errors.New("an absolute directory path other than /, such as /workspace")
	}
	return nil
}
