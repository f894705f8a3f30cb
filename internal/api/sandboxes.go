package api

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/dispatcher"
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

// decodePlain decodes the body nearly every create sends, and reports whether it did:
// one object of the shape's members, each at most once, the template a string of
// printable ASCII with no escape, the numbers integers of at most 18 digits, no
// metadata. Anything else is left to decodeJSONBody (false), which is strict about it
// all; FuzzCreateBodyPlain holds this to the same result as that. It costs a create a
// tenth of what reflection does, and every create refused from memory reads its body.
func (b *createBody) decodePlain(body []byte) bool {
	var seen [4]bool
	i := skipJSONSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return false
	}
	i = skipJSONSpace(body, i+1)
	if i < len(body) && body[i] == '}' {
		return skipJSONSpace(body, i+1) == len(body)
	}
	for {
		if i >= len(body) || body[i] != '"' {
			return false
		}
		end := i + 1
		for end < len(body) && body[end] != '"' {
			end++
		}
		if end >= len(body) {
			return false
		}
		key := body[i+1 : end]
		i = skipJSONSpace(body, end+1)
		if i >= len(body) || body[i] != ':' {
			return false
		}
		i = skipJSONSpace(body, i+1)
		var field int
		switch string(key) {
		case "template":
			field = 0
		case "cpu_millis":
			field = 1
		case "memory_mib":
			field = 2
		case "disk_gib":
			field = 3
		default:
			return false
		}
		if seen[field] {
			return false
		}
		seen[field] = true
		if field == 0 {
			if i >= len(body) || body[i] != '"' {
				return false
			}
			end := i + 1
			for end < len(body) && body[end] != '"' {
				if c := body[end]; c < 0x20 || c > 0x7e || c == '\\' {
					return false
				}
				end++
			}
			if end >= len(body) {
				return false
			}
			b.Template = string(body[i+1 : end])
			i = end + 1
		} else {
			n, next, ok := plainInt(body, i)
			if !ok {
				return false
			}
			switch field {
			case 1:
				b.CPUMillis = n
			case 2:
				b.MemoryMiB = n
			case 3:
				b.DiskGiB = n
			}
			i = next
		}
		i = skipJSONSpace(body, i)
		if i >= len(body) {
			return false
		}
		switch body[i] {
		case ',':
			i = skipJSONSpace(body, i+1)
		case '}':
			return skipJSONSpace(body, i+1) == len(body)
		default:
			return false
		}
	}
}

// plainInt reads the JSON integer at body[i:] of at most 18 digits (which an int holds
// whatever their value): an optional minus, then 0 or digits not starting with 0, and
// no fraction or exponent. It returns the value, where it ends, and whether it was one.
func plainInt(body []byte, i int) (int, int, bool) {
	neg := i < len(body) && body[i] == '-'
	if neg {
		i++
	}
	start := i
	n := 0
	for i < len(body) && body[i] >= '0' && body[i] <= '9' {
		n = n*10 + int(body[i]-'0')
		i++
	}
	digits := i - start
	if digits == 0 || digits > 18 || (digits > 1 && body[start] == '0') {
		return 0, 0, false
	}
	if i < len(body) && (body[i] == '.' || body[i] == 'e' || body[i] == 'E') {
		return 0, 0, false
	}
	if neg {
		n = -n
	}
	return n, i, true
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

// createRequest reads a create: its body, its Idempotency-Key and whether it prefers
// to be queued. An error is a 400 naming what is malformed.
func createRequest(r *http.Request) (sandbox.CreateRequest, error) {
	raw, buf, err := readJSON(r)
	if err != nil {
		return sandbox.CreateRequest{}, err
	}
	defer giveBody(buf)
	var body createBody // on the stack: only the plain decoding fills it in place
	if !body.decodePlain(raw) {
		// A body decodePlain does not take goes through encoding/json, into a value of
		// its own: given to json as an interface, body itself would be moved to the
		// heap for every create, the plain ones too.
		decoded := new(createBody)
		if err := decodeJSONBody(raw, decoded); err != nil {
			return sandbox.CreateRequest{}, err
		}
		body = *decoded
	}
	async, key, err := queueing(r, space.OperationCreate)
	return sandbox.CreateRequest{
		Shape:          space.Shape{Template: body.Template, CPUMillis: body.CPUMillis, MemoryMiB: body.MemoryMiB, DiskGiB: body.DiskGiB},
		Metadata:       body.Metadata,
		IdempotencyKey: key,
		Async:          async,
	}, err
}

// createSandbox is POST /v1/sandboxes: made (201) by sandbox.Service.Create, which
// runs the whole create order and takes the concurrency place from s.places, or
// queued (Prefer: respond-async, 202).
//
// A create that can never pass (422) or whose refusal is already known (429) is
// answered before it takes a concurrency place: a client flooding over its rate costs
// no lease, no Postgres and no Redis call. Every other create takes its place first,
// in the order the limits apply, so that a malformed body from a client over its
// concurrency cap is told the cap.
func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request) {
	caller := callerFrom(r.Context())
	req, err := createRequest(r)
	if err != nil {
		// A body that is not a create at all: told after the place, as a create
		// whose fields are invalid is (sandbox.Service.Create).
		lease, lerr := s.places.Acquire(r.Context(), caller.Key, caller.Concurrency)
		if lerr != nil {
			err = lerr
		}
		w, done := keptUntilAnswered(w, r, lease)
		defer done()
		s.writeError(w, r, err)
		return
	}
	if req.Async {
		s.queueCreate(w, r, caller, req)
		return
	}
	sb, lease, err := s.sandboxes.Create(seatGoesOnIdle(r.Context()), caller, req, s.places)
	if le, ok := errors.AsType[*space.LimitError](err); ok && le.FromMemory {
		// Refused from memory: yields to another key's request at work here, holding
		// no seat of the gate meanwhile (a paced refusal is a parked goroutine, no
		// work: the seat goes to the next request in turn).
		giveSeatBack(r.Context())
		s.pace.delay(r.Context(), caller.Key)
	}
	w, done := keptUntilAnswered(w, r, lease)
	defer done()
	s.writeCreated(w, r, sb, err)
}

