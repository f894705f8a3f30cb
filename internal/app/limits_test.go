package app

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/admission"
	"github.com/space-sandbox/space/internal/api"
	"github.com/space-sandbox/space/internal/config"
	"github.com/space-sandbox/space/internal/flags"
	"github.com/space-sandbox/space/internal/substrate"
	"github.com/space-sandbox/space/internal/testenv"
)

// Every kind of rate entry, for the report-equals-enforcement tests. The env client rate
// is burst 2.
const rateKindsQuota = `{
	"clients": {"acme": {}, "globex": {}, "initech": {}, "hooli": {}},
	"default": {"concurrency": 100, "live_sandboxes": 1000},
	"rate": {
		"acme":     {"refill_rps": 0.000001, "burst": 4},
		"globex":   null,
		"initech":  {"refill_rps": "fast", "burst": 3},
		"umbrella": {"refill_rps": 0.000001, "burst": 7}
	}}`

func rateKindsServer(t *testing.T, tweak func(*config.Config)) *server {
	t.Helper()
	return startServer(t, e2eOptions{quota: rateKindsQuota, config: func(c *config.Config) {
		c.Admission.Client = &space.Rate{RefillRPS: 0.000001, Burst: 2}
		if tweak != nil {
			tweak(c)
		}
	}})
}

// admitted creates until the first 429 (or max) and returns how many were created
// and the 429's problem.
func (s *server) admitted(client string, max int) (int, api.Problem) {
	s.t.Helper()
	for n := 0; n < max; n++ {
		r := s.do("POST", "/v1/sandboxes", client, pythonBody)
		if r.StatusCode == http.StatusTooManyRequests {
			return n, r.problem(s.t)
		}
		if r.StatusCode != http.StatusCreated {
			s.t.Fatalf("create %d for %q = %d %s", n, client, r.StatusCode, r.body)
		}
	}
	return max, api.Problem{}
}

func (s *server) limits(client string) api.LimitsBody {
	s.t.Helper()
	var l api.LimitsBody
	r := s.do("GET", "/v1/limits", client, "")
	if r.StatusCode != 200 {
		s.t.Fatalf("limits = %d %s", r.StatusCode, r.body)
	}
	r.json(s.t, &l)
	return l
}

func (s *server) hasClientBucket(client space.ClientKey) bool {
	s.t.Helper()
	return s.exists(admission.ClientKey(s.m.RedisPrefix, client))
}

// exists reports whether key is in Redis, failing the test when Redis cannot say: an
// unreadable Redis must not read as "nothing was written".
func (s *server) exists(key string) bool {
	s.t.Helper()
	n, err := s.m.Redis.Exists(testenv.Context(s.t), key).Result()
	if err != nil {
		s.t.Fatalf("EXISTS %s: %v", key, err)
	}
	return n == 1
}

func TestLimitsTellTheTruthInEveryMode(t *testing.T) {
	t.Parallel()
	quota := `{"clients": {"acme": {"concurrency": 50, "live_sandboxes": 100}}, "rate": {"acme": {"refill_rps": 0.000001, "burst": 2}}}`

	for _, tc := range []struct {
		name      string
		config    func(*config.Config)
		stopRedis bool
		status    admission.Enforcement
		admitted  int // of 4 creates
		code      int // of the creates past the ones admitted
	}{
		{"enforced: the burst is admitted and the rest refused", nil, false, admission.Enforced, 2, 429},
		{"shadow: decided and recorded, and every create admitted", func(c *config.Config) { c.Admission.Shadow = true }, false, admission.Shadow, 4, 0},
		{"disabled: nothing charged, every create admitted", func(c *config.Config) { c.Admission.Enabled = false }, false, admission.Disabled, 4, 0},
		{"fail open: redis unreachable, the replica spends the burst as it knows it and refuses the rest", nil, true, admission.FailOpen, 2, 429},
		{"fail closed: redis unreachable, every create refused", func(c *config.Config) { c.Admission.FailureMode = config.FailClosed }, true, admission.FailClosed, 0, 503},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			redisSrv := testenv.StartRedis(t)
			s := startServer(t, e2eOptions{quota: quota, config: func(c *config.Config) {
				c.Redis.Addrs = []string{redisSrv.Addr}
				if tc.config != nil {
					tc.config(c)
				}
			}})
			if tc.stopRedis {
				redisSrv.Stop()
			}
			l := s.limits("acme")
			if l.Admission != tc.status || l.Cluster.Status != string(tc.status) || l.ClientRate.Status != string(tc.status) {
				t.Fatalf("reported admission %q, cluster %q, client %q; want %q", l.Admission, l.Cluster.Status, l.ClientRate.Status, tc.status)
			}
			if tc.status != admission.Enforced && len(l.Warnings) == 0 {
				t.Errorf("no warning says the buckets are %s", tc.status)
			}
			admitted := 0
			for i := range 4 {
				r := s.do("POST", "/v1/sandboxes", "acme", pythonBody)
				switch {
				case r.StatusCode == 201:
					admitted++
				case r.StatusCode != tc.code || i < tc.admitted:
					t.Fatalf("create %d = %d %s, want %d past %d admitted", i+1, r.StatusCode, r.body, tc.code, tc.admitted)
				}
			}
			if admitted != tc.admitted {
				t.Fatalf("%d of 4 creates admitted while reported %s, want %d", admitted, tc.status, tc.admitted)
			}
			if tc.status == admission.Shadow {
				if l := s.limits("acme"); l.ClientRate.Remaining == nil || *l.ClientRate.Remaining > 0.01 {
					t.Fatalf("shadow mode reports remaining %v after 4 admitted on a burst of 2: the decisions were not recorded", l.ClientRate.Remaining)
				}
			}
		})
	}
}

