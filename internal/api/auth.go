package api

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/admission"
	"github.com/space-sandbox/space/internal/apikey"
)

// KeyLookup finds the live key behind a bearer secret (internal/apikey.Store).
type KeyLookup interface {
	Lookup(ctx context.Context, secret string) (apikey.Key, error)
}

// APIKey authenticates `Authorization: Bearer <key>` (SPACE_AUTH_MODE=api_key): the
// caller is the client its key was issued for, whatever X-Client-ID says. A missing,
// malformed, unknown or revoked key is a 401.
//
// Failed attempts are rate limited per source address (Failures), checked before the
// key is looked up, so that guessing keys is slow and costs no database work once an
// address is over its budget. An IPv6 source is limited by its /64, which one host
// usually holds whole. One bucket per address, expiring once full again, keeps the
// Redis keys bounded by the number of addresses failing right now.
type APIKey struct {
	Keys KeyLookup
	// Failures limits failed attempts per source address; nil limits nothing. A Redis
	// failure lets the attempt through (fail open): authentication still holds.
	Failures *admission.Limiter
	// TrustedProxies are the peers whose X-Forwarded-For names the real source.
	TrustedProxies []netip.Prefix
	// Rejected counts refused attempts by reason; may be nil.
	Rejected *prometheus.CounterVec
}

// Authenticate implements Authenticator.
func (a *APIKey) Authenticate(r *http.Request) (space.ClientID, error) {
	source := sourceKey(r, a.TrustedProxies)
	if a.Failures != nil {
		ok, state, err := a.Failures.Peek(r.Context(), source)
		if err == nil && !ok {
			a.count("throttled")
			return "", &space.LimitError{Bucket: space.BucketAuthFailures, Client: space.Unknown, RetryAfter: state.Refill, Limit: &state.Rate}
		}
	}
	secret, err := ParseBearer(r.Header.Get("Authorization"))
	if err == nil {
		var key apikey.Key
		key, err = a.Keys.Lookup(r.Context(), secret)
		if err == nil {
			if cerr := space.CheckClientID(key.Client); cerr != nil {
				// A key issued before client ids had a format: it cannot own anything.
				return "", space.Errorf(space.EUNAUTHORIZED, "this API key's client id %q is not a valid client id (%s); issue a new key", truncateID(key.Client), space.ClientIDRule)
			}
			return space.ClientID(key.Client), nil
		}
	}
	if space.ErrorCode(err) == space.EUNAVAILABLE {
		return "", err
	}
	reason := "invalid"
	if errors.Is(err, errNoCredentials) {
		reason = "missing"
	}
	if a.Failures != nil {
		// Spend one of the address's tries. The Peek above only spares the database
		// the work for an address already over its budget; this take is what bounds
		// failures exactly, however many requests race past the Peek.
		if ok, state, err := a.Failures.Allow(r.Context(), source); err == nil && !ok {
			a.count("throttled")
			return "", &space.LimitError{Bucket: space.BucketAuthFailures, Client: space.Unknown, RetryAfter: state.Refill, Limit: &state.Rate}
		}
	}
	a.count(reason)
	if reason == "missing" {
		return "", space.Errorf(space.EUNAUTHORIZED, "an API key is required: send Authorization: Bearer <key>")
	}
	return "", space.Errorf(space.EUNAUTHORIZED, "the API key is invalid or revoked")
}

func truncateID(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

func (a *APIKey) count(reason string) {
	if a.Rejected != nil {
		a.Rejected.WithLabelValues(reason).Inc()
	}
}

var errNoCredentials = errors.New("no credentials")

// ParseBearer returns the token of an RFC 6750 `Authorization: Bearer <token>` header:
// the scheme case-insensitive, one or more spaces, a token of token68 characters.
func ParseBearer(header string) (string, error) {
	if header == "" {
		return "", errNoCredentials
	}
	scheme, token, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", errors.New("not a bearer credential")
	}
	token = strings.TrimLeft(token, " ")
	if token == "" || len(token) > 512 {
		return "", errors.New("bad bearer token")
	}
	for i := 0; i < len(token); i++ {
		c := token[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '-' || c == '.' || c == '_' || c == '~' || c == '+' || c == '/' || c == '=') {
			return "", errors.New("bad bearer token")
		}
	}
	return token, nil
}

// sourceKey names the address a request comes from for the failed-auth limiter: the
// peer, or, when the peer is a trusted proxy, the nearest untrusted address it
// forwarded for. IPv6 addresses are cut to their /64.
func sourceKey(r *http.Request, trusted []netip.Prefix) string {
	addr := peerAddr(r.RemoteAddr)
	if addr.IsValid() && inPrefixes(addr, trusted) {
		hops := strings.Split(r.Header.Get("X-Forwarded-For"), ",")
		for i := len(hops) - 1; i >= 0; i-- {
			hop, err := netip.ParseAddr(strings.TrimSpace(hops[i]))
			if err != nil {
				break
			}
			addr = hop.Unmap()
			if !inPrefixes(addr, trusted) {
				break
			}
		}
	}
	if !addr.IsValid() {
		return "invalid"
	}
	if addr.Is6() {
		p, _ := addr.Prefix(64)
		return p.String()
	}
	return addr.String()
}

func peerAddr(remoteAddr string) netip.Addr {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}
	}
	return addr.Unmap()
}

func inPrefixes(addr netip.Addr, prefixes []netip.Prefix) bool {
	for _, p := range prefixes {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}
