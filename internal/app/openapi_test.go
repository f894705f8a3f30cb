package app

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	verrors "github.com/pb33f/libopenapi-validator/errors"
	v3 "github.com/pb33f/libopenapi/datamodel/high/v3"
	"github.com/pb33f/libopenapi/orderedmap"
	"sigs.k8s.io/yaml"

	openapi "github.com/space-sandbox/space/api"
	"github.com/space-sandbox/space/internal/api"
	"github.com/space-sandbox/space/internal/testenv"
)

// The end-to-end tests check every answer they get against api/openapi.yaml, so that
// the document cannot drift from the code: http.DefaultClient and fuzzClient go through
// openAPITransport, which fails a request whose answer the document does not allow.
//
// The validator is libopenapi-validator. kin-openapi reads OpenAPI 3.1 too, but for 3.1
// documents it compiles a JSON Schema 2020-12 validator anew on every call (about 1 ms
// an answer here, 30 times libopenapi-validator's, on a suite that gets over ten
// thousand answers), and falls back to its OpenAPI 3.0 validator, which ignores 3.1
// keywords such as const, when that compile fails or when a schema with references
// uses no 3.1-only keyword. libopenapi-validator is JSON Schema 2020-12 throughout and
// compiles each schema once.
//
// Which listener a request went to decides which paths it can match: the transport asks
// each new host:port once for /openapi.yaml, which only the internal listener serves.

// runCheckingOpenAPI runs the tests with every answer to http.DefaultClient checked
// against the document, then fails the run if any answer did not match: a test that
// ignores a request's error (a fire-and-forget burst at a replica being killed) would
// otherwise hide the mismatch it got.
func runCheckingOpenAPI(m *testing.M) int {
	http.DefaultClient.Transport = openAPITransport(http.DefaultTransport, checkRequestsToo)
	code := m.Run()
	c, err := loadContract()
	if err != nil {
		fmt.Fprintln(os.Stderr, "api/openapi.yaml:", err)
		return 1
	}
	if mismatches := c.mismatchesSeen(); len(mismatches) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: %d answers did not match api/openapi.yaml (each failed the request that got it):\n", len(mismatches))
		for _, m := range mismatches {
			fmt.Fprintln(os.Stderr, "  "+m)
		}
		code = 1
	}
	if os.Getenv("SPACE_OPENAPI_COVERAGE") == "1" {
		fmt.Fprintln(os.Stderr, "documented answers no test got:")
		for _, r := range c.unseen() {
			fmt.Fprintln(os.Stderr, "  "+r)
		}
	}
	return code
}

// openAPITransport sends each request through next and checks the answer against
// api/openapi.yaml: its status, headers and body must be what the document says the
// route answers. With checkRequestsToo, a request that was answered 2xx must itself be
// one the document allows: a document stricter than the server is drift too. An answer
// that does not match is returned as an error naming the route, the status and what does
// not match, which fails the test that sent it.
func openAPITransport(next http.RoundTripper, what checks) http.RoundTripper {
	return &checkingTransport{next: next, requests: what == checkRequestsToo}
}

// checks is what openAPITransport checks.
type checks int

const (
	// checkRequestsToo: the answers, and the requests answered 2xx. For the requests
	// tests write on purpose.
	checkRequestsToo checks = iota
	// checkAnswersOnly: the answers. For fuzzed requests: they find where encoding/json
	// reads more than the document allows (keys in another case, null for metadata), and
	// the fuzz target must not fail on those until the server refuses them.
	checkAnswersOnly
)

type checkingTransport struct {
	next     http.RoundTripper
	requests bool
}