func TestLimitsReportWhatIsEnforced(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name, client string
		key          space.ClientKey
		status       string
		source       space.RateSource
		burst        int64 // 0: no client bucket
	}{
		{"a rate entry replaces the env rate", "acme", "acme", "enforced", flags.SourceFlag, 4},
		{"a null entry exempts the key and writes no client bucket", "globex", "globex", "exempt", flags.SourceFlag, 0},
		{"a malformed entry leaves its key on the env rate", "initech", "initech", "enforced", flags.SourceMalformedFallback, 2},
		{"an allowlisted key without an entry is on the env rate", "hooli", "hooli", "enforced", flags.SourceEnv, 2},
		{"a rate entry does not allowlist its key", "umbrella", space.Unknown, "enforced", flags.SourceEnv, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := rateKindsServer(t, nil)
			l := s.limits(tc.client)
			if l.Client != tc.key || l.ClientRate.Status != tc.status || l.ClientRate.Source != tc.source {
				t.Fatalf("reported %+v (client bucket %+v), want %s %s from %s", l, l.ClientRate, tc.key, tc.status, tc.source)
			}
			if tc.burst == 0 {
				if l.ClientRate.BucketBody != nil {
					t.Fatalf("an exempt key reports a bucket: %+v", l.ClientRate.BucketBody)
				}
				n, p := s.admitted(tc.client, 10)
				if n != 10 || s.hasClientBucket(tc.key) {
					t.Fatalf("exempt: %d admitted (stopped by %+v), client bucket written %v", n, p, s.hasClientBucket(tc.key))
				}
				return
			}
			if l.ClientRate.Burst != tc.burst || l.ClientRate.Remaining == nil || !near(*l.ClientRate.Remaining, float64(tc.burst)) {
				t.Fatalf("reported bucket %+v, want burst %d, full", l.ClientRate.BucketBody, tc.burst)
			}
			n, p := s.admitted(tc.client, 20)
			if int64(n) != tc.burst || p.Bucket != space.BucketClientActivation || p.Client != tc.key {
				t.Fatalf("enforced: %d admitted then %+v; reported burst %d", n, p, tc.burst)
			}
			if after := s.limits(tc.client); after.ClientRate.Remaining == nil || *after.ClientRate.Remaining > 0.01 {
				t.Fatalf("after draining, reported remaining %v", after.ClientRate.Remaining)
			}
		})
	}

	t.Run("a malformed entry leaves the other keys on their entries", func(t *testing.T) {
		t.Parallel()
		s := rateKindsServer(t, nil)
		if n, _ := s.admitted("acme", 20); n != 4 {
			t.Fatalf("acme admitted %d beside a malformed initech entry, want its own 4", n)
		}
	})

	t.Run("disabled admission ignores the rate object and charges nothing", func(t *testing.T) {
		t.Parallel()
		s := rateKindsServer(t, func(c *config.Config) { c.Admission.Enabled = false })
		l := s.limits("acme")
		if l.AdmissionEnabled || l.ClientRate.Source != flags.SourceEnv {
			t.Fatalf("reported %+v", l)
		}
		if n, p := s.admitted("acme", 8); n != 8 {
			t.Fatalf("admitted %d with admission off (stopped by %+v)", n, p)
		}
		if s.hasClientBucket("acme") {
			t.Fatal("disabled admission wrote a client bucket")
		}
		if s.exists(admission.ClusterKey(s.m.RedisPrefix)) {
			t.Fatal("disabled admission wrote the cluster bucket")
		}
	})

	t.Run("a null unknown entry lifts the shared unknown rate", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, e2eOptions{quota: `{"default": {"concurrency": 100, "live_sandboxes": 1000}, "rate": {"unknown": null}}`,
			config: func(c *config.Config) { c.Admission.Client = &space.Rate{RefillRPS: 0.000001, Burst: 2} }})
		if l := s.limits("initech"); l.ClientRate.Status != "exempt" || l.Client != space.Unknown || l.ClientID != "initech" {
			t.Fatalf("initech reported %+v", l)
		}
		if n, p := s.admitted("initech", 6); n != 6 {
			t.Fatalf("unknown admitted %d (stopped by %+v), want no client bucket", n, p)
		}
	})

	t.Run("a flag change applies to the next request", func(t *testing.T) {
		t.Parallel()
		reloaded := make(chan flags.ReloadResult, 10)
		cfg := testConfig(t)
		cfg.Admission.Cluster = space.Rate{RefillRPS: 1e-6, Burst: 1000}
		cfg.Flags.File = testenv.WriteFile(t, "flags.json", quotaFlags(`{"clients": {"acme": {}}, "rate": {"acme": {"refill_rps": 0.000001, "burst": 1}}}`, ""))
		cfg.Flags.PollInterval = 10 * time.Millisecond
		m := NewMain(cfg, NewLogger(io.Discard, "error"))
		m.RedisPrefix = testenv.Prefix(t)
		m.OnFlagsReload = func(r flags.ReloadResult) { reloaded <- r }
		if err := m.Run(testenv.Context(t)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		s := &server{t: t, m: m}
		if n, _ := s.admitted("acme", 5); n != 1 {
			t.Fatalf("admitted %d on burst 1", n)
		}
		// An atomic replace, as an operator's tooling or a ConfigMap update does it.
		tmp := cfg.Flags.File + ".tmp"
		if err := os.WriteFile(tmp, []byte(quotaFlags(`{"clients": {"acme": {}}, "rate": {"acme": null}}`, "")), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, cfg.Flags.File); err != nil {
			t.Fatal(err)
		}
		if r := <-reloaded; r.Err != nil {
			t.Fatalf("reload: %v", r.Err)
		}
		// The reload's signal comes once the new value is parsed
		// (flags.Resolver.Prepare): the exemption holds from the next create on.
		if n, p := s.admitted("acme", 4); n != 4 {
			t.Fatalf("after the flag exempted acme: %d admitted, stopped by %+v", n, p)
		}
	})
}

