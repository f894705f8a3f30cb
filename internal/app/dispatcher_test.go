package app

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/testenv"
)

const async = "respond-async"

// operation decodes a 202 and checks the headers every accepted operation carries.
func (s *server) accepted(r response, locationPrefix string) *space.Operation {
	s.t.Helper()
	if r.StatusCode != http.StatusAccepted {
		s.t.Fatalf("status %d %s, want 202", r.StatusCode, r.body)
	}
	var op space.Operation
	r.json(s.t, &op)
	if loc := r.Header.Get("Location"); loc != locationPrefix+op.ID {
		s.t.Fatalf("Location %q, want %s%s", loc, locationPrefix, op.ID)
	}
	if pa := r.Header.Get("Preference-Applied"); pa != async {
		s.t.Fatalf("Preference-Applied %q, want %s", pa, async)
	}
	return &op
}

// poll reads the operation at path as client until it is final.
func (s *server) poll(base, path, client string) *space.Operation {
	s.t.Helper()
	var op space.Operation
	testenv.Eventually(s.t, 15*time.Second, path+" to finish", func() bool {
		r := s.request(base, "GET", path, client, "")
		if r.StatusCode != http.StatusOK {
			s.t.Fatalf("GET %s = %d %s", path, r.StatusCode, r.body)
		}
		r.json(s.t, &op)
		return op.State.Done()
	})
	return &op
}

