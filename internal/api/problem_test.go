package api

import (
	"encoding/json"
	"math"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/space-sandbox/space"
	openapi "github.com/space-sandbox/space/api"
)

func TestLimitHeaders(t *testing.T) {
	t.Parallel()

	retryAfter := func(le *space.LimitError, rnd float64) int {
		h := http.Header{}
		setLimitHeaders(h, le, func() float64 { return rnd })
		n, err := strconv.Atoi(h.Get("Retry-After"))
		if err != nil {
			t.Fatalf("Retry-After %q is not whole seconds", h.Get("Retry-After"))
		}
		return n
	}

	t.Run("Retry-After is never earlier than the refill and at least one second", func(t *testing.T) {
		t.Parallel()
		for _, refill := range []time.Duration{0, time.Millisecond, 999 * time.Millisecond, time.Second, 2500 * time.Millisecond, time.Minute,
			25 * time.Hour, 7 * 24 * time.Hour, 10 * 365 * 24 * time.Hour} {
			for _, rnd := range []float64{0, 0.5, 0.999} {
				got := retryAfter(&space.LimitError{Bucket: space.BucketClientActivation, RetryAfter: refill}, rnd)
				if got < 1 || float64(got) < refill.Seconds() {
					t.Errorf("refill %v, rnd %v: Retry-After %d", refill, rnd, got)
				}
			}
		}
	})

	t.Run("Retry-After is jittered across callers", func(t *testing.T) {
		t.Parallel()
		le := &space.LimitError{Bucket: space.BucketClusterActivation, RetryAfter: 10 * time.Second}
		if lo, hi := retryAfter(le, 0), retryAfter(le, 0.999); lo != 10 || hi <= lo {
			t.Fatalf("Retry-After spans %d..%d, want 10 up to more than 10", lo, hi)
		}
	})

	t.Run("a bucket that refills once a week says at least a week", func(t *testing.T) {
		t.Parallel()
		week := 7 * 24 * time.Hour
		for _, rnd := range []float64{0, 0.999} {
			if got := retryAfter(&space.LimitError{Bucket: space.BucketClientActivation, RetryAfter: week}, rnd); got < int(week/time.Second) {
				t.Fatalf("Retry-After = %d, want at least a week (%d)", got, int(week/time.Second))
			}
		}
	})

	t.Run("a bucket that never refills is told to retry in a day", func(t *testing.T) {
		t.Parallel()
		got := retryAfter(&space.LimitError{Bucket: space.BucketClientActivation, RetryAfter: time.Duration(math.MaxInt64)}, 0.5)
		if got != 86400 {
			t.Fatalf("Retry-After = %d, want 86400", got)
		}
	})

	t.Run("RateLimit fields describe the bucket that refused", func(t *testing.T) {
		t.Parallel()
		h := http.Header{}
		setLimitHeaders(h, &space.LimitError{Bucket: space.BucketClientActivation, RetryAfter: 3 * time.Second,
			Limit: &space.Rate{RefillRPS: 10, Burst: 40}, Remaining: 0.4}, func() float64 { return 0 })
		if got := h.Get("RateLimit-Policy"); got != `"client_activation";q=40;w=4` {
			t.Errorf("RateLimit-Policy = %q", got)
		}
		if got := h.Get("RateLimit"); got != `"client_activation";r=0;t=3` {
			t.Errorf("RateLimit = %q", got)
		}
		h = http.Header{}
		setLimitHeaders(h, &space.LimitError{Bucket: space.BucketLiveSandboxCap, Cap: 50, RetryAfter: time.Second}, func() float64 { return 0 })
		if got := h.Get("RateLimit-Policy"); got != `"live_sandbox_cap";q=50` {
			t.Errorf("RateLimit-Policy = %q", got)
		}
		if got := h.Get("RateLimit"); got != `"live_sandbox_cap";r=0;t=1` {
			t.Errorf("RateLimit = %q", got)
		}
	})

	t.Run("a refusal with neither a rate nor a cap states no policy", func(t *testing.T) {
		t.Parallel()
		h := http.Header{}
		setLimitHeaders(h, &space.LimitError{Bucket: space.BucketAuthFailures, RetryAfter: 12 * time.Second, Remaining: 2}, func() float64 { return 0 })
		if _, ok := h["Ratelimit-Policy"]; ok {
			t.Errorf("RateLimit-Policy = %q, want none", h.Values("RateLimit-Policy"))
		}
		if got := h.Get("RateLimit"); got != `"auth_failures";r=2;t=12` {
			t.Errorf("RateLimit = %q", got)
		}
		if got := h.Get("Retry-After"); got != "12" {
			t.Errorf("Retry-After = %q", got)
		}
	})

	t.Run("a value added to one field leaves the others as they were", func(t *testing.T) {
		t.Parallel()
		h := http.Header{}
		setLimitHeaders(h, &space.LimitError{Bucket: space.BucketClientActivation, RetryAfter: 3 * time.Second,
			Limit: &space.Rate{RefillRPS: 10, Burst: 40}}, func() float64 { return 0 })
		h.Add("Retry-After", "9")
		h.Add("RateLimit-Policy", `"other";q=1`)
		if got := h.Values("Retry-After"); len(got) != 2 || got[0] != "3" || got[1] != "9" {
			t.Errorf("Retry-After = %q", got)
		}
		if got := h.Values("RateLimit-Policy"); len(got) != 2 || got[0] != `"client_activation";q=40;w=4` {
			t.Errorf("RateLimit-Policy = %q", got)
		}
		if got := h.Values("RateLimit"); len(got) != 1 || got[0] != `"client_activation";r=0;t=3` {
			t.Errorf("RateLimit = %q", got)
		}
	})
}