func TestConcurrencyCap(t *testing.T) {
	t.Parallel()

	t.Run("N+k concurrent slow requests of one client get exactly k 429s and other clients are unaffected", func(t *testing.T) {
		t.Parallel()
		const capN, extra = 3, 2
		s := startServer(t, e2eOptions{
			quota: `{"clients": {"acme": {"concurrency": 3}, "globex": {"concurrency": 3}}, "default": {"live_sandboxes": 100}}`})
		// The cold starts are held until the test lets them go: the first three creates
		// hold acme's places for as long as the test needs, however slow the machine.
		release := s.m.Substrate.(*substrate.Simulated).Gate(substrate.OpStartCold)
		defer release()
		codes := make(chan int, capN+extra)
		var problems []api.Problem
		var mu sync.Mutex
		send := func() {
			r := s.do("POST", "/v1/sandboxes", "acme", pythonBody)
			if r.StatusCode == 429 {
				p := r.problem(t)
				if r.Header.Get("Retry-After") == "" {
					t.Error("a concurrency 429 without Retry-After")
				}
				mu.Lock()
				problems = append(problems, p)
				mu.Unlock()
			}
			codes <- r.StatusCode
		}
		for range capN {
			go send()
		}
		testenv.Eventually(t, 30*time.Second, "acme's creates to hold its places", func() bool {
			n, err := s.m.Redis.ZCard(testenv.Context(t), s.m.RedisPrefix+":client_concurrency:acme").Result()
			if err != nil {
				t.Fatalf("read acme's leases: %v", err)
			}
			return n == capN
		})
		// With every place held, each further create of acme is refused, and only
		// acme's: globex gets through.
		for range extra {
			send()
		}
		if r := s.do("GET", "/v1/sandboxes", "globex", ""); r.StatusCode != 200 {
			t.Fatalf("globex during acme's burst = %d", r.StatusCode)
		}
		release()
		got := map[int]int{}
		for range capN + extra {
			got[<-codes]++
		}
		// A lease call that fails open admits without a place (the designed behaviour of
		// an unreachable Redis); none may have here, or the count proves nothing.
		if errs := s.metric("space_client_concurrency_decisions_total", `decision="error"`); errs != 0 {
			t.Fatalf("%v lease calls failed open: the count %v says nothing about the limiter", errs, got)
		}
		if got[201] != capN || got[429] != extra || len(problems) != extra {
			t.Fatalf("codes %v, want %d created and %d refused", got, capN, extra)
		}
		for _, p := range problems {
			if p.Bucket != space.BucketClientConcurrency || p.Client != "acme" || !strings.Contains(p.Detail, "in flight") {
				t.Errorf("refusal %+v", p)
			}
		}
	})

	t.Run("a client far below its cap takes its places alongside its bookings, and the cap holds exactly", func(t *testing.T) {
		t.Parallel()
		const capN, burst = 8, 24
		s := startServer(t, e2eOptions{quota: `{"clients": {"acme": {"concurrency": 8}}, "default": {"live_sandboxes": 100}}`})
		// Sequential creates, each far below the cap, until one has taken its place
		// alongside (the pool view must have synced to know the shape cold).
		primed := 0
		testenv.Eventually(t, 30*time.Second, "a create to take its place alongside", func() bool {
			s.create("acme", pythonBody)
			primed++
			return s.metric("space_client_concurrency_alongside_total") > 0
		})
		alongside := s.metric("space_client_concurrency_alongside_total")

		release := s.m.Substrate.(*substrate.Simulated).Gate(substrate.OpStartCold)
		defer release()
		codes := make(chan response, burst)
		post := func() { codes <- s.do("POST", "/v1/sandboxes", "acme", pythonBody) }
		// The first half of the cap one after another, each once the one before holds
		// its place at the gated start: what the replica learnt is then never older
		// than one create, well within the second Alongside trusts it for, so some go
		// alongside however loaded the machine (sent all at once, a loaded machine sent
		// every Acquire before the first reply taught the count, and none went). The
		// rest all at once, beside them: the cap must hold exactly with places being
		// taken both ways.
		for i := range capN / 2 {
			before := s.coldStarts()
			go post()
			testenv.Eventually(t, 30*time.Second, fmt.Sprintf("create %d of the burst to hold its place at the start", i+1), func() bool {
				return s.coldStarts() > before
			})
		}
		for range burst - capN/2 {
			go post()
		}
		got := map[string]int{}
		testenv.Eventually(t, 30*time.Second, "acme's burst to hold its places or be refused", func() bool {
			for {
				select {
				case r := <-codes:
					key := fmt.Sprint(r.StatusCode)
					if r.StatusCode == http.StatusTooManyRequests {
						key = string(r.problem(t).Bucket)
					}
					got[key]++
					continue
				default:
				}
				break
			}
			return got[string(space.BucketClientConcurrency)] == burst-capN
		})
		release()
		for range capN {
			r := <-codes
			got[fmt.Sprint(r.StatusCode)]++
		}
		if errs := s.metric("space_client_concurrency_decisions_total", `decision="error"`); errs != 0 {
			t.Fatalf("%v lease calls failed open: the count %v says nothing about the limiter", errs, got)
		}
		if got["201"] != capN || got[string(space.BucketClientConcurrency)] != burst-capN || len(got) != 2 {
			t.Fatalf("answers %v, want %d created and %d refused client_concurrency", got, capN, burst-capN)
		}
		// Some of the burst went alongside. How many in all depends on when the first
		// places came back and taught the replica the count (each lets more go while
		// the count it learnt leaves room): the bound is on places being taken
		// alongside at once, at most half the cap, which TestConcurrencyAlongside
		// holds exactly.
		if more := s.metric("space_client_concurrency_alongside_total") - alongside; more < 1 {
			t.Fatalf("none of the burst took its place alongside")
		}
		var rows, starting int
		if err := s.m.DB.QueryRow(testenv.Context(t), `SELECT count(*), count(*) FILTER (WHERE state = 'starting')
			FROM sandboxes WHERE client = 'acme'`).Scan(&rows, &starting); err != nil {
			t.Fatal(err)
		}
		if rows != primed+capN || starting != 0 {
			t.Fatalf("acme has %d sandboxes (%d starting), want the %d primed and the %d made, none starting", rows, starting, primed, capN)
		}
	})
}