// queueCreate plans a create to be queued and queues it, holding its caller's
// concurrency place while it does, as any request in flight does. A queued create is
// not refused from memory: it waits in the queue for its bucket.
func (s *Server) queueCreate(w http.ResponseWriter, r *http.Request, caller space.Caller, req sandbox.CreateRequest) {
	plan, err := s.sandboxes.Plan(caller, req)
	if err != nil && space.ErrorCode(err) != space.EINVALID {
		s.writeError(w, r, err)
		return
	}
	lease, lerr := s.places.Acquire(r.Context(), caller.Key, caller.Concurrency)
	if lerr != nil {
		s.writeError(w, r, lerr)
		return
	}
	w, done := keptUntilAnswered(w, r, lease)
	defer done()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.enqueue(w, r, dispatcher.Request{Kind: space.OperationCreate, Client: caller.ID, Create: &plan, IdempotencyKey: req.IdempotencyKey}, operationsPath)
}

// writeCreated answers a synchronous create: 201 with the sandbox and its Location,
// or the error.
func (s *Server) writeCreated(w http.ResponseWriter, r *http.Request, sb *space.Sandbox, err error) {
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
	sb, err := s.sandboxes.Pause(r.Context(), callerFrom(r.Context()), chi.URLParam(r, "id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, sb)
}

// KeepaliveRequest is POST /v1/sandboxes/{id}/keepalive's optional body: no idle action
// before TimeoutSeconds from now (within the sandbox's max lifetime).
type KeepaliveRequest struct {
	TimeoutSeconds *int64 `json:"timeout_seconds"`
}

// maxKeepaliveSeconds bounds timeout_seconds: ten years, far past any max lifetime, and
// far below what a Duration holds.
const maxKeepaliveSeconds = 10 * 365 * 24 * 3600

// keepaliveSandbox records that the caller's running sandbox is in use (a gateway in
// front of it says so): its idle action is put off, and the sandbox answered.
func (s *Server) keepaliveSandbox(w http.ResponseWriter, r *http.Request) {
	s.keepalive(w, r, callerFrom(r.Context()))
}

// keepaliveSandboxInternal is the keepalive of a gateway in front of the sandbox
// (internal listener only), under the sandbox owner's lifecycle.
func (s *Server) keepaliveSandboxInternal(w http.ResponseWriter, r *http.Request) {
	owner, err := s.sandboxes.Owner(r.Context(), chi.URLParam(r, "id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	caller := s.callers.Resolve(r.Context(), owner)
	setRequestCaller(r.Context(), caller)
	s.keepalive(w, r, caller)
}

// keepalive puts off caller's sandbox's idle action, as the body asks.
func (s *Server) keepalive(w http.ResponseWriter, r *http.Request, caller space.Caller) {
	var req KeepaliveRequest
	if r.ContentLength != 0 {
		if err := decodeJSON(r, &req); err != nil {
			s.writeError(w, r, err)
			return
		}
	}
	var timeout time.Duration
	if n := req.TimeoutSeconds; n != nil {
		if *n < 1 || *n > maxKeepaliveSeconds {
			s.writeError(w, r, space.FieldError(space.EINVALID, "timeout_seconds", "must be a whole number of seconds from 1 to %d", maxKeepaliveSeconds))
			return
		}
		timeout = time.Duration(*n) * time.Second
	}
	sb, err := s.sandboxes.Keepalive(r.Context(), caller, chi.URLParam(r, "id"), timeout)
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
	async, key, err := queueing(r, space.OperationRestore)
	switch {
	case err != nil:
		s.writeError(w, r, err)
		return
	case async:
		s.enqueue(w, r, dispatcher.Request{Kind: space.OperationRestore, Client: caller.ID, SandboxID: id, IdempotencyKey: key}, operationsPath)
		return
	}
	sb, err := s.sandboxes.Restore(seatGoesOnIdle(r.Context()), caller, id)
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
	caller := s.callers.Resolve(r.Context(), owner)
	setRequestCaller(r.Context(), caller)
	ctx := space.NewContext(r.Context(), caller)
	async, key, err := queueing(r, space.OperationWake)
	switch {
	case err != nil:
		s.writeError(w, r, err)
		return
	case async:
		s.enqueue(w, r.WithContext(ctx), dispatcher.Request{Kind: space.OperationWake, Client: owner, SandboxID: id, IdempotencyKey: key}, internalOperationsPath)
		return
	}
	sb, err := s.sandboxes.Wake(ctx, caller, id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, sb)
}
