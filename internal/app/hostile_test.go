package app

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/api"
	"github.com/space-sandbox/space/internal/config"
	"github.com/space-sandbox/space/internal/testenv"
)

func TestHostileInput(t *testing.T) {
	t.Parallel()

	t.Run("bad input in any field is a 4xx naming it, synchronously and queued, and nothing is stored", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, e2eOptions{quota: acmeQuota})
		huge := fmt.Sprint(int64(math.MaxInt32) + 1)
		for _, tc := range []struct {
			name, body string
			status     int
			field      string
		}{
			{"cpu beyond any column", `{"template":"python-3.12","cpu_millis":` + huge + `,"memory_mib":1,"disk_gib":1}`, 422, "cpu_millis"},
			{"memory beyond any column", `{"template":"python-3.12","cpu_millis":1,"memory_mib":9007199254740991,"disk_gib":1}`, 422, "memory_mib"},
			{"disk beyond any column", `{"template":"python-3.12","cpu_millis":1,"memory_mib":1,"disk_gib":` + huge + `}`, 422, "disk_gib"},
			{"a NUL in a metadata value", `{"template":"python-3.12","cpu_millis":1,"memory_mib":1,"disk_gib":1,"metadata":{"k":"a\u0000b"}}`, 400, "metadata.k"},
			{"a NUL in a metadata key", `{"template":"python-3.12","cpu_millis":1,"memory_mib":1,"disk_gib":1,"metadata":{"a\u0000":"b"}}`, 400, "metadata"},
			{"a NUL in the template", `{"template":"py\u0000","cpu_millis":1,"memory_mib":1,"disk_gib":1}`, 400, "template"},
			{"invalid UTF-8 in a metadata value", "{\"template\":\"python-3.12\",\"cpu_millis\":1,\"memory_mib\":1,\"disk_gib\":1,\"metadata\":{\"k\":\"\xff\xfe\"}}", 400, "metadata.k"},
			{"invalid UTF-8 in a metadata key", "{\"template\":\"python-3.12\",\"cpu_millis\":1,\"memory_mib\":1,\"disk_gib\":1,\"metadata\":{\"\xc3\":\"v\"}}", 400, "metadata"},
			{"invalid UTF-8 in the template", "{\"template\":\"py\xe2\x28\xa1\",\"cpu_millis\":1,\"memory_mib\":1,\"disk_gib\":1}", 400, "template"},
		} {
			for _, prefer := range []string{"", async} {
				r := s.do("POST", "/v1/sandboxes", "acme", tc.body, "Prefer", prefer)
				p := r.problem(t)
				if r.StatusCode != tc.status || p.Field != tc.field {
					t.Errorf("%s (Prefer %q): %d %+v, want %d naming %s", tc.name, prefer, r.StatusCode, p, tc.status, tc.field)
				}
			}
		}
		var ops int
		if err := s.m.DB.QueryRow(testenv.Context(t), "SELECT count(*) FROM operations").Scan(&ops); err != nil {
			t.Fatal(err)
		}
		if n := s.sandboxCount(); n != 0 || ops != 0 {
			t.Fatalf("%d sandboxes and %d operations stored from bad input", n, ops)
		}
	})

	t.Run("a body that is not declared application/json is a 415", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, e2eOptions{quota: acmeQuota})
		for ct, want := range map[string]int{
			"application/json":                  201,
			"Application/JSON; charset=UTF-8":   201,
			"application/json;charset=utf-8":    201,
			"text/plain":                        415,
			"application/x-www-form-urlencoded": 415,
			"application/jsonp":                 415,
			"application/json; charset=latin1":  415,
			"not a media type;;":                415,
		} {
			r := s.do("POST", "/v1/sandboxes", "acme", pythonBody, "Content-Type", ct)
			if r.StatusCode != want {
				t.Errorf("Content-Type %q = %d %s, want %d", ct, r.StatusCode, r.body, want)
			}
			if want == 415 && r.problem(t).Field != "Content-Type" {
				t.Errorf("Content-Type %q: the 415 does not name the header", ct)
			}
		}
		req, _ := http.NewRequest("POST", s.m.PublicURL()+"/v1/sandboxes", strings.NewReader(pythonBody))
		req.Header.Set(api.HeaderClientID, "acme")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 415 {
			t.Errorf("no Content-Type = %d, want 415", resp.StatusCode)
		}
	})

	t.Run("oversized headers are a 431 problem", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, e2eOptions{})
		r := s.do("GET", "/v1/sandboxes", "acme", "", "X-Padding", strings.Repeat("x", api.DefaultMaxHeaderBytes))
		if p := r.problem(t); r.StatusCode != 431 || p.Code != space.ETOOLARGE {
			t.Fatalf("oversized headers = %d %+v, want a 431 problem", r.StatusCode, p)
		}
	})

	t.Run("the public readyz with postgres and redis down names them and nothing of how", func(t *testing.T) {
		t.Parallel()
		redisSrv := testenv.StartRedis(t)
		var proxy *testenv.Proxy
		s := startServer(t, e2eOptions{config: func(c *config.Config) {
			c.Redis.Addrs = []string{redisSrv.Addr}
			c.DatabaseURL, proxy = testenv.ProxyDatabaseURL(t, c.DatabaseURL)
		}})
		proxy.Cut()
		redisSrv.Stop()
		r := s.do("GET", "/readyz", "", "")
		if r.StatusCode != 503 {
			t.Fatalf("readyz = %d %s, want 503", r.StatusCode, r.body)
		}
		body := string(r.body)
		for _, leak := range []string{"127.0.0.1", "dial", "connect", "refused", "tcp", "pgx", "redis:", "EOF", "timeout"} {
			if strings.Contains(body, leak) {
				t.Errorf("the public readyz says %q: %s", leak, body)
			}
		}
		if !strings.Contains(body, `"postgres":{"status":"unavailable"}`) || !strings.Contains(body, `"redis":{"status":"degraded"}`) {
			t.Errorf("the public readyz does not name what is down: %s", body)
		}
	})

	t.Run("a malformed request line that the handlers see is still a problem", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, e2eOptions{})
		conn, err := net.Dial("tcp", strings.TrimPrefix(s.m.PublicURL(), "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		// A method chi does not route: 405 problem+json, not net/http's text, to a
		// caller it knows (under /v1 the caller is authenticated first, whatever the
		// method: the openapi test's requests that match no operation).
		fmt.Fprintf(conn, "BREW /v1/sandboxes HTTP/1.1\r\nHost: x\r\n%s: acme\r\n\r\n", api.HeaderClientID)
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 405 || resp.Header.Get("Content-Type") != "application/problem+json" {
			t.Fatalf("BREW = %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		// RFC 9110: a 405 lists the methods the path is served with.
		if allow := resp.Header.Get("Allow"); allow != "GET, POST" {
			t.Fatalf("BREW /v1/sandboxes: Allow %q, want \"GET, POST\"", allow)
		}
		// A caller it does not know is told that first, not the path's methods.
		fmt.Fprintf(conn, "BREW /v1/sandboxes HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err = http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 401 || resp.Header.Get("Allow") != "" {
			t.Fatalf("BREW /v1/sandboxes with no identity = %d, Allow %q; want 401 and no Allow", resp.StatusCode, resp.Header.Get("Allow"))
		}
	})
}

// FuzzWholeStack drives create, restore and list through the whole stack (router,
// identity, handlers, the sandbox flow, Postgres, Redis) with arbitrary bodies, ids,
// query strings, client ids and idempotency keys: every answer must be 2xx or 4xx,
// never 5xx. Each fuzz worker is a process of its own that starts one server.
//
// fuzztime: 3000x
func FuzzWholeStack(f *testing.F) {
	for _, seed := range []struct{ body, id, query, client, key string }{
		{pythonBody, "00000000-0000-4000-8000-000000000001", "limit=5", "acme", "k1"},
		{`{"template":"python-3.12","cpu_millis":2147483648,"memory_mib":1,"disk_gib":1}`, "nope", "limit=0", "initech", ""},
		{`{"template":"py\u0000","cpu_millis":1,"memory_mib":1,"disk_gib":1}`, "%00", "page_token=%ff", "a,b", "\x00"},
		{"{\"template\":\"python-3.12\",\"metadata\":{\"k\":\"\xff\"}}", "", "limit=99999999999999999999", "unknown", strings.Repeat("k", 300)},
		{`{"template":"node-22","cpu_millis":1,"memory_mib":1,"disk_gib":1,"metadata":{"a\u0000":"b"}}`, "00000000-0000-4000-8000-00000000000g", "page_token=eyJ0IjoieCJ9", "hooli", "k2"},
		// Found in CI: a raw query with a space, which the client sends unescaped.
		{"", "", " ", "", ""},
	} {
		f.Add(seed.body, seed.id, seed.query, seed.client, seed.key)
	}
	cfg := testConfig(f)
	cfg.Flags.File = testenv.WriteFile(f, "flags.json", quotaFlags(`{"clients": {"acme": {"concurrency": 1000, "live_sandboxes": 100000}},
		"default": {"concurrency": 1000, "live_sandboxes": 100000}}`, ""))
	m := startMain(f, cfg)
	base := m.PublicURL()
	f.Fuzz(func(t *testing.T, body, id, query, client, key string) {
		asAcme := map[string]string{"Content-Type": "application/json", api.HeaderClientID: "acme"}
		fuzzRequest(t, base, "POST", "/v1/sandboxes", body, asAcme)
		fuzzRequest(t, base, "POST", "/v1/sandboxes", body, map[string]string{
			"Content-Type": "application/json", api.HeaderClientID: client, "Prefer": async, "Idempotency-Key": key})
		fuzzRequest(t, base, "POST", "/v1/sandboxes/"+url.PathEscape(id)+"/restore", "", asAcme)
		fuzzRequest(t, base, "POST", "/v1/sandboxes/"+url.PathEscape(id)+"/restore", "", map[string]string{
			api.HeaderClientID: client, "Prefer": async, "Idempotency-Key": key})
		fuzzRequest(t, base, "GET", "/v1/sandboxes?"+query, "", map[string]string{api.HeaderClientID: client})
		fuzzRequest(t, base, "GET", "/v1/operations/"+url.PathEscape(id), "", asAcme)
	})
}

// fuzzRequest sends one request of FuzzWholeStack and fails t on a 5xx. A request the
// client library refuses to build or send (an invalid URL or header value) is not the
// server's to answer, and is skipped. So is a request target with a space in it: Go's
// client writes a raw query as it is, the request line then has more than three parts,
// and net/http answers its own plain "400 Bad Request" before any handler runs (a
// framing error, like a bad header line, that no route of ours sees).
func fuzzRequest(t *testing.T, base, method, path, body string, header map[string]string) {
	t.Helper()
	req, err := http.NewRequest(method, base+path, strings.NewReader(body))
	if err != nil || strings.ContainsRune(req.URL.RequestURI(), ' ') {
		return
	}
	for k, v := range header {
		if !httpguts.ValidHeaderFieldValue(v) {
			return
		}
		req.Header.Set(k, v)
	}
	resp, err := fuzzClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode >= 500 {
		t.Fatalf("%s %s (body %q, headers %q) = %d %s", method, path, body, header, resp.StatusCode, b)
	}
}

var fuzzClient = &http.Client{Timeout: 30 * time.Second, Transport: openAPITransport(http.DefaultTransport, checkAnswersOnly)}
