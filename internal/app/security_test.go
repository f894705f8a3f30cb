package app

import (
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/admission"
	"github.com/space-sandbox/space/internal/api"
	"github.com/space-sandbox/space/internal/config"
	"github.com/space-sandbox/space/internal/testenv"
)

// keyServer starts a server in api_key mode with acme and globex allowlisted, each
// with a rate of its own.
func keyServer(t *testing.T, tweak func(*config.Config)) *server {
	t.Helper()
	return startServer(t, e2eOptions{quota: acmeQuota, config: func(c *config.Config) {
		c.Auth = config.Default().Auth
		if tweak != nil {
			tweak(c)
		}
	}})
}

func (s *server) key(client string) string {
	s.t.Helper()
	_, secret, err := s.m.Keys.Create(testenv.Context(s.t), client, "test")
	if err != nil {
		s.t.Fatal(err)
	}
	return secret
}

func bearer(secret string) []string { return []string{"Authorization", "Bearer " + secret} }

func TestAPIKeys(t *testing.T) {
	t.Parallel()

	t.Run("a request is charged to its key's client, not to the X-Client-ID it sends", func(t *testing.T) {
		t.Parallel()
		s := keyServer(t, nil)
		acmeKey := s.key("acme")
		globexKey := admission.ClientKey(s.m.RedisPrefix, "globex")
		_, a0 := s.tokens("acme", acmeRate)
		r := s.do("POST", "/v1/sandboxes", "globex", pythonBody, bearer(acmeKey)...)
		if r.StatusCode != 201 {
			t.Fatalf("create = %d %s", r.StatusCode, r.body)
		}
		var sb space.Sandbox
		r.json(t, &sb)
		_, a1 := s.tokens("acme", acmeRate)
		if sb.Client != "acme" || !near(a0-a1, 1) {
			t.Fatalf("sandbox of %q, acme tokens %v -> %v; want acme charged", sb.Client, a0, a1)
		}
		if s.exists(globexKey) {
			t.Fatal("globex's bucket was written: the header was believed")
		}
		// And globex cannot see it, even by claiming to be acme.
		if r := s.do("GET", "/v1/sandboxes/"+sb.ID, "acme", "", bearer(s.key("globex"))...); r.StatusCode != 404 {
			t.Fatalf("globex reading acme's sandbox = %d, want 404", r.StatusCode)
		}
	})

	t.Run("a key of a client off the allowlist acts as unknown", func(t *testing.T) {
		t.Parallel()
		s := keyServer(t, nil)
		var limits api.LimitsBody
		s.do("GET", "/v1/limits", "", "", bearer(s.key("initech"))...).json(t, &limits)
		if limits.Client != space.Unknown || limits.Allowlisted {
			t.Fatalf("limits = %+v, want unknown", limits)
		}
	})

	t.Run("missing, malformed, unknown and revoked keys are 401 with a Bearer challenge", func(t *testing.T) {
		t.Parallel()
		s := keyServer(t, nil)
		revoked := s.key("acme")
		keys, _ := s.m.Keys.List(testenv.Context(t))
		if err := s.m.Keys.Revoke(testenv.Context(t), keys[0].ID); err != nil {
			t.Fatal(err)
		}
		for name, header := range map[string][]string{
			"missing":    nil,
			"not bearer": {"Authorization", "Basic YWNtZTpodW50ZXIy"},
			"malformed":  {"Authorization", "Bearer not a key"},
			"unknown":    bearer("spk_" + strings.Repeat("A", 43)),
			"revoked":    bearer(revoked),
		} {
			r := s.do("GET", "/v1/sandboxes", "acme", "", header...)
			p := r.problem(t)
			if r.StatusCode != 401 || p.Code != space.EUNAUTHORIZED || !strings.HasPrefix(r.Header.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("%s key: %d %+v challenge %q", name, r.StatusCode, p, r.Header.Get("WWW-Authenticate"))
			}
		}
	})

	t.Run("a revoked key is refused by the next request on every replica", func(t *testing.T) {
		t.Parallel()
		one := keyServer(t, nil)
		cfg := one.m.Config
		cfg.HTTPAddr, cfg.InternalHTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
		two := &server{t: t, m: startMain(t, cfg)}
		secret := one.key("acme")
		for _, s := range []*server{one, two} {
			if r := s.do("GET", "/v1/sandboxes", "", "", bearer(secret)...); r.StatusCode != 200 {
				t.Fatalf("before revoke = %d", r.StatusCode)
			}
		}
		keys, _ := one.m.Keys.List(testenv.Context(t))
		if err := one.m.Keys.Revoke(testenv.Context(t), keys[0].ID); err != nil {
			t.Fatal(err)
		}
		for i, s := range []*server{one, two} {
			if r := s.do("GET", "/v1/sandboxes", "", "", bearer(secret)...); r.StatusCode != 401 {
				t.Fatalf("replica %d after revoke = %d, want 401", i+1, r.StatusCode)
			}
		}
	})

	t.Run("ten thousand wrong keys from one address are throttled after the burst and leave one Redis key", func(t *testing.T) {
		t.Parallel()
		s := keyServer(t, func(c *config.Config) { c.Auth.FailureRate = space.Rate{RefillRPS: 1e-6, Burst: 20} })
		good := s.key("acme")
		var mu sync.Mutex
		codes := map[int]int{}
		var wg sync.WaitGroup
		work := make(chan int)
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range work {
					wrong := "spk_" + strings.Repeat("B", 38) + strings.Repeat("0", 5-len(itoa(i))) + itoa(i)
					r := s.do("GET", "/v1/sandboxes", "", "", bearer(wrong)...)
					mu.Lock()
					codes[r.StatusCode]++
					mu.Unlock()
				}
			}()
		}
		for i := range 10000 {
			work <- i
		}
		close(work)
		wg.Wait()
		if codes[401] != 20 || codes[429] != 9980 {
			t.Fatalf("status counts %v, want 20 401s then 9980 429s", codes)
		}
		keys, err := s.m.Redis.Keys(testenv.Context(t), s.m.RedisPrefix+":auth_failures:*").Result()
		if err != nil || len(keys) != 1 {
			t.Fatalf("auth failure keys = %v (%v), want exactly one", keys, err)
		}
		r := s.do("GET", "/v1/sandboxes", "", "", bearer(good)...)
		if r.StatusCode != 429 || r.problem(t).Bucket != space.BucketAuthFailures {
			t.Fatalf("a throttled address with a good key = %d %s: it must wait like the guesser", r.StatusCode, r.body)
		}
	})
}

