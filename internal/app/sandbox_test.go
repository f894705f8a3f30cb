package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/admission"
	"github.com/space-sandbox/space/internal/api"
	"github.com/space-sandbox/space/internal/config"
	"github.com/space-sandbox/space/internal/redisconn"
	"github.com/space-sandbox/space/internal/testenv"
)

// quotaFlags renders a flags file holding the quota flag value and warm pool shapes.
func quotaFlags(quota string, poolShapes string) string {
	if poolShapes == "" {
		poolShapes = "[]"
	}
	return fmt.Sprintf(`{"flags": {
		"space-api-client-concurrency-quotas": {"state": "ENABLED", "variants": {"on": %s}, "defaultVariant": "on"},
		"space-api-warm-pool": {"state": "ENABLED", "variants": {"on": {"shapes": %s}}, "defaultVariant": "on"}
	}}`, quota, poolShapes)
}

const pythonBody = `{"template":"python-3.12","cpu_millis":1000,"memory_mib":2048,"disk_gib":10}`

// pythonShape is the shape of pythonBody.
var pythonShape = space.Shape{Template: "python-3.12", CPUMillis: 1000, MemoryMiB: 2048, DiskGiB: 10}

// server is a Main under test with a client that speaks for any client id.
type server struct {
	t *testing.T
	m *Main

	readerOnce     sync.Once // reader
	readerAdmitter *admission.Admitter
	readerErr      error
}

type e2eOptions struct {
	quota      string // the quota flag's value; "" = no flags file
	poolShapes string
	config     func(*config.Config)
}

func startServer(t *testing.T, o e2eOptions) *server {
	t.Helper()
	cfg := testConfig(t)
	// Buckets that barely refill: what a test takes stays taken for its duration.
	cfg.Admission.Cluster = space.Rate{RefillRPS: 1e-6, Burst: 1000}
	if o.quota != "" {
		cfg.Flags.File = testenv.WriteFile(t, "flags.json", quotaFlags(o.quota, o.poolShapes))
		cfg.Flags.PollInterval = 10 * time.Millisecond
	}
	if o.config != nil {
		o.config(&cfg)
	}
	return &server{t: t, m: startMain(t, cfg)}
}

type response struct {
	*http.Response
	body []byte
}

func (r response) json(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decode %s: %v", r.body, err)
	}
}

func (r response) problem(t *testing.T) api.Problem {
	t.Helper()
	if ct := r.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("content type %q, want application/problem+json (status %d, body %s)", ct, r.StatusCode, r.body)
	}
	var p api.Problem
	r.json(t, &p)
	return p
}