func (t *checkingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	c, err := loadContract()
	if err != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, fmt.Errorf("api/openapi.yaml: %w", err)
	}
	// Keep the request body to check the request after the answer: a RoundTripper must
	// not change the caller's request, so a clone carries the copy.
	var reqBody []byte
	out := req
	if req.Body != nil && req.Body != http.NoBody {
		reqBody, err = io.ReadAll(req.Body)
		req.Body.Close()
		if err != nil {
			return nil, err
		}
		out = req.Clone(req.Context())
		out.Body = io.NopCloser(bytes.NewReader(reqBody))
		out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(reqBody)), nil }
	}
	// Which listener answered is known per connection: a port the kernel hands to a
	// later server is another listener, but a connection stays with its server.
	var conn atomic.Value // net.Conn
	out = out.WithContext(httptrace.WithClientTrace(out.Context(), &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) { conn.Store(info.Conn) },
	}))
	resp, err := t.next.RoundTrip(out)
	if err != nil {
		return nil, err
	}
	c2, _ := conn.Load().(net.Conn)
	listener := c.listener(req.URL.Host, c2)
	if listener == "internal" && strings.HasPrefix(req.URL.Path, strings.TrimSuffix(api.RiverUIPath, "/")) {
		// River UI (SPACE_RIVER_UI): River's own pages and API, which the document
		// names but does not describe.
		return resp, nil
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	if m := c.check(listener, req, reqBody, resp, body, t.requests); m != nil {
		return nil, c.record(m)
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	return resp, nil
}

// contract is api/openapi.yaml made ready to check answers with.
type contract struct {
	validator validator.Validator
	model     *v3.Document
	paths     []docPath

	mu         sync.Mutex
	listeners  map[any]string        // net.Conn (or host:port) -> "public" or "internal"
	asking     map[any]chan struct{} // the same keys -> closed once it has been asked
	mismatches map[string]bool
	seen       map[string]bool // "METHOD path status" of every documented answer got
}

// docPath is one path of the document and the listeners that serve it.
type docPath struct {
	template  string
	segments  []string
	listeners []string
}

// The synthetic paths that requests matching no path of the document are checked
// against, and the methods an OpenAPI path item can have.
const (
	unmatchedPath   = "/__unmatched"
	unmatchedV1Path = "/__unmatched/v1"
)

var pathItemMethods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

var (
	contractOnce sync.Once
	theContract  *contract
	contractErr  error
)

// loadContract loads the document built into the binary (the one the internal listener
// serves) once for the test binary.
func loadContract() (*contract, error) {
	contractOnce.Do(func() { theContract, contractErr = newContract(openapi.Document()) })
	return theContract, contractErr
}

// newContract reads document and makes the test's copy of it stricter in two ways.
//
// Its objects are closed: a property that an object schema does not declare is a
// mismatch. The published document leaves them open, so that a client checking answers
// against it keeps working when a field is added; the tests must see every field.
//
// What the document says in words about requests that match no operation (its
// info.description) is spelled out as operations, so that their answers are checked
// like any other: a path the listener does not serve is the NoSuchRoute 404, a method a
// path is not served with is the MethodNotAllowed 405, and under /v1 the caller is
// authenticated first.
func newContract(document []byte) (*contract, error) {
	js, err := yaml.YAMLToJSON(document)
	if err != nil {
		return nil, err
	}
	var doc map[string]any
	if err := json.Unmarshal(js, &doc); err != nil {
		return nil, err
	}
	closeObjects(doc)
	listenerOf := map[string]string{}
	servers, _ := doc["servers"].([]any)
	for _, s := range servers {
		s, _ := s.(map[string]any)
		url, _ := s["url"].(string)
		if l, _ := s["x-listener"].(string); l == "public" || l == "internal" {
			listenerOf[url] = l
		}
	}
	if len(listenerOf) != 2 {
		return nil, fmt.Errorf("want one public and one internal server, got %v", servers)
	}
	ref := func(name string) map[string]any { return map[string]any{"$ref": "#/components/responses/" + name} }
	synthetic := func(v1 bool, responses map[string]any) map[string]any {
		rs := map[string]any{"431": ref("HeadersTooLarge"), "500": ref("Internal")}
		if v1 {
			rs["400"], rs["401"], rs["429"], rs["503"] = ref("Invalid"), ref("Unauthorized"), ref("Limited"), ref("Unavailable")
		}
		for k, v := range responses {
			rs[k] = v
		}
		return map[string]any{"security": []any{}, "responses": rs}
	}
	c := &contract{listeners: map[any]string{}, asking: map[any]chan struct{}{}, mismatches: map[string]bool{}, seen: map[string]bool{}}
	paths, _ := doc["paths"].(map[string]any)
	for template, item := range paths {
		item, _ := item.(map[string]any)
		p := docPath{template: template, segments: strings.Split(template, "/")}
		pathServers, _ := item["servers"].([]any)
		for _, s := range pathServers {
			s, _ := s.(map[string]any)
			url, _ := s["url"].(string)
			if l := listenerOf[url]; l != "" {
				p.listeners = append(p.listeners, l)
			}
		}
		if len(p.listeners) == 0 {
			return nil, fmt.Errorf("path %s names no listener in its servers", template)
		}
		for _, m := range pathItemMethods {
			if _, ok := item[m]; !ok {
				item[m] = synthetic(underV1(template), map[string]any{"405": ref("MethodNotAllowed")})
			}
		}
		c.paths = append(c.paths, p)
	}
	for _, p := range []string{unmatchedPath, unmatchedV1Path} {
		item := map[string]any{}
		for _, m := range pathItemMethods {
			item[m] = synthetic(p == unmatchedV1Path, map[string]any{"404": ref("NoSuchRoute")})
		}
		paths[p] = item
	}
	js, err = json.Marshal(doc)
	if err != nil {
		return nil, err
	}
	ldoc, err := libopenapi.NewDocument(js)
	if err != nil {
		return nil, err
	}
	model, err := ldoc.BuildV3Model()
	if err != nil {
		return nil, err
	}
	c.model = &model.Model
	c.validator = validator.NewValidatorFromV3Model(c.model)
	return c, nil
}

// closeObjects gives every object schema in node that declares properties (or is an
// allOf of schemas that do) and says nothing of others unevaluatedProperties: false. The
// members of an allOf are left open, each seeing only its own properties; the schema
// holding the allOf is closed over all of them.
func closeObjects(node any) {
	var schema func(s any, member bool)
	schema = func(s any, member bool) {
		m, ok := s.(map[string]any)
		if !ok {
			return
		}
		_, props := m["properties"]
		_, all := m["allOf"]
		_, ap := m["additionalProperties"]
		_, up := m["unevaluatedProperties"]
		if (props || all) && !ap && !up && !member {
			m["unevaluatedProperties"] = false
		}
		if ps, ok := m["properties"].(map[string]any); ok {
			for _, p := range ps {
				schema(p, false)
			}
		}
		for _, k := range []string{"items", "additionalProperties", "not", "propertyNames", "unevaluatedProperties"} {
			schema(m[k], false)
		}
		for _, k := range []string{"allOf", "anyOf", "oneOf", "prefixItems"} {
			list, _ := m[k].([]any)
			for _, e := range list {
				schema(e, k == "allOf")
			}
		}
	}
	// Every schema of the document is a component schema or sits under a "schema" key
	// (parameters, headers, media types).
	var walk func(n any)
	walk = func(n any) {
		switch n := n.(type) {
		case map[string]any:
			for k, v := range n {
				if k == "schema" {
					schema(v, false)
				} else {
					walk(v)
				}
			}
		case []any:
			for _, v := range n {
				walk(v)
			}
		}
	}
	walk(node)
	if comps, ok := node.(map[string]any)["components"].(map[string]any); ok {
		if schemas, ok := comps["schemas"].(map[string]any); ok {
			for _, s := range schemas {
				schema(s, false)
			}
		}
	}
}

func underV1(path string) bool { return path == "/v1" || strings.HasPrefix(path, "/v1/") }

// listener names the listener at host that answered on connection conn, asking the
// host once per connection: only the internal one serves /openapi.yaml. It is known per
// connection, not per host:port (nor per pair of addresses: the kernel reuses both
// ports in time), so that a port a closed server's listener had and a later server's
// other listener got is not taken for the first. The map keeps every connection it has
// seen, so none is collected and its identity handed to another. Concurrent first
// requests on a connection wait for the one question. A host that cannot be asked
// (gone) is "" and is asked again next time.
func (c *contract) listener(host string, conn net.Conn) string {
	var key any = conn
	if conn == nil {
		key = host // no connection seen: ask the host now
	}
	c.mu.Lock()
	if l, ok := c.listeners[key]; ok {
		c.mu.Unlock()
		return l
	}
	asking, ok := c.asking[key]
	if !ok {
		asking = make(chan struct{})
		c.asking[key] = asking
	}
	c.mu.Unlock()
	if ok {
		<-asking
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.listeners[key]
	}
	l := askListener(host)
	c.mu.Lock()
	defer c.mu.Unlock()
	if l != "" && conn != nil {
		c.listeners[key] = l
	}
	delete(c.asking, key)
	close(asking)
	return l
}

// probeClient asks listeners what they are on connections of its own, closed after
// each answer: a connection left idle in the tests' pool, or dialled and never used,
// would hold up a listener's graceful shutdown.
var probeClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}

