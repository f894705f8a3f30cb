package api

import (
	"context"
	"net/http"
	"net/netip"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/space-sandbox/space"
)

// HeaderClientID is the header a trusted gateway sets to the caller's client id.
const HeaderClientID = "X-Client-ID"

// headerClientIDKey is HeaderClientID in its canonical form, which a Header map is
// indexed by: looked up directly, it is not canonicalised (an allocation) per request.
const headerClientIDKey = "X-Client-Id"

// callerFrom returns the caller that identify resolved for the request. Every /v1
// route runs behind identify, and the internal wake sets its owner's, so the zero
// Caller it returns otherwise owns nothing and is capped as space.Unknown.
func callerFrom(ctx context.Context) space.Caller {
	if st := stateFrom(ctx); st != nil && st.identified {
		return st.caller
	}
	c, ok := space.CallerFromContext(ctx)
	if !ok {
		c.Key = space.Unknown
	}
	return c
}

// setRequestCaller records the request's caller in its state, for the handlers and
// the request log, and reports whether the request has a state to hold it.
func setRequestCaller(ctx context.Context, c space.Caller) bool {
	st := stateFrom(ctx)
	if st == nil {
		return false
	}
	st.caller, st.identified = c, true
	return true
}

// Authenticator establishes who a request is from, the first step of every request: the client id
// the caller has proven, or an error. No credential, or one that does not hold, is an
// EUNAUTHORIZED error (401); a credential that is malformed in a way the caller can fix
// is an EINVALID error naming the header (400). There is no anonymous caller: every
// sandbox, operation and idempotency key has an authenticated owner.
type Authenticator interface {
	Authenticate(r *http.Request) (space.ClientID, error)
}

// TrustedHeader believes X-Client-ID only from peers inside the trusted proxy CIDRs
// (SPACE_AUTH_MODE=trusted_header): a gateway in front has authenticated the caller and
// set the header. A request from any other peer is a 401 whatever it sends, and is
// counted: it means someone bypassed the gateway or the CIDRs are wrong.
//
// The header must be sent once and hold one client id. Several X-Client-ID fields, or
// one holding a comma-separated list, are refused (400) rather than read: a proxy that
// appends its value to the caller's instead of replacing it must not let the caller's
// own value win.
type TrustedHeader struct {
	Trusted []netip.Prefix
	// Untrusted counts requests refused because their peer is outside Trusted; may be
	// nil.
	Untrusted prometheus.Counter
}

// Authenticate implements Authenticator.
func (h *TrustedHeader) Authenticate(r *http.Request) (space.ClientID, error) {
	if addr := peerAddr(r.RemoteAddr); !addr.IsValid() || !inPrefixes(addr, h.Trusted) {
		if h.Untrusted != nil {
			h.Untrusted.Inc()
		}
		return "", space.Errorf(space.EUNAUTHORIZED, "this request did not come through the authenticating gateway; %s is only believed from it", HeaderClientID)
	}
	values := r.Header[headerClientIDKey]
	switch {
	case len(values) == 0 || len(values) == 1 && values[0] == "":
		return "", space.Errorf(space.EUNAUTHORIZED, "the gateway sent no %s: the caller is not authenticated", HeaderClientID)
	case len(values) > 1:
		return "", space.FieldError(space.EINVALID, HeaderClientID, "must be sent once; got %d fields", len(values))
	case strings.Contains(values[0], ","):
		return "", space.FieldError(space.EINVALID, HeaderClientID, "must hold one client id, not a list")
	}
	if err := space.CheckClientID(values[0]); err != nil {
		return "", space.FieldError(space.EINVALID, HeaderClientID, "is not a client id (%s): %v", space.ClientIDRule, err)
	}
	return space.ClientID(values[0]), nil
}

// identify authenticates the caller and resolves its budget key and every limit on it,
// once per request, through the same resolver that enforcement uses; the result is
// the request's space.Caller.
func (s *Server) identify(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := s.auth.Authenticate(r)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		caller := s.callers.Resolve(r.Context(), id)
		if !setRequestCaller(r.Context(), caller) {
			r = r.WithContext(space.NewContext(r.Context(), caller))
		}
		next.ServeHTTP(w, r)
	})
}

// limitConcurrency caps the caller's budget key's in-flight requests cluster-wide
// (the concurrency cap of docs/design.md, "The create path"): over the cap is a 429
// client_concurrency. The place is given back as keptUntilAnswered says.
func (s *Server) limitConcurrency(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		caller := callerFrom(r.Context())
		// A restore, a pause, a read: work another key's refusals yield to, as a
		// create past its refusal is (refusalPace).
		defer s.pace.end(s.pace.begin(caller.Key))
		lease, err := s.concurrency.Acquire(r.Context(), caller.Key, caller.Concurrency)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		w, done := keptUntilAnswered(w, r, lease)
		defer done()
		next.ServeHTTP(w, r)
	})
}