func (s *server) request(base, method, path, client, body string, header ...string) response {
	s.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, base+path, rd)
	if err != nil {
		s.t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if client != "" {
		req.Header.Set(api.HeaderClientID, client)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return response{resp, b}
}

// retryAtLeast is the least Retry-After, in whole seconds, of a refusal by a bucket
// that was empty at emptied and needs refill for its next token: the refill left since
// (a loaded machine can take seconds between two requests), a hundredth of a second
// less for Redis's clock against this one, and never under the one second every
// Retry-After is at least (admission.RetryAfter), however long the machine stalled.
func retryAtLeast(refill time.Duration, emptied time.Time) int {
	return max(1, int(math.Ceil((refill-time.Since(emptied)).Seconds()-0.01)))
}

func (s *server) do(method, path, client, body string, header ...string) response {
	s.t.Helper()
	return s.request(s.m.PublicURL(), method, path, client, body, header...)
}

func (s *server) internal(method, path, body string) response {
	s.t.Helper()
	return s.request(s.m.InternalURL(), method, path, "", body)
}

// create makes a sandbox of client's with body (and header pairs), which must answer
// 201, and returns it.
func (s *server) create(client, body string, header ...string) *space.Sandbox {
	s.t.Helper()
	resp := s.do("POST", "/v1/sandboxes", client, body, header...)
	if resp.StatusCode != http.StatusCreated {
		s.t.Fatalf("create = %d %s", resp.StatusCode, resp.body)
	}
	var sb space.Sandbox
	resp.json(s.t, &sb)
	return &sb
}

// tokens reads a bucket's remaining tokens with a Report (which takes none) of an
// Admitter of the test's own: the server's Admitter bounds each Redis call by the
// tests' 2 s, and a machine loaded with a first run's build can take longer than that
// to schedule one read. A reading is not a decision: the test waits for it (within
// testenv.Context's bound), on a client and breaker of its own.
func (s *server) tokens(client space.ClientKey, rate *space.Rate) (cluster, own float64) {
	s.t.Helper()
	d, _, err := s.reader().Report(testenv.Context(s.t), space.Charge{Key: client, Rate: rate, Cost: 1})
	if err != nil {
		s.t.Fatal(err)
	}
	cluster = d.Cluster.Remaining
	if d.Client != nil {
		own = d.Client.Remaining
	}
	return cluster, own
}

// reader is the Admitter tokens reads with: the server's buckets, reservations and
// prefix, a Redis client of the test's own, and a minute for each call.
func (s *server) reader() *admission.Admitter {
	s.t.Helper()
	s.readerOnce.Do(func() {
		cfg := s.m.Config
		rc := cfg.Redis
		rc.Timeout = time.Minute
		rdb, err := redisconn.Open(testenv.Context(s.t), rc, slog.New(slog.DiscardHandler))
		if err != nil {
			s.readerErr = err
			return
		}
		s.t.Cleanup(func() { rdb.Close() })
		s.readerAdmitter, s.readerErr = admission.New(admission.Options{
			Redis:        rdb,
			Prefix:       s.m.RedisPrefix,
			Enabled:      cfg.Admission.Enabled,
			Cluster:      cfg.Admission.Cluster,
			FailClosed:   true, // a failed reading must fail the test, not read as full buckets
			Timeout:      time.Minute,
			Reservations: s.m.Resolver.Reservations,
		})
	})
	if s.readerErr != nil {
		s.t.Fatalf("the test's reader of the buckets: %v", s.readerErr)
	}
	return s.readerAdmitter
}

// rawBuckets reads the bucket keys themselves: "untouched" means byte for byte. An
// error other than a missing key fails the test: two unreadable readings compare
// equal, and must not pass for "untouched".
func (s *server) rawBuckets(client space.ClientKey) string {
	s.t.Helper()
	raw, err := readBuckets(testenv.Context(s.t), s.m.Redis, admission.ClusterKey(s.m.RedisPrefix), admission.ClientKey(s.m.RedisPrefix, client))
	if err != nil {
		s.t.Fatalf("read the buckets: %v", err)
	}
	return raw
}

// readBuckets reads keys as "key=value" pairs, a missing key as an empty value.
func readBuckets(ctx context.Context, rdb redis.UniversalClient, keys ...string) (string, error) {
	var out []string
	for _, k := range keys {
		v, err := rdb.Get(ctx, k).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return "", fmt.Errorf("GET %s: %w", k, err)
		}
		out = append(out, k+"="+v)
	}
	return strings.Join(out, " "), nil
}

// metric is the value of the series of name whose labels hold every one of labels
// (each `name="value"`), summed, from the internal listener's /metrics.
func (s *server) metric(name string, labels ...string) float64 {
	s.t.Helper()
	body := string(s.internal("GET", "/metrics", "").body)
	var sum float64
	found := false
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		match := true
		for _, l := range labels {
			match = match && strings.Contains(line, l)
		}
		if !match {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndex(line, " ")+1:], 64)
		if err != nil {
			s.t.Fatalf("metric line %q: %v", line, err)
		}
		sum += v
		found = true
	}
	if !found {
		s.t.Fatalf("no series %s{%s} in /metrics", name, strings.Join(labels, ","))
	}
	return sum
}