func askListener(host string) string {
	resp, err := probeClient.Get("http://" + host + "/openapi.yaml")
	if err != nil {
		return ""
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		return "internal"
	case http.StatusNotFound:
		return "public"
	}
	return ""
}

// route finds the path of the document that serves path on listener ("" for unknown:
// either), matching as chi does: segment by segment, a {param} matching any one segment,
// even an empty one. A path the listener does not serve is one of the synthetic
// unmatched paths.
func (c *contract) route(listener, path string) string {
	segments := strings.Split(path, "/")
	for _, p := range c.paths {
		if listener != "" && !slices.Contains(p.listeners, listener) || len(p.segments) != len(segments) {
			continue
		}
		match := true
		for i, s := range p.segments {
			if !(strings.HasPrefix(s, "{") && strings.HasSuffix(s, "}")) && s != segments[i] {
				match = false
				break
			}
		}
		if match {
			return p.template
		}
	}
	if listener != "internal" && underV1(path) {
		return unmatchedV1Path
	}
	return unmatchedPath
}

// mismatch is an answer the document does not allow.
type mismatch struct {
	listener, method, target, route string
	status                          int
	reasons                         []string
	body                            []byte
}

func (m *mismatch) Error() string {
	route := "route " + strings.ToUpper(m.method) + " " + m.route
	switch m.route {
	case unmatchedPath, unmatchedV1Path:
		route = "no path of the document"
	}
	listener := m.listener
	if listener == "" {
		listener = "unknown"
	}
	body := string(m.body)
	if len(body) > 300 {
		body = body[:300] + "..."
	}
	return fmt.Sprintf("api/openapi.yaml does not allow this answer: %s %s (%s listener, %s) answered %d: %s; body %q",
		m.method, m.target, listener, route, m.status, strings.Join(m.reasons, "; "), body)
}