func itoa(i int) string {
	const digits = "0123456789"
	if i == 0 {
		return "0"
	}
	var b []byte
	for ; i > 0; i /= 10 {
		b = append([]byte{digits[i%10]}, b...)
	}
	return string(b)
}

func TestTrustedHeader(t *testing.T) {
	t.Parallel()

	t.Run("an untrusted peer gets 401, creates nothing and is counted", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, e2eOptions{quota: acmeQuota, config: func(c *config.Config) {
			c.Auth.TrustedProxyCIDRs = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")} // not us
		}})
		for _, c := range []struct{ method, path, client, body string }{
			{"POST", "/v1/sandboxes", "acme", pythonBody},
			{"POST", "/v1/sandboxes", "", pythonBody},
			{"GET", "/v1/limits", "acme", ""},
		} {
			r := s.do(c.method, c.path, c.client, c.body)
			if p := r.problem(t); r.StatusCode != 401 || p.Code != space.EUNAUTHORIZED {
				t.Errorf("%s %s from an untrusted peer = %d %+v, want 401", c.method, c.path, r.StatusCode, p)
			}
		}
		if n := s.sandboxCount(); n != 0 {
			t.Fatalf("%d sandboxes were created for unauthenticated callers", n)
		}
		metrics := s.internal("GET", "/metrics", "")
		if !strings.Contains(string(metrics.body), "space_auth_untrusted_client_id_total 3") {
			t.Fatal("the refused requests were not counted")
		}
	})

	t.Run("a trusted peer without X-Client-ID gets 401 and creates nothing", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, e2eOptions{quota: acmeQuota})
		r := s.do("POST", "/v1/sandboxes", "", pythonBody)
		if p := r.problem(t); r.StatusCode != 401 || !strings.Contains(p.Detail, "X-Client-ID") {
			t.Fatalf("no X-Client-ID = %d %+v, want 401", r.StatusCode, p)
		}
		if n := s.sandboxCount(); n != 0 {
			t.Fatalf("%d sandboxes were created for an unauthenticated caller", n)
		}
	})

	t.Run("several or comma-joined X-Client-ID fields, or a malformed one, are a 400 naming the header", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, e2eOptions{quota: acmeQuota})
		for name, header := range map[string][]string{
			"two fields":         {"acme", "globex"},
			"a comma list":       {"initech, acme"},
			"a space":            {"ac me"},
			"the reserved id":    {"unknown"},
			"too long":           {strings.Repeat("a", space.MaxClientIDLen+1)},
			"a non-ASCII letter": {"acmé"},
		} {
			req, err := http.NewRequest("POST", s.m.PublicURL()+"/v1/sandboxes", strings.NewReader(pythonBody))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header[api.HeaderClientID] = header
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			r := response{resp, body}
			if p := r.problem(t); r.StatusCode != 400 || p.Field != api.HeaderClientID {
				t.Errorf("%s: %d %+v, want 400 naming %s", name, r.StatusCode, p, api.HeaderClientID)
			}
		}
		if n := s.sandboxCount(); n != 0 {
			t.Fatalf("%d sandboxes were created from refused headers", n)
		}
	})

	t.Run("the header from a trusted peer names an allowlisted client", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, e2eOptions{quota: acmeQuota})
		var limits api.LimitsBody
		s.do("GET", "/v1/limits", "acme", "").json(t, &limits)
		if limits.Client != "acme" || !limits.Allowlisted {
			t.Fatalf("limits = %+v", limits)
		}
	})
}