// knownCold waits until the replica's pool view knows shape cold, as a refusal from
// memory needs (sandbox.Service.refuseFromMemory). The view is a loop of its own, started
// with the server, and tells nothing until its first sync: until then every refusal
// asks Redis.
func (s *server) knownCold(shape space.Shape) {
	s.t.Helper()
	testenv.Eventually(s.t, 30*time.Second, "the pool view to know "+shape.String()+" cold", func() bool {
		return s.m.PoolView.Cold(shape)
	})
}

// sandboxCount counts every sandbox row, whoever's and in whatever state.
func (s *server) sandboxCount() int {
	s.t.Helper()
	var n int
	if err := s.m.DB.QueryRow(testenv.Context(s.t), "SELECT count(*) FROM sandboxes").Scan(&n); err != nil {
		s.t.Fatal(err)
	}
	return n
}

func TestBucketReadingsFailLoudly(t *testing.T) {
	t.Parallel()
	redisSrv := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: redisSrv.Addr})
	t.Cleanup(func() { rdb.Close() })
	ctx := testenv.Context(t)
	if raw, err := readBuckets(ctx, rdb, "missing"); err != nil || raw != "missing=" {
		t.Fatalf("a missing key reads as %q, %v; want empty", raw, err)
	}
	redisSrv.Stop()
	// The warm-hit and cold-shape tests compare two readings; with Redis stopped both
	// would be empty and equal, so a reading must fail instead.
	if raw, err := readBuckets(ctx, rdb, "any"); err == nil {
		t.Fatalf("with redis stopped the buckets read as %q and no error", raw)
	}
}

func near(a, b float64) bool { return math.Abs(a-b) < 0.01 }

const acmeQuota = `{"clients": {"acme": {"concurrency": 50, "live_sandboxes": 100}, "globex": {}},
	"default": {"concurrency": 50, "live_sandboxes": 100},
	"rate": {"acme": {"refill_rps": 0.000001, "burst": 5}, "globex": {"refill_rps": 0.000001, "burst": 1}, "unknown": {"refill_rps": 0.000001, "burst": 1}}}`

var acmeRate = &space.Rate{RefillRPS: 0.000001, Burst: 5}