// check returns the mismatch of one request and its answer, or nil; it records only
// which documented answers were seen.
func (c *contract) check(listener string, req *http.Request, reqBody []byte, resp *http.Response, body []byte, checkRequest bool) *mismatch {
	path := req.URL.RawPath
	if path == "" {
		path = req.URL.Path
	}
	route := c.route(listener, path)
	m := &mismatch{listener: listener, method: req.Method, target: req.URL.RequestURI(), route: route, status: resp.StatusCode, body: body}
	item := c.model.Paths.PathItems.GetOrZero(route)
	op := item.GetOperations().GetOrZero(strings.ToLower(req.Method))
	if op == nil {
		m.reasons = append(m.reasons, "the method is not one an OpenAPI path item can have")
		return m
	}
	declared := op.Responses.Codes.GetOrZero(strconv.Itoa(resp.StatusCode))
	switch {
	case req.Method == http.MethodHead:
		// A HEAD answer has no body to check.
		if declared == nil {
			m.reasons = append(m.reasons, "the status is not documented")
		}
	default:
		r := *resp
		r.Body = io.NopCloser(bytes.NewReader(body))
		if ok, errs := c.validator.GetResponseBodyValidator().ValidateResponseBodyWithPathItem(req, &r, item, route); !ok {
			m.reasons = append(m.reasons, describe(errs)...)
		}
		if declared != nil && orderedmap.Len(declared.Content) == 0 && len(body) > 0 {
			m.reasons = append(m.reasons, "the document says this answer has no body")
		}
	}
	if declared != nil {
		// A header the document does not declare for this answer is drift too (the
		// validator checks only the declared ones), except those net/http itself sets.
		for name := range resp.Header {
			if !transportHeaders[name] && declared.Headers.GetOrZero(name) == nil && !declaredFold(declared.Headers, name) {
				m.reasons = append(m.reasons, "header "+name+" is not documented for this answer")
			}
		}
	}
	if checkRequest && resp.StatusCode >= 200 && resp.StatusCode < 300 {
		r := req.Clone(req.Context())
		r.Body = io.NopCloser(bytes.NewReader(reqBody))
		if ok, errs := c.validator.ValidateHttpRequestSyncWithPathItem(r, item, route); !ok {
			m.reasons = append(m.reasons, "the request was answered 2xx but the document does not allow it: "+strings.Join(describe(errs), "; "))
		}
	}
	if len(m.reasons) > 0 {
		return m
	}
	c.mu.Lock()
	c.seen[strings.ToUpper(req.Method)+" "+route+" "+strconv.Itoa(resp.StatusCode)] = true
	c.mu.Unlock()
	return nil
}

