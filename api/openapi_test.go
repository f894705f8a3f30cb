package openapi

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	"sigs.k8s.io/yaml"
)

func TestTheDocumentIsValidOpenAPI31(t *testing.T) {
	t.Parallel()
	doc, err := libopenapi.NewDocument(Document())
	if err != nil {
		t.Fatal(err)
	}
	if v := doc.GetVersion(); v != "3.1.0" {
		t.Fatalf("openapi %q, want 3.1.0", v)
	}
	v, errs := validator.NewValidator(doc)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if ok, verrs := v.ValidateDocument(); !ok {
		for _, e := range verrs {
			t.Errorf("%s: %s", e.Message, e.Reason)
			for _, f := range e.SchemaValidationErrors {
				t.Errorf("  %s: %s", f.FieldPath, f.Reason)
			}
		}
	}
}

// operation is one operation of the document, as plain data.
type operation struct {
	method, path string
	op           map[string]any
}

func operations(t *testing.T) (doc map[string]any, ops []operation) {
	t.Helper()
	js, err := yaml.YAMLToJSON(Document())
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(js, &doc); err != nil {
		t.Fatal(err)
	}
	for path, item := range doc["paths"].(map[string]any) {
		for method, op := range item.(map[string]any) {
			if op, ok := op.(map[string]any); ok && method != "servers" && method != "parameters" {
				ops = append(ops, operation{method, path, op})
			}
		}
	}
	sort.Slice(ops, func(i, j int) bool { return ops[i].path+ops[i].method < ops[j].path+ops[j].method })
	return doc, ops
}

// resolve follows a local $ref.
func resolve(doc map[string]any, v any) map[string]any {
	m, _ := v.(map[string]any)
	ref, ok := m["$ref"].(string)
	if !ok {
		return m
	}
	var node any = doc
	for _, part := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
		node = node.(map[string]any)[part]
	}
	return resolve(doc, node)
}

func TestEveryAnswerIsDescribedTheWayTheServerWritesIt(t *testing.T) {
	t.Parallel()
	doc, ops := operations(t)
	if len(ops) != 17 {
		t.Errorf("%d operations, want the 17 routes of both listeners", len(ops))
	}
	ids := map[string]bool{}
	for _, o := range ops {
		name := strings.ToUpper(o.method) + " " + o.path
		id, _ := o.op["operationId"].(string)
		if id == "" || ids[id] {
			t.Errorf("%s: operationId %q is missing or not unique: a generated client names its method after it", name, id)
		}
		ids[id] = true
		responses := o.op["responses"].(map[string]any)
		for status, r := range responses {
			r := resolve(doc, r)
			where := fmt.Sprintf("%s %s", name, status)
			headers, _ := r["headers"].(map[string]any)
			// Every handler answer carries X-Request-ID (a 431 in plain text from
			// net/http, before any handler, does not: that one is optional).
			if _, ok := headers["X-Request-ID"]; !ok {
				t.Errorf("%s: no X-Request-ID header", where)
			}
			content, _ := r["content"].(map[string]any)
			if status[0] < '4' || name == "GET /readyz" && status == "503" || name == "GET /metrics" && status == "500" {
				continue
			}
			// Every error of a handler is a problem, with the schema of its status.
			mt, ok := content["application/problem+json"].(map[string]any)
			if !ok {
				t.Errorf("%s: not application/problem+json", where)
				continue
			}
			// One problem, or a choice of problems (a 503 is unavailable or
			// overloaded): each is an allOf of Problem and its own constants.
			schema := mt["schema"].(map[string]any)
			choices := []any{schema}
			if one, ok := schema["oneOf"].([]any); ok {
				choices = one
			}
			for _, c := range choices {
				c := c.(map[string]any)
				ref, _ := c["$ref"].(string)
				s := resolve(doc, c)
				all, _ := s["allOf"].([]any)
				if !strings.HasSuffix(ref, "Problem") || len(all) != 2 || all[0].(map[string]any)["$ref"] != "#/components/schemas/Problem" {
					t.Errorf("%s: schema %v is not an allOf of Problem and its status's constants", where, c)
					continue
				}
				if got := fmt.Sprint(all[1].(map[string]any)["properties"].(map[string]any)["status"].(map[string]any)["const"]); got != status {
					t.Errorf("%s: its problem %s says status %s", where, ref, got)
				}
			}
			if _, ok := headers["Cache-Control"]; !ok {
				t.Errorf("%s: no Cache-Control (problems are no-store)", where)
			}
			if status == "429" {
				for _, h := range []string{"Retry-After", "RateLimit-Policy", "RateLimit"} {
					if _, ok := headers[h]; !ok {
						t.Errorf("%s: no %s", where, h)
					}
				}
			}
			if status == "401" {
				if _, ok := headers["WWW-Authenticate"]; !ok {
					t.Errorf("%s: no WWW-Authenticate", where)
				}
			}
		}
		for _, status := range []string{"431", "500"} {
			if _, ok := responses[status]; !ok {
				t.Errorf("%s: no %s, which any route can answer", name, status)
			}
		}
	}
}
