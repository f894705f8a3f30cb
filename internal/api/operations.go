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

// queueing reads what a request of kind says of being queued: whether it prefers
// respond-async, and its Idempotency-Key. A malformed key is a 400, and so is a key on
// a synchronous restore or wake: only creates and queued operations honour one, and
// ignoring it would let a client's retry run twice while it believes it cannot.
func queueing(r *http.Request, kind space.OperationKind) (async bool, key string, err error) {
	key, err = idempotency.Parse(r.Header.Values(idempotency.Header))
	if err != nil {
		return false, "", err
	}
	async = prefersAsync(r.Header)
	if !async && key != "" && kind != space.OperationCreate {
		return false, "", space.FieldError(space.EINVALID, idempotency.Header,
			"is honoured on a %s only with Prefer: respond-async; send both, or neither", kind)
	}
	return async, key, nil
}

// enqueue queues req and answers 202 with its operation, a Location to poll and
// Preference-Applied. A repeated Idempotency-Key answers 202 with the first request's
// operation as it is now; the same key with a different request is 422
// (dispatcher.Enqueue).
func (s *Server) enqueue(w http.ResponseWriter, r *http.Request, req dispatcher.Request, location string) {
	op, _, err := s.operations.Enqueue(r.Context(), req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.Header().Set("Location", location+op.ID)
	w.Header().Set("Preference-Applied", "respond-async")
	writeJSON(w, http.StatusAccepted, op)
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