// transportHeaders are the answer's header fields that net/http writes whatever the
// handler does: the document describes only the handlers' own.
var transportHeaders = map[string]bool{
	"Content-Type": true, "Content-Length": true, "Date": true, "Connection": true,
	"Transfer-Encoding": true, "Keep-Alive": true,
}

// declaredFold reports whether headers declares name, compared case-insensitively as
// header field names are.
func declaredFold(headers *orderedmap.Map[string, *v3.Header], name string) bool {
	for k := range headers.KeysFromOldest() {
		if strings.EqualFold(k, name) {
			return true
		}
	}
	return false
}

func (c *contract) record(m *mismatch) *mismatch {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mismatches[m.Error()] = true
	return m
}

// describe words the validator's errors: what, and where in the body or headers.
func describe(errs []*verrors.ValidationError) []string {
	var out []string
	for _, e := range errs {
		s := e.Message
		if e.Reason != "" && e.Reason != e.Message {
			s += ": " + e.Reason
		}
		for _, f := range e.SchemaValidationErrors {
			where := f.FieldPath
			if where == "" {
				where = "/" + strings.Join(f.InstancePath, "/")
			}
			reason := f.Reason
			if reason == "false schema" {
				// How JSON Schema words a property left over by unevaluatedProperties: false.
				reason = "a property the document does not declare"
			}
			s += fmt.Sprintf(" [%s: %s]", where, reason)
		}
		out = append(out, s)
	}
	return out
}

func (c *contract) mismatchesSeen() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, len(c.mismatches))
	for m := range c.mismatches {
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}

// unseen lists the documented answers (operation and status) that no request got.
func (c *contract) unseen() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for path, item := range c.model.Paths.PathItems.FromOldest() {
		if path == unmatchedPath || path == unmatchedV1Path {
			continue
		}
		for method, op := range item.GetOperations().FromOldest() {
			if op.OperationId == "" {
				continue // a synthetic operation: a method the path is not served with
			}
			for status := range op.Responses.Codes.KeysFromOldest() {
				if key := strings.ToUpper(method) + " " + path + " " + status; !c.seen[key] {
					out = append(out, key)
				}
			}
		}
	}
	sort.Strings(out)
	return out
}

