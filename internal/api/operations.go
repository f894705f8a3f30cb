package api

import (
	"net/http"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/dispatcher"
	"github.com/space-sandbox/space/internal/idempotency"
)

// Paths of an operation, for the Location of a 202: clients poll the public one; a
// wake is asked for on the internal listener, so its caller polls there.
const (
	operationsPath         = "/v1/operations/"
	internalOperationsPath = "/internal/v1/operations/"
)

// prefersAsync reports whether the request asks for Prefer: respond-async (RFC 7240):
// the preference may come among others, with parameters, in any case, in one Prefer
// field or several.
func prefersAsync(h http.Header) bool {
	for _, field := range h.Values("Prefer") {
		for _, pref := range strings.Split(field, ",") {
			name, _, _ := strings.Cut(pref, ";")
			name, _, _ = strings.Cut(name, "=")
			if strings.EqualFold(strings.TrimSpace(name), "respond-async") {
				return true
			}
		}
	}
	return false
}

// respondAsync queues req and answers 202 with its operation, a Location to poll and
// Preference-Applied, when the request prefers respond-async; it then returns true,
// having answered. For a synchronous request it writes nothing and returns false,
// except for a bad Idempotency-Key, and for a key on a synchronous restore or wake,
// which is refused (400): only creates and queued operations honour one, and ignoring
// it would let a client's retry run twice while it believes it cannot.
//
// A repeated Idempotency-Key answers 202 with the first request's operation as it is
// now; the same key with a different request is 422 (dispatcher.Enqueue).
func (s *Server) respondAsync(w http.ResponseWriter, r *http.Request, req dispatcher.Request, location string) bool {
	key, err := idempotency.Parse(r.Header.Values(idempotency.Header))
	if err != nil {
		s.writeError(w, r, err)
		return true
	}
	if !prefersAsync(r.Header) {
		if key != "" && req.Kind != space.OperationCreate {
			s.writeError(w, r, space.FieldError(space.EINVALID, idempotency.Header,
				"is honoured on a %s only with Prefer: respond-async; send both, or neither", req.Kind))
			return true
		}
		return false // RFC 7240: a server may serve a preference synchronously
	}
	req.IdempotencyKey = key
	op, _, err := s.operations.Enqueue(r.Context(), req)
	if err != nil {
		s.writeError(w, r, err)
		return true
	}
	w.Header().Set("Location", location+op.ID)
	w.Header().Set("Preference-Applied", "respond-async")
	writeJSON(w, http.StatusAccepted, op)
	return true
}

// getOperation is GET /v1/operations/{id}: the caller's own operations only; another
// client's is 404, as for sandboxes.
func (s *Server) getOperation(w http.ResponseWriter, r *http.Request) {
	op, err := s.operations.Get(r.Context(), callerFrom(r.Context()).ID, chi.URLParam(r, "id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, op)
}

// getOperationInternal is GET /internal/v1/operations/{id} (internal listener): any
// client's operation, for the ingress that queued a wake on a sandbox owner's behalf.
func (s *Server) getOperationInternal(w http.ResponseWriter, r *http.Request) {
	op, err := s.operations.GetAny(r.Context(), chi.URLParam(r, "id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, op)
}