func TestProblemTypes(t *testing.T) {
	t.Parallel()
	docs, err := os.ReadFile("../../docs/problems.md")
	if err != nil {
		t.Fatal(err)
	}
	headings := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^#{2,3} ([a-z_]+)$`).FindAllStringSubmatch(string(docs), -1) {
		headings[m[1]] = true
	}
	// Every code the server answers: the table's, and the router's 405.
	codes := map[string]int{"method_not_allowed": http.StatusMethodNotAllowed}
	for code, status := range statusByCode {
		codes[code] = status
	}

	t.Run("every code's type is an absolute URI of its section of docs/problems.md", func(t *testing.T) {
		t.Parallel()
		for code := range codes {
			typ := ProblemType(code)
			if !strings.HasPrefix(typ, "https://") || !strings.HasSuffix(typ, "/docs/problems.md#"+code) {
				t.Errorf("ProblemType(%q) = %q", code, typ)
			}
			if !headings[code] {
				t.Errorf("docs/problems.md has no section %q for the type %s", "## "+code, typ)
			}
		}
	})

	t.Run("every bucket has its section under limited", func(t *testing.T) {
		t.Parallel()
		for _, b := range []space.Bucket{space.BucketClientActivation, space.BucketClusterActivation,
			space.BucketClientConcurrency, space.BucketLiveSandboxCap, space.BucketPausedSandboxCap, space.BucketAuthFailures} {
			if !headings[string(b)] {
				t.Errorf("docs/problems.md has no section %q", "### "+b)
			}
		}
	})

	t.Run("api/openapi.yaml has every code, with its status and type", func(t *testing.T) {
		t.Parallel()
		js, err := yaml.YAMLToJSON(openapi.Document())
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			Components struct {
				Schemas map[string]struct {
					Enum  []string `json:"enum"`
					AllOf []struct {
						Properties map[string]struct {
							Const any `json:"const"`
						} `json:"properties"`
					} `json:"allOf"`
				} `json:"schemas"`
			} `json:"components"`
		}
		if err := json.Unmarshal(js, &doc); err != nil {
			t.Fatal(err)
		}
		enum := map[string]bool{}
		for _, c := range doc.Components.Schemas["ErrorCode"].Enum {
			enum[c] = true
		}
		documented := map[string]bool{}
		for name, s := range doc.Components.Schemas {
			if len(s.AllOf) != 2 || s.AllOf[1].Properties["code"].Const == nil {
				continue
			}
			p := s.AllOf[1].Properties
			code, _ := p["code"].Const.(string)
			status, _ := p["status"].Const.(float64)
			if want, ok := codes[code]; !ok || int(status) != want || p["type"].Const != ProblemType(code) {
				t.Errorf("schema %s: code %q, status %v, type %v; the server answers %q with %d and %s", name, code, status, p["type"].Const, code, want, ProblemType(code))
			}
			documented[code] = true
		}
		for code := range codes {
			if !enum[code] || !documented[code] {
				t.Errorf("code %q: in the ErrorCode enum %v, with a problem schema %v", code, enum[code], documented[code])
			}
		}
		if len(enum) != len(codes) {
			t.Errorf("the ErrorCode enum has %d codes, the server %d", len(enum), len(codes))
		}
	})
}

// encodedProblem is p as encoding/json's Encoder writes it: what appendProblem must
// write byte for byte.
func encodedProblem(t testing.TB, p Problem) string {
	t.Helper()
	var b strings.Builder
	if err := json.NewEncoder(&b).Encode(p); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestAppendProblemWritesWhatTheEncoderWrites(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		p    Problem
	}{
		{"a refusal, every member set", Problem{Type: ProblemType(space.ELIMITED), Title: "Too Many Requests", Status: 429,
			Detail: `client "acme" is over its sandbox activation rate`, Instance: "/v1/sandboxes", Code: space.ELIMITED,
			Field: "template", Bucket: space.BucketClientActivation, Client: "acme", RequestID: "0123abcd"}},
		{"only what is never omitted", Problem{Type: "t", Title: "x", Status: 500, Code: space.EINTERNAL}},
		{"empty strings where nothing is omitted", Problem{}},
		{"quotes and backslashes", Problem{Detail: `a "quoted" \ back\slash \"`, Field: `metadata.\"`}},
		{"control characters, HTML and a line separator", Problem{Detail: "tab\tnew\nline\r\bnul\x00 <script>&amp; \u2028\u2029 é \U0001F600"}},
		{"bytes that are not UTF-8", Problem{Field: "metadata.\xff\xfe", Instance: "/v1/sandboxes/\xc3"}},
		{"a negative status", Problem{Status: -1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if got, want := string(appendProblem(nil, c.p)), encodedProblem(t, c.p); got != want {
				t.Fatalf("appendProblem =\n%s\nencoding/json =\n%s", got, want)
			}
		})
	}
}

func FuzzAppendProblem(f *testing.F) {
	f.Add("limited", `client "acme" is over its rate`, "/v1/sandboxes", "acme", "template", 429)
	f.Add("<&>", "\x00\u2028\xff", `\"`, "é", "", 0)
	f.Fuzz(func(t *testing.T, code, detail, instance, client, field string, status int) {
		p := Problem{Type: ProblemType(code), Title: http.StatusText(status), Status: status, Detail: detail, Instance: instance,
			Code: code, Field: field, Bucket: space.Bucket(code), Client: space.ClientKey(client), RequestID: detail}
		if got, want := string(appendProblem(nil, p)), encodedProblem(t, p); got != want {
			t.Fatalf("appendProblem =\n%q\nencoding/json =\n%q", got, want)
		}
	})
}