func TestAsyncOperations(t *testing.T) {
	t.Parallel()

	t.Run("a create preferring respond-async is 202 with a Location that reaches succeeded", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, e2eOptions{quota: acmeQuota})
		op := s.accepted(s.do("POST", "/v1/sandboxes", "acme", pythonBody, "Prefer", "wait=5, respond-async"), "/v1/operations/")
		if op.Kind != space.OperationCreate || op.Client != "acme" || op.State.Done() || op.SandboxID == "" || op.Attempts != 0 {
			t.Fatalf("accepted operation %+v", op)
		}
		done := s.poll(s.m.PublicURL(), "/v1/operations/"+op.ID, "acme")
		if done.State != space.OperationSucceeded || done.Attempts != 1 || done.Sandbox == nil ||
			done.Sandbox.ID != op.SandboxID || done.Sandbox.State != space.StateRunning || done.Sandbox.Template != "python-3.12" {
			t.Fatalf("finished operation %+v (sandbox %+v)", done, done.Sandbox)
		}
		if r := s.do("GET", "/v1/sandboxes/"+op.SandboxID, "acme", ""); r.StatusCode != http.StatusOK {
			t.Fatalf("the operation's sandbox = %d", r.StatusCode)
		}
		if r := s.do("GET", "/v1/operations/"+op.ID, "globex", ""); r.StatusCode != http.StatusNotFound || r.problem(t).Code != space.ENOTFOUND {
			t.Fatalf("globex reading acme's operation = %d %s, want 404", r.StatusCode, r.body)
		}
		if r := s.do("GET", "/v1/operations/nope", "acme", ""); r.StatusCode != http.StatusBadRequest || r.problem(t).Field != "id" {
			t.Fatalf("a malformed operation id = %d %s, want 400 naming id", r.StatusCode, r.body)
		}
		// The worker counts an operation once its end is committed: the count may
		// trail the state the poll read.
		testenv.Eventually(t, 10*time.Second, "the succeeded create to be counted", func() bool {
			return s.metric("space_dispatcher_operations_total", `kind="create"`, `state="succeeded"`) >= 1
		})
		metrics := s.internal("GET", "/metrics", "")
		for _, want := range []string{
			`space_dispatcher_operations_total{kind="create",state="succeeded"} 1`,
			`space_dispatcher_queue_seconds_count{kind="create"} 1`,
			`space_dispatcher_snoozes_total`,
		} {
			if !strings.Contains(string(metrics.body), want) {
				t.Errorf("/metrics lacks %s", want)
			}
		}
	})

	t.Run("an Idempotency-Key gives the same operation again, and a different request under it is a 422", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, e2eOptions{quota: acmeQuota})
		first := s.accepted(s.do("POST", "/v1/sandboxes", "acme", pythonBody, "Prefer", async, "Idempotency-Key", "build-7"), "/v1/operations/")
		again := s.accepted(s.do("POST", "/v1/sandboxes", "acme", pythonBody, "Prefer", async, "Idempotency-Key", "build-7"), "/v1/operations/")
		if again.ID != first.ID || again.SandboxID != first.SandboxID {
			t.Fatalf("a repeat got operation %s, want %s", again.ID, first.ID)
		}
		other := `{"template":"node-22","cpu_millis":1,"memory_mib":1,"disk_gib":1}`
		r := s.do("POST", "/v1/sandboxes", "acme", other, "Prefer", async, "Idempotency-Key", "build-7")
		if p := r.problem(t); r.StatusCode != http.StatusUnprocessableEntity || p.Field != "Idempotency-Key" {
			t.Fatalf("the key with another body = %d %+v, want 422 naming Idempotency-Key", r.StatusCode, p)
		}
		for name, header := range map[string][]string{
			"a key too long":              {"Prefer", async, "Idempotency-Key", strings.Repeat("k", 256)},
			"a key with a tab":            {"Prefer", async, "Idempotency-Key", "a\tb"},
			"a key not in ASCII":          {"Prefer", async, "Idempotency-Key", "caf\u00e9"},
			"a quoted key left open":      {"Prefer", async, "Idempotency-Key", `"build-8`},
			"a key too long, synchronous": {"Idempotency-Key", strings.Repeat("k", 256)},
		} {
			r := s.do("POST", "/v1/sandboxes", "acme", pythonBody, header...)
			if p := r.problem(t); r.StatusCode != http.StatusBadRequest || p.Field != "Idempotency-Key" {
				t.Errorf("%s = %d %+v, want 400 naming Idempotency-Key", name, r.StatusCode, p)
			}
		}
		var n int
		if err := s.m.DB.QueryRow(testenv.Context(t), "SELECT count(*) FROM operations").Scan(&n); err != nil || n != 1 {
			t.Fatalf("%d operations (%v), want 1", n, err)
		}
	})

	t.Run("an async request is validated like a synchronous one before anything is queued", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, e2eOptions{quota: acmeQuota})
		before := s.rawBuckets("acme")
		for _, tc := range []struct {
			name, body string
			status     int
			field      string
		}{
			{"malformed JSON", `{"template":`, 400, "body"},
			{"a zero size", `{"template":"python-3.12","cpu_millis":1,"memory_mib":0,"disk_gib":1}`, 400, "memory_mib"},
			{"an unknown template", `{"template":"cobol","cpu_millis":1,"memory_mib":1,"disk_gib":1}`, 422, "template"},
			{"disk over the template's cap", `{"template":"python-3.12","cpu_millis":1,"memory_mib":1,"disk_gib":51}`, 422, "disk_gib"},
		} {
			r := s.do("POST", "/v1/sandboxes", "acme", tc.body, "Prefer", async)
			if p := r.problem(t); r.StatusCode != tc.status || p.Field != tc.field {
				t.Errorf("%s = %d %+v, want %d naming %s", tc.name, r.StatusCode, p, tc.status, tc.field)
			}
		}
		if r := s.do("POST", "/v1/sandboxes/00000000-0000-4000-8000-000000000001/restore", "acme", "", "Prefer", async); r.StatusCode != http.StatusNotFound {
			t.Errorf("an async restore of no sandbox = %d, want 404", r.StatusCode)
		}
		var n int
		if err := s.m.DB.QueryRow(testenv.Context(t), "SELECT count(*) FROM operations").Scan(&n); err != nil || n != 0 {
			t.Fatalf("%d operations (%v) queued by refused requests", n, err)
		}
		if after := s.rawBuckets("acme"); after != before {
			t.Fatalf("refused async requests charged a bucket:\n before %s\n after  %s", before, after)
		}
	})

	t.Run("an async restore runs as its client and an async wake is charged to the owner", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, e2eOptions{quota: acmeQuota})
		sb := s.create("acme", pythonBody)
		if r := s.do("POST", "/v1/sandboxes/"+sb.ID+"/pause", "acme", ""); r.StatusCode != http.StatusOK {
			t.Fatalf("pause = %d", r.StatusCode)
		}
		restore := s.accepted(s.do("POST", "/v1/sandboxes/"+sb.ID+"/restore", "acme", "", "Prefer", async), "/v1/operations/")
		if done := s.poll(s.m.PublicURL(), "/v1/operations/"+restore.ID, "acme"); done.State != space.OperationSucceeded || done.Sandbox.State != space.StateRunning {
			t.Fatalf("restore operation %+v", done)
		}
		if r := s.do("POST", "/v1/sandboxes/"+sb.ID+"/pause", "acme", ""); r.StatusCode != http.StatusOK {
			t.Fatalf("pause = %d", r.StatusCode)
		}

		unknownRate := &space.Rate{RefillRPS: 0.000001, Burst: 1}
		_, a0 := s.tokens("acme", acmeRate)
		_, u0 := s.tokens(space.Unknown, unknownRate)
		wake := s.accepted(s.request(s.m.InternalURL(), "POST", "/internal/v1/sandboxes/"+sb.ID+"/wake", "", "", "Prefer", async), "/internal/v1/operations/")
		if wake.Client != "acme" || wake.Kind != space.OperationWake {
			t.Fatalf("wake operation %+v, want it run as the owner acme", wake)
		}
		if done := s.poll(s.m.InternalURL(), "/internal/v1/operations/"+wake.ID, ""); done.State != space.OperationSucceeded {
			t.Fatalf("wake operation %+v", done)
		}
		_, a1 := s.tokens("acme", acmeRate)
		_, u1 := s.tokens(space.Unknown, unknownRate)
		if !near(a0-a1, 1) || u1 != u0 {
			t.Fatalf("wake: acme %v -> %v, unknown %v -> %v; want one token from acme alone", a0, a1, u0, u1)
		}
		// The owner sees its wake on the public listener too.
		if r := s.do("GET", "/v1/operations/"+wake.ID, "acme", ""); r.StatusCode != http.StatusOK {
			t.Fatalf("acme reading its wake = %d", r.StatusCode)
		}
	})
}
