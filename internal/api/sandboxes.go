package api

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/go-chi/chi/v5"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/dispatcher"
	"github.com/space-sandbox/space/internal/idempotency"
	"github.com/space-sandbox/space/internal/sandbox"
)

// createBody is POST /v1/sandboxes.
type createBody struct {
	Template  string   `json:"template"`
	CPUMillis int      `json:"cpu_millis"`
	MemoryMiB int      `json:"memory_mib"`
	DiskGiB   int      `json:"disk_gib"`
	Metadata  metadata `json:"metadata,omitempty"`
}

// metadata is a create's metadata as it is decoded: an object of strings, where a
// null (for the object or for a value) is refused naming it, rather than read as no
// metadata or as "".
type metadata map[string]string

func (m *metadata) UnmarshalJSON(b []byte) error {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil || raw == nil {
		return space.FieldError(space.EINVALID, "metadata", "must be an object of strings")
	}
	out := make(metadata, len(raw))
	for k, v := range raw {
		var s *string
		if err := json.Unmarshal(v, &s); err != nil || s == nil {
			field := "metadata." + k
			if len(k) > 64 {
				field = "metadata"
			}
			return space.FieldError(space.EINVALID, field, "must be a string")
		}
		out[k] = *s
	}
	*m = out
	return nil
}

func (b createBody) request() sandbox.CreateRequest {
	return sandbox.CreateRequest{
		Shape:    space.Shape{Template: b.Template, CPUMillis: b.CPUMillis, MemoryMiB: b.MemoryMiB, DiskGiB: b.DiskGiB},
		Metadata: b.Metadata,
	}
}

// createSandbox is POST /v1/sandboxes. A valid create whose refusal is already known
// (a client over its rate, the cluster bucket empty: Service.Refused) is answered at
// once, before it takes a concurrency place: a flooding client costs no Redis call, no
// Postgres and no lease. Every other create takes its place first, as the design
// orders it (a bad body from a client over its concurrency cap is a 429 before a 400),
// then runs the flow. A create under an Idempotency-Key is not refused early: it may
// be the repeat of one that succeeded, whose answer is its sandbox (Service.Create
// looks the key up, then refuses).
func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request) {
	caller := callerFrom(r.Context())
	var body createBody
	err := decodeJSON(r, &body)
	req := body.request()
	if err == nil {
		// Validate before anything else: a bad body touches no limit.
		err = sandbox.ValidateCreate(req.Shape, req.Metadata)
	}
	if err == nil && !prefersAsync(r.Header) && len(r.Header.Values(idempotency.Header)) == 0 {
		if le := s.sandboxes.Refused(caller, req.Shape); le != nil {
			s.writeError(w, r, le)
			return
		}
	}
	release, lerr := s.concurrency.Acquire(r.Context(), caller.Key, caller.Concurrency)
	if lerr != nil {
		s.writeError(w, r, lerr)
		return
	}
	defer release()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if s.respondAsync(w, r, dispatcher.Request{Kind: space.OperationCreate, Client: caller.ID, Create: req}, operationsPath) {
		return
	}
	// respondAsync checked the key.
	req.IdempotencyKey, _ = idempotency.Parse(r.Header.Values(idempotency.Header))
	sb, err := s.sandboxes.Create(r.Context(), caller, req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.Header().Set("Location", "/v1/sandboxes/"+sb.ID)
	writeJSON(w, http.StatusCreated, sb)
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request) {
	sb, err := s.sandboxes.Get(r.Context(), callerFrom(r.Context()).ID, chi.URLParam(r, "id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, sb)
}

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit := 0
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			s.writeError(w, r, space.FieldError(space.EINVALID, "limit", "must be an integer"))
			return
		}
		if n == 0 {
			n = -1 // an explicit 0 is out of range, not "the default"
		}
		limit = n
	}
	page, err := s.sandboxes.List(r.Context(), callerFrom(r.Context()).ID, limit, q.Get("page_token"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, page)
}

func (s *Server) pauseSandbox(w http.ResponseWriter, r *http.Request) {
	sb, err := s.sandboxes.Pause(r.Context(), callerFrom(r.Context()).ID, chi.URLParam(r, "id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, sb)
}

func (s *Server) restoreSandbox(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	if err := sandbox.CheckID(id); err != nil {
		s.writeError(w, r, err)
		return
	}
	caller := callerFrom(r.Context())
	if s.respondAsync(w, r, dispatcher.Request{Kind: space.OperationRestore, Client: caller.ID, SandboxID: id}, operationsPath) {
		return
	}
	sb, err := s.sandboxes.Restore(r.Context(), caller, id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, sb)
}

// deleteSandbox terminates the caller's sandbox: 204, or 202 when it was still
// starting, restoring or pausing (it is terminated, and what the substrate was making
// for it is being stopped).
func (s *Server) deleteSandbox(w http.ResponseWriter, r *http.Request) {
	teardown, err := s.sandboxes.Delete(r.Context(), callerFrom(r.Context()).ID, chi.URLParam(r, "id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if teardown {
		w.WriteHeader(http.StatusAccepted)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// wakeSandbox is the implicit wake from ingress or the data plane (internal listener
// only): a restore charged to the sandbox's owner, never to unknown.
func (s *Server) wakeSandbox(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	owner, err := s.sandboxes.Owner(r.Context(), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	caller := s.resolver.Resolve(r.Context(), owner)
	setRequestCaller(r.Context(), caller)
	ctx := space.NewContext(r.Context(), caller)
	if s.respondAsync(w, r.WithContext(ctx), dispatcher.Request{Kind: space.OperationWake, Client: owner, SandboxID: id}, internalOperationsPath) {
		return
	}
	sb, err := s.sandboxes.Wake(ctx, caller, id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, sb)
}