func TestOpenAPIContract(t *testing.T) {
	t.Parallel()

	t.Run("the internal listener serves the document the binary was built with, and the public one does not", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, e2eOptions{})
		r := s.internal("GET", "/openapi.yaml", "")
		if r.StatusCode != http.StatusOK || r.Header.Get("Content-Type") != "application/yaml" || !bytes.Equal(r.body, openapi.Document()) {
			t.Fatalf("internal /openapi.yaml = %d %q, %d bytes; want 200 application/yaml, the embedded document", r.StatusCode, r.Header.Get("Content-Type"), len(r.body))
		}
		if r := s.do("GET", "/openapi.yaml", "", ""); r.StatusCode != http.StatusNotFound {
			t.Fatalf("public /openapi.yaml = %d, want 404", r.StatusCode)
		}
	})

	t.Run("requests that match no operation are answered as the document says", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, e2eOptions{})
		for _, c := range []struct {
			base, method, path, client string
			status                     int
		}{
			{s.m.PublicURL(), "GET", "/nope", "", 404},
			{s.m.PublicURL(), "DELETE", "/healthz", "", 405},
			{s.m.PublicURL(), "GET", "/v1/nope", "", 401},
			{s.m.PublicURL(), "GET", "/v1/nope", "acme", 404},
			{s.m.PublicURL(), "GET", "/v1", "", 401},
			{s.m.PublicURL(), "GET", "/v1", "acme", 404},
			{s.m.PublicURL(), "GET", "/v1x", "", 404},
			{s.m.PublicURL(), "PUT", "/v1/sandboxes", "", 401},
			{s.m.PublicURL(), "PUT", "/v1/sandboxes", "acme", 405},
			{s.m.PublicURL(), "GET", "/v1/sandboxes//restore", "acme", 405},
			{s.m.InternalURL(), "GET", "/v1/sandboxes", "acme", 404},
			{s.m.InternalURL(), "POST", "/metrics", "", 405},
		} {
			if r := s.request(c.base, c.method, c.path, c.client, ""); r.StatusCode != c.status {
				t.Errorf("%s %s = %d %s, want %d", c.method, c.path, r.StatusCode, r.body, c.status)
			}
		}
	})

	t.Run("an answer the document does not allow fails the request, naming the route, the status and what is wrong", func(t *testing.T) {
		t.Parallel()
		c, err := loadContract()
		if err != nil {
			t.Fatal(err)
		}
		problem := func(code string, status int) string {
			return fmt.Sprintf(`{"type":%q,"title":"x","status":%d,"code":%q}`, api.ProblemType(code), status, code)
		}
		const id = "00000000-0000-4000-8000-000000000001"
		sandbox := `{"id":"` + id + `","client":"acme","state":"running","template":"python-3.12","cpu_millis":1,"memory_mib":1,"disk_gib":1,` +
			`"template_version":"v1","warm":false,"created_at":"2025-01-01T00:00:00Z","updated_at":"2025-01-01T00:00:00Z",` +
			`"expires_at":null,"idle_at":null,"pause_reason":null,"termination_reason":null}`
		for _, tc := range []struct {
			name, method, path, listener string
			status                       int
			header                       http.Header
			body                         string
			want                         []string // in the error; none: the answer matches
		}{
			{"a sandbox as documented", "GET", "/v1/sandboxes/" + id, "public", 200, nil, sandbox, nil},
			{"a field the document does not declare", "GET", "/v1/sandboxes/" + id, "public", 200, nil,
				strings.Replace(sandbox, `"warm":false`, `"warm":false,"node":"n1"`, 1), []string{"GET /v1/sandboxes/{id}", "answered 200", "node"}},
			{"a field the document requires, missing", "GET", "/v1/sandboxes/" + id, "public", 200, nil,
				strings.Replace(sandbox, `"template_version":"v1",`, "", 1), []string{"answered 200", "template_version"}},
			{"a sandbox the lifecycle ended, as documented", "GET", "/v1/sandboxes/" + id, "public", 200, nil,
				strings.NewReplacer(`"state":"running"`, `"state":"terminated"`, `"expires_at":null`, `"expires_at":"2025-01-02T00:00:00Z"`,
					`"termination_reason":null`, `"termination_reason":"max_lifetime"`).Replace(sandbox), nil},
			{"a termination reason the document does not list", "GET", "/v1/sandboxes/" + id, "public", 200, nil,
				strings.Replace(sandbox, `"termination_reason":null`, `"termination_reason":"bored"`, 1), []string{"answered 200", "termination_reason"}},
			{"a status the route does not answer", "GET", "/v1/sandboxes/" + id, "public", 418, nil, problem("internal", 418), []string{"answered 418", "418"}},
			{"a problem whose code is not its status's", "GET", "/v1/sandboxes/" + id, "public", 404, nil, problem("conflict", 404), []string{"answered 404", "not_found"}},
			{"a 429 without its Retry-After", "POST", "/v1/sandboxes", "public", 429, http.Header{"Ratelimit": {`"client_activation";r=0;t=1`}, "Ratelimit-Policy": {`"client_activation";q=1`}},
				`{"type":"` + api.ProblemType("limited") + `","title":"x","status":429,"code":"limited","bucket":"client_activation","client":"acme"}`, []string{"POST /v1/sandboxes", "answered 429", "Retry-After"}},
			{"a body on a 204", "DELETE", "/v1/sandboxes/" + id, "public", 204, http.Header{"Content-Type": nil}, "{}", []string{"no body"}},
			{"an internal route on the public listener", "GET", "/metrics", "public", 200, http.Header{"Content-Type": {"text/plain"}}, "x 1\n", []string{"no path of the document", "answered 200"}},
			{"no such route, as documented", "GET", "/metrics", "public", 404, nil, problem("not_found", 404), nil},
			{"a 2xx to a request the document does not allow", "GET", "/v1/sandboxes?limit=9999", "public", 200, nil, `{"sandboxes":[]}`, []string{"answered 2xx", "limit"}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				req, err := http.NewRequest(tc.method, "http://127.0.0.1:1"+tc.path, nil)
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set(api.HeaderClientID, "acme")
				h := http.Header{"Content-Type": {"application/json"}, "X-Request-Id": {"r1"}}
				if tc.status >= 400 {
					h.Set("Content-Type", "application/problem+json")
					h.Set("Cache-Control", "no-store")
				}
				for k, v := range tc.header {
					if v == nil {
						h.Del(k)
					} else {
						h[k] = v
					}
				}
				err = nil
				if m := c.check(tc.listener, req, nil, &http.Response{StatusCode: tc.status, Header: h}, []byte(tc.body), true); m != nil {
					err = m
				}
				switch {
				case tc.want == nil && err != nil:
					t.Fatalf("a matching answer was refused: %v", err)
				case tc.want != nil && err == nil:
					t.Fatal("the mismatch was not caught")
				}
				for _, w := range tc.want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("the error does not say %q: %v", w, err)
					}
				}
				if err != nil {
					t.Logf("caught: %v", err)
				}
			})
		}
	})

	t.Run("a request that cannot reach a listener is the client's error, untouched", func(t *testing.T) {
		t.Parallel()
		client := &http.Client{Transport: openAPITransport(http.DefaultTransport, checkRequestsToo)}
		_, err := client.Get("http://" + testenv.FreeAddr(t) + "/healthz")
		var m *mismatch
		if err == nil || errors.As(err, &m) {
			t.Fatalf("a refused connection = %v, want the dial error", err)
		}
	})
}
