package api

import (
	"context"
	"net/http"
	"net/netip"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/flags"
)

// HeaderClientID is the header a trusted gateway sets to the caller's client id.
const HeaderClientID = "X-Client-ID"

type limitsKey struct{}

// limitsFrom returns the limits resolved for the request by identify.
func limitsFrom(ctx context.Context) flags.Limits {
	l, _ := ctx.Value(limitsKey{}).(flags.Limits)
	if l.Client == "" {
		l.Client = space.Unknown
	}
	return l
}

// requestInfo is filled in as a request goes through the middleware, for the request
// log written after it (whose context is the outer one).
type requestInfo struct {
	client space.ClientKey
}

type requestInfoKey struct{}

func withRequestInfo(ctx context.Context) (context.Context, *requestInfo) {
	info := &requestInfo{}
	return context.WithValue(ctx, requestInfoKey{}, info), info
}

func setRequestClient(ctx context.Context, key space.ClientKey) {
	if info, ok := ctx.Value(requestInfoKey{}).(*requestInfo); ok {
		info.client = key
	}
}

// Authenticator establishes who a request is from (DESIGN.md §2 step 1). It returns
// the raw client id the caller has proven, "" for none, or an EUNAUTHORIZED error. The
// id is not yet bounded: identify maps it through the allowlist.
type Authenticator interface {
	Authenticate(r *http.Request) (clientID string, err error)
}

// TrustedHeader believes X-Client-ID only from peers inside the trusted proxy CIDRs
// (SPACE_AUTH_MODE=trusted_header): a gateway in front has authenticated the caller and
// set the header. From any other peer the header is ignored (the caller is unknown) and
// counted, since it means someone bypassed the gateway or forgot the CIDR.
type TrustedHeader struct {
	Trusted []netip.Prefix
	// Untrusted counts requests that sent the header from an untrusted peer; may be nil.
	Untrusted prometheus.Counter
}

// Authenticate implements Authenticator.
func (h *TrustedHeader) Authenticate(r *http.Request) (string, error) {
	id := r.Header.Get(HeaderClientID)
	if id == "" {
		return "", nil
	}
	if h.trusted(r.RemoteAddr) {
		return id, nil
	}
	if h.Untrusted != nil {
		h.Untrusted.Inc()
	}
	return "", nil
}

func (h *TrustedHeader) trusted(remoteAddr string) bool {
	addr := peerAddr(remoteAddr)
	return addr.IsValid() && inPrefixes(addr, h.Trusted)
}

// identify resolves the caller's bounded client key and every limit on it, once per
// request, through the same resolver that enforcement uses.
func (s *Server) identify(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := s.auth.Authenticate(r)
		if err != nil {
			writeError(w, r, s.logger, err)
			return
		}
		limits := s.resolver.Resolve(r.Context(), id)
		ctx := space.NewContextWithClient(r.Context(), limits.Client)
		ctx = context.WithValue(ctx, limitsKey{}, limits)
		setRequestClient(ctx, limits.Client)
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// limitConcurrency caps the client's in-flight requests cluster-wide (DESIGN.md §2
// step 2): over the cap is a 429 client_concurrency.
func (s *Server) limitConcurrency(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		limits := limitsFrom(r.Context())
		release, err := s.concurrency.Acquire(r.Context(), limits.Client, limits.Concurrency)
		if err != nil {
			writeError(w, r, s.logger, err)
			return
		}
		defer release()
		next.ServeHTTP(w, r)
	})
}