func TestListeners(t *testing.T) {
	t.Parallel()

	t.Run("internal routes and metrics are 404 on the public listener in both modes", func(t *testing.T) {
		t.Parallel()
		for _, s := range []*server{keyServer(t, nil), startServer(t, e2eOptions{})} {
			for _, path := range []string{"/metrics", "/internal/v1/sandboxes/00000000-0000-4000-8000-000000000001/wake"} {
				method := "GET"
				if strings.HasSuffix(path, "wake") {
					method = "POST"
				}
				if r := s.do(method, path, "", ""); r.StatusCode != 404 {
					t.Errorf("public %s %s = %d, want 404", method, path, r.StatusCode)
				}
			}
			if r := s.internal("GET", "/metrics", ""); r.StatusCode != 200 {
				t.Errorf("internal /metrics = %d", r.StatusCode)
			}
		}
	})

	t.Run("a client that trickles its headers is cut off", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig(t)
		m := NewMain(cfg, NewLogger(io.Discard, "error"))
		m.RedisPrefix = testenv.Prefix(t)
		m.readHeaderTimeout = 300 * time.Millisecond
		if err := m.Run(testenv.Context(t)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		conn, err := net.Dial("tcp", strings.TrimPrefix(m.PublicURL(), "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\n"); err != nil {
			t.Fatal(err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		start := time.Now()
		b, _ := io.ReadAll(conn) // the server answers 408 or just closes
		if time.Since(start) > 5*time.Second {
			t.Fatalf("the connection was held for %v", time.Since(start))
		}
		if len(b) > 0 && !strings.Contains(string(b), "408") {
			t.Fatalf("the server answered a half request: %q", b)
		}
	})

	t.Run("a header block over the limit is refused", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, e2eOptions{})
		r := s.do("GET", "/healthz", "", "", "X-Padding", strings.Repeat("x", 64<<10))
		if r.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Fatalf("64 KiB of headers = %d, want 431", r.StatusCode)
		}
	})
}