func TestSandboxAPI(t *testing.T) {
	t.Parallel()

	t.Run("a warm hit leaves both activation buckets untouched", func(t *testing.T) {
		t.Parallel()
		// The test warms the pool itself, round by round: a background round refilling
		// the claimed slot would (rightly) charge the cluster bucket in the middle of
		// the reading.
		cfg := testConfig(t)
		cfg.Admission.Cluster = space.Rate{RefillRPS: 1e-6, Burst: 1000}
		cfg.Flags.File = testenv.WriteFile(t, "flags.json", quotaFlags(acmeQuota,
			`[{"template":"python-3.12","cpu_millis":1000,"memory_mib":2048,"disk_gib":10,"target":1}]`))
		m := NewMain(cfg, NewLogger(io.Discard, "error"))
		m.RedisPrefix = testenv.Prefix(t)
		m.noReplenisher = true
		if err := m.Run(testenv.Context(t)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		s := &server{t: t, m: m}
		if res, err := m.Replenisher.Round(testenv.Context(t)); err != nil || res.Warmed != 1 {
			t.Fatalf("warm the pool: %+v %v", res, err)
		}
		s.create("acme", `{"template":"node-22","cpu_millis":1,"memory_mib":1,"disk_gib":1}`) // create the client key
		before := s.rawBuckets("acme")
		sb := s.create("acme", pythonBody)
		if !sb.Warm {
			t.Fatalf("sandbox %+v is not warm", sb)
		}
		if after := s.rawBuckets("acme"); after != before {
			t.Fatalf("a warm hit changed the buckets:\n before %s\n after  %s", before, after)
		}
	})

	t.Run("a cold create takes exactly one token from each bucket", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, e2eOptions{quota: acmeQuota})
		c0, a0 := s.tokens("acme", acmeRate)
		s.create("acme", pythonBody)
		c1, a1 := s.tokens("acme", acmeRate)
		if !near(c0-c1, 1) || !near(a0-a1, 1) {
			t.Fatalf("cluster %v -> %v, acme %v -> %v; want one token from each", c0, c1, a0, a1)
		}
	})

	t.Run("a restore takes one token from each bucket, and a wake charges the owner", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, e2eOptions{quota: acmeQuota})
		sb := s.create("acme", pythonBody)
		if r := s.do("POST", "/v1/sandboxes/"+sb.ID+"/pause", "acme", ""); r.StatusCode != 200 {
			t.Fatalf("pause = %d %s", r.StatusCode, r.body)
		}
		c0, a0 := s.tokens("acme", acmeRate)
		if r := s.do("POST", "/v1/sandboxes/"+sb.ID+"/restore", "acme", ""); r.StatusCode != 200 {
			t.Fatalf("restore = %d %s", r.StatusCode, r.body)
		}
		c1, a1 := s.tokens("acme", acmeRate)
		if !near(c0-c1, 1) || !near(a0-a1, 1) {
			t.Fatalf("restore: cluster %v -> %v, acme %v -> %v", c0, c1, a0, a1)
		}
		s.do("POST", "/v1/sandboxes/"+sb.ID+"/pause", "acme", "")
		unknownRate := &space.Rate{RefillRPS: 0.000001, Burst: 1}
		_, u0 := s.tokens(space.Unknown, unknownRate)
		r := s.internal("POST", "/internal/v1/sandboxes/"+sb.ID+"/wake", "")
		if r.StatusCode != 200 {
			t.Fatalf("wake = %d %s", r.StatusCode, r.body)
		}
		_, a2 := s.tokens("acme", acmeRate)
		_, u1 := s.tokens(space.Unknown, unknownRate)
		if !near(a1-a2, 1) || u1 != u0 {
			t.Fatalf("wake: acme %v -> %v, unknown %v -> %v; want it on acme alone", a1, a2, u0, u1)
		}
	})

	t.Run("a create whose cold shape does not resolve charges no bucket", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, e2eOptions{quota: acmeQuota})
		s.create("acme", pythonBody)
		before := s.rawBuckets("acme")
		r := s.do("POST", "/v1/sandboxes", "acme", `{"template":"python-3.12","cpu_millis":1000,"memory_mib":2048,"disk_gib":51}`)
		if p := r.problem(t); r.StatusCode != 422 || p.Field != "disk_gib" {
			t.Fatalf("over the cap = %d %+v, want 422 naming disk_gib", r.StatusCode, p)
		}
		if after := s.rawBuckets("acme"); after != before {
			t.Fatalf("an unresolvable shape was charged:\n before %s\n after  %s", before, after)
		}
	})

	t.Run("bad input is a problem naming the field and charges nothing", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, e2eOptions{quota: acmeQuota, config: func(c *config.Config) { c.Sandbox.MaxBodyBytes = 512 }})
		s.create("acme", pythonBody)
		before := s.rawBuckets("acme")
		for _, tc := range []struct {
			name, body string
			status     int
			field      string
		}{
			{"malformed JSON", `{"template":`, 400, "body"},
			{"an unknown field", `{"template":"python-3.12","cpu_millis":1,"memory_mib":1,"disk_gib":1,"gpu":1}`, 400, "gpu"},
			{"a string for a number", `{"template":"python-3.12","cpu_millis":"lots","memory_mib":1,"disk_gib":1}`, 400, "cpu_millis"},
			{"a zero size", `{"template":"python-3.12","cpu_millis":1,"memory_mib":0,"disk_gib":1}`, 400, "memory_mib"},
			{"a negative size", `{"template":"python-3.12","cpu_millis":-5,"memory_mib":1,"disk_gib":1}`, 400, "cpu_millis"},
			{"no template", `{"cpu_millis":1,"memory_mib":1,"disk_gib":1}`, 400, "template"},
			{"two objects", pythonBody + pythonBody, 400, "body"},
			{"a body over the limit", `{"template":"python-3.12","cpu_millis":1,"memory_mib":1,"disk_gib":1,"metadata":{"k":"` + strings.Repeat("x", 600) + `"}}`, 400, "body"},
			{"an unknown template", `{"template":"cobol","cpu_millis":1,"memory_mib":1,"disk_gib":1}`, 422, "template"},
			{"cpu over the cap", `{"template":"node-22","cpu_millis":16001,"memory_mib":1,"disk_gib":1}`, 422, "cpu_millis"},
		} {
			r := s.do("POST", "/v1/sandboxes", "acme", tc.body)
			p := r.problem(t)
			if r.StatusCode != tc.status || p.Field != tc.field || p.Status != tc.status || p.Detail == "" {
				t.Errorf("%s: %d %+v; want %d naming %s", tc.name, r.StatusCode, p, tc.status, tc.field)
			}
		}
		if after := s.rawBuckets("acme"); after != before {
			t.Fatalf("bad input was charged:\n before %s\n after  %s", before, after)
		}
		var n int
		if err := s.m.DB.QueryRow(testenv.Context(t), "SELECT count(*) FROM sandboxes").Scan(&n); err != nil || n != 1 {
			t.Fatalf("%d sandboxes (%v), want only the first", n, err)
		}
	})

	t.Run("an empty client bucket is a 429 naming the client with a Retry-After no earlier than its refill", func(t *testing.T) {
		t.Parallel()
		// globex refills one token every 4 seconds.
		s := startServer(t, e2eOptions{quota: strings.Replace(acmeQuota, `"globex": {"refill_rps": 0.000001, "burst": 1}`, `"globex": {"refill_rps": 0.25, "burst": 1}`, 1)})
		emptied := time.Now() // the bucket's one token goes with the next create
		s.create("globex", pythonBody)
		r := s.do("POST", "/v1/sandboxes", "globex", pythonBody)
		p := r.problem(t)
		if r.StatusCode != 429 || p.Bucket != space.BucketClientActivation || p.Client != "globex" || !strings.Contains(p.Detail, `"globex"`) || !strings.Contains(p.Detail, "slow down") {
			t.Fatalf("429 = %d %+v", r.StatusCode, p)
		}
		// No earlier than the refill left since the bucket emptied (retryAtLeast).
		retry, err := strconv.Atoi(r.Header.Get("Retry-After"))
		if least := retryAtLeast(4*time.Second, emptied); err != nil || retry < least {
			t.Fatalf("Retry-After = %q, want whole seconds >= the %d s of the 4 s refill left", r.Header.Get("Retry-After"), least)
		}
		if pol := r.Header.Get("RateLimit-Policy"); pol != `"client_activation";q=1;w=4` {
			t.Errorf("RateLimit-Policy = %q", pol)
		}
		if rl := r.Header.Get("RateLimit"); !strings.HasPrefix(rl, `"client_activation";r=0;t=`) {
			t.Errorf("RateLimit = %q", rl)
		}
	})

	t.Run("an empty cluster bucket alone says the cluster is at capacity", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, e2eOptions{quota: acmeQuota, config: func(c *config.Config) {
			c.Admission.Cluster = space.Rate{RefillRPS: 1e-6, Burst: 1}
		}})
		s.create("acme", pythonBody)
		r := s.do("POST", "/v1/sandboxes", "acme", pythonBody)
		p := r.problem(t)
		if r.StatusCode != 429 || p.Bucket != space.BucketClusterActivation || !strings.Contains(p.Detail, "cluster is at its sandbox activation capacity") {
			t.Fatalf("429 = %d %+v", r.StatusCode, p)
		}
	})

	t.Run("both buckets empty names the client bucket", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, e2eOptions{quota: acmeQuota, config: func(c *config.Config) {
			c.Admission.Cluster = space.Rate{RefillRPS: 1e-6, Burst: 1}
		}})
		s.create("globex", pythonBody) // empties globex's bucket (burst 1) and the cluster's
		r := s.do("POST", "/v1/sandboxes", "globex", pythonBody)
		if p := r.problem(t); r.StatusCode != 429 || p.Bucket != space.BucketClientActivation || p.Client != "globex" {
			t.Fatalf("429 = %d %+v", r.StatusCode, p)
		}
	})

	t.Run("unknown callers are told they share one rate", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, e2eOptions{quota: acmeQuota})
		s.create("someone-not-allowlisted", pythonBody)
		r := s.do("POST", "/v1/sandboxes", "initech", pythonBody)
		p := r.problem(t)
		if r.StatusCode != 429 || p.Client != space.Unknown || !strings.Contains(p.Detail, "without an allowlisted X-Client-ID share this rate") {
			t.Fatalf("429 = %d %+v", r.StatusCode, p)
		}
	})

	t.Run("the live cap holds under concurrent creates and a pause frees a place", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, e2eOptions{quota: `{"clients": {"acme": {"live_sandboxes": 3, "concurrency": 100}}, "rate": {"acme": null}}`})
		var wg sync.WaitGroup
		var mu sync.Mutex
		codes := map[int]int{}
		var created []string
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := s.do("POST", "/v1/sandboxes", "acme", pythonBody)
				mu.Lock()
				defer mu.Unlock()
				codes[r.StatusCode]++
				if r.StatusCode == 201 {
					var sb space.Sandbox
					r.json(t, &sb)
					created = append(created, sb.ID)
				} else if p := r.problem(t); p.Bucket != space.BucketLiveSandboxCap {
					t.Errorf("rejection names %q, want live_sandbox_cap", p.Bucket)
				}
			}()
		}
		wg.Wait()
		if codes[201] != 3 || codes[429] != 5 {
			t.Fatalf("status counts %v, want 3 created and 5 refused", codes)
		}
		if r := s.do("POST", "/v1/sandboxes/"+created[0]+"/pause", "acme", ""); r.StatusCode != 200 {
			t.Fatalf("pause = %d", r.StatusCode)
		}
		s.create("acme", pythonBody)
	})

	t.Run("a client sees only its own sandboxes, and transitions the state forbids are 409", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, e2eOptions{quota: `{"clients": {"acme": {}, "globex": {}}}`})
		sb := s.create("acme", pythonBody)
		for _, c := range []struct{ method, path string }{
			{"GET", "/v1/sandboxes/" + sb.ID},
			{"POST", "/v1/sandboxes/" + sb.ID + "/pause"},
			{"POST", "/v1/sandboxes/" + sb.ID + "/restore"},
			{"DELETE", "/v1/sandboxes/" + sb.ID},
		} {
			if r := s.do(c.method, c.path, "globex", ""); r.StatusCode != 404 {
				t.Errorf("globex %s %s = %d, want 404", c.method, c.path, r.StatusCode)
			}
		}
		var page struct{ Sandboxes []space.Sandbox }
		s.do("GET", "/v1/sandboxes", "globex", "").json(t, &page)
		if len(page.Sandboxes) != 0 {
			t.Fatalf("globex lists %d sandboxes", len(page.Sandboxes))
		}
		if r := s.do("POST", "/v1/sandboxes/"+sb.ID+"/restore", "acme", ""); r.StatusCode != 409 {
			t.Fatalf("restore of a running sandbox = %d, want 409", r.StatusCode)
		}
		s.do("POST", "/v1/sandboxes/"+sb.ID+"/pause", "acme", "")
		if r := s.do("POST", "/v1/sandboxes/"+sb.ID+"/pause", "acme", ""); r.StatusCode != 409 {
			t.Fatalf("pause of a paused sandbox = %d, want 409", r.StatusCode)
		}
		if r := s.do("DELETE", "/v1/sandboxes/"+sb.ID, "acme", ""); r.StatusCode != 204 {
			t.Fatalf("delete = %d", r.StatusCode)
		}
		var got space.Sandbox
		s.do("GET", "/v1/sandboxes/"+sb.ID, "acme", "").json(t, &got)
		if got.State != space.StateTerminated {
			t.Fatalf("after delete: %s", got.State)
		}
		if r := s.do("GET", "/v1/sandboxes/not-an-id", "acme", ""); r.StatusCode != 400 || r.problem(t).Field != "id" {
			t.Fatalf("a malformed id = %d %s", r.StatusCode, r.body)
		}
	})

	t.Run("postgres stopped mid-test answers 503 problem+json and recovers", func(t *testing.T) {
		t.Parallel()
		var proxy *testenv.Proxy
		s := startServer(t, e2eOptions{quota: acmeQuota, config: func(c *config.Config) {
			c.DatabaseURL, proxy = testenv.ProxyDatabaseURL(t, c.DatabaseURL)
		}})
		s.create("acme", pythonBody)
		proxy.Cut()
		for _, c := range []struct{ method, path, body string }{
			{"POST", "/v1/sandboxes", pythonBody},
			{"GET", "/v1/sandboxes", ""},
		} {
			r := s.do(c.method, c.path, "acme", c.body)
			if p := r.problem(t); r.StatusCode != 503 || p.Code != space.EUNAVAILABLE {
				t.Fatalf("%s %s with postgres down = %d %+v", c.method, c.path, r.StatusCode, p)
			}
		}
		proxy.Restore()
		testenv.Eventually(t, 10*time.Second, "creates to work again", func() bool {
			return s.do("POST", "/v1/sandboxes", "globex", pythonBody).StatusCode == 201
		})
	})

	t.Run("the wake route is on the internal listener only", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, e2eOptions{})
		id := "00000000-0000-4000-8000-000000000001"
		if r := s.do("POST", "/internal/v1/sandboxes/"+id+"/wake", "", ""); r.StatusCode != 404 {
			t.Fatalf("public wake = %d, want 404", r.StatusCode)
		}
		if r := s.internal("POST", "/internal/v1/sandboxes/"+id+"/wake", ""); r.StatusCode != 404 || r.problem(t).Code != space.ENOTFOUND {
			t.Fatalf("internal wake of a missing sandbox = %d %s, want the sandbox not found", r.StatusCode, r.body)
		}
	})
}

func TestShutdownDrains(t *testing.T) {
	t.Parallel()

	t.Run("shutdown finishes an in-flight create before it returns", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, e2eOptions{config: func(c *config.Config) { c.Sandbox.SimulatedColdStart = 500 * time.Millisecond }})
		done := make(chan response, 1)
		go func() { done <- s.do("POST", "/v1/sandboxes", "initech", pythonBody) }()
		testenv.Eventually(t, 5*time.Second, "the create to be in flight", func() bool {
			var n int
			_ = s.m.DB.QueryRow(testenv.Context(t), "SELECT count(*) FROM sandboxes WHERE state = 'starting'").Scan(&n)
			return n == 1
		})
		closed := make(chan error, 1)
		go func() { closed <- s.m.Close() }()
		r := <-done
		if r.StatusCode != http.StatusCreated {
			t.Fatalf("in-flight create = %d %s, want 201", r.StatusCode, r.body)
		}
		if err := <-closed; err != nil {
			t.Fatalf("Close: %v", err)
		}
		if _, err := http.Get(s.m.PublicURL() + "/healthz"); err == nil {
			t.Fatal("the listener still accepts after Close")
		}
	})
}
