package app

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/admission"
	"github.com/space-sandbox/space/internal/config"
	"github.com/space-sandbox/space/internal/flags"
	"github.com/space-sandbox/space/internal/testenv"
)

func TestRefusalsWithoutRedis(t *testing.T) {
	t.Parallel()

	// slowQuota gives acme a bucket of 2 that refills one token every 100s.
	const slowQuota = `{"clients": {"acme": {"concurrency": 50, "live_sandboxes": 100}}, "rate": {"acme": {"refill_rps": 0.01, "burst": 2}}}`

	t.Run("a client known empty is refused as Redis refuses it, with no Redis call and no row", func(t *testing.T) {
		t.Parallel()
		// The replica's memory of the bucket outlasts a loaded machine's slowest moment
		// between the two refusals: the bound on its age is the reset tests' below.
		s := startServer(t, e2eOptions{quota: slowQuota, config: func(c *config.Config) {
			c.Admission.RefusalCacheMaxAge = time.Hour
		}})
		s.create("acme", pythonBody)
		// The bucket is empty from the second create on, 100 s from its next token: a
		// refusal's Retry-After is at least that, less the time since (a loaded machine
		// has taken seconds between the two refusals).
		emptied := time.Now()
		s.create("acme", pythonBody)
		byRedis := s.do("POST", "/v1/sandboxes", "acme", pythonBody)
		s.knownCold(pythonShape)
		scripts := s.metric("space_sandbox_admission_script_seconds_count")
		local := s.metric("space_sandbox_admission_local_refusals_total", `bucket="client_activation"`)
		byReplica := s.do("POST", "/v1/sandboxes", "acme", pythonBody)
		least := retryAtLeast(100*time.Second, emptied)
		for name, r := range map[string]response{"redis": byRedis, "replica": byReplica} {
			p := r.problem(t)
			retry, err := strconv.Atoi(r.Header.Get("Retry-After"))
			if r.StatusCode != 429 || p.Bucket != space.BucketClientActivation || p.Client != "acme" || err != nil || retry < least ||
				r.Header.Get("RateLimit-Policy") != `"client_activation";q=2;w=200` {
				t.Errorf("%s's refusal: %d %+v, Retry-After %q (want at least %d), RateLimit-Policy %q", name, r.StatusCode, p, r.Header.Get("Retry-After"), least, r.Header.Get("RateLimit-Policy"))
			}
		}
		if got := s.metric("space_sandbox_admission_script_seconds_count"); got != scripts {
			t.Fatalf("the second refusal ran the script (%v calls, was %v)", got, scripts)
		}
		if got := s.metric("space_sandbox_admission_local_refusals_total", `bucket="client_activation"`); got != local+1 {
			t.Fatalf("local refusals %v, want %v", got, local+1)
		}
		if n := s.sandboxCount(); n != 2 {
			t.Fatalf("%d sandbox rows, want the two admitted: a refusal reserves nothing", n)
		}
	})

	t.Run("a flag raising the rate admits the client at once", func(t *testing.T) {
		t.Parallel()
		reloaded := make(chan flags.ReloadResult, 8)
		cfg := testConfig(t)
		cfg.Flags.File = testenv.WriteFile(t, "flags.json", quotaFlags(slowQuota, ""))
		cfg.Flags.PollInterval = 10 * time.Millisecond
		m := NewMain(cfg, NewLogger(io.Discard, "error"))
		m.RedisPrefix = testenv.Prefix(t)
		m.OnFlagsReload = func(r flags.ReloadResult) { reloaded <- r }
		if err := m.Run(testenv.Context(t)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		s := &server{t: t, m: m}
		if n, _ := s.admitted("acme", 4); n != 2 {
			t.Fatalf("admitted %d, want the burst of 2", n)
		}
		if n, _ := s.admitted("acme", 1); n != 0 {
			t.Fatal("admitted while known empty")
		}
		writeFlags(t, cfg.Flags.File, quotaFlags(`{"clients": {"acme": {"concurrency": 50, "live_sandboxes": 100}}, "rate": {"acme": {"refill_rps": 100000, "burst": 50}}}`, ""))
		if r := <-reloaded; r.Err != nil {
			t.Fatal(r.Err)
		}
		// The reload's signal comes once the new quota value is parsed
		// (flags.Resolver.Prepare): the next create meets the raised rate, and no
		// refusal in memory nor bucket of the old rate may hold the client back.
		if n, p := s.admitted("acme", 1); n != 1 {
			t.Fatalf("after the rate was raised: refused %+v", p)
		}
	})

	for _, refill := range []float64{0, 0.01} {
		t.Run(fmt.Sprintf("a bucket reset by hand in Redis admits once the refusal in memory is past its bound (refill %g/s)", refill), func(t *testing.T) {
			t.Parallel()
			const bound = 300 * time.Millisecond
			quota := fmt.Sprintf(`{"clients": {"acme": {"concurrency": 50, "live_sandboxes": 100}}, "rate": {"acme": {"refill_rps": %g, "burst": 3}}}`, refill)
			s := startServer(t, e2eOptions{quota: quota, config: func(c *config.Config) {
				c.Admission.RefusalCacheMaxAge = bound
			}})
			if n, _ := s.admitted("acme", 4); n != 3 {
				t.Fatalf("admitted %d, want the burst of 3", n)
			}
			if err := s.m.Redis.Del(testenv.Context(t), admission.ClientKey(s.m.RedisPrefix, "acme")).Err(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(bound) // whatever this replica learnt of the bucket is older than the bound now
			if n, p := s.admitted("acme", 4); n != 3 {
				t.Fatalf("after the reset: admitted %d (then %+v), want the full burst of 3 that Redis holds", n, p)
			}
		})
	}

	t.Run("three replicas still admit exactly the burst", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig(t)
		cfg.Flags.File = testenv.WriteFile(t, "flags.json", quotaFlags(`{"clients": {"acme": {"concurrency": 100, "live_sandboxes": 1000}}, "rate": {"acme": {"refill_rps": 0.000001, "burst": 13}}}`, ""))
		replicas := startMains(t, cfg, 3, false)
		var mu sync.Mutex
		codes := map[int]int{}
		var wg sync.WaitGroup
		for i := range 60 {
			wg.Go(func() {
				s := &server{t: t, m: replicas[i%3]}
				code := s.requestNoFail(s.m.PublicURL(), "POST", "/v1/sandboxes", "acme", pythonBody)
				mu.Lock()
				codes[code]++
				mu.Unlock()
			})
		}
		wg.Wait()
		if codes[http.StatusCreated] != 13 || codes[http.StatusTooManyRequests] != 47 {
			t.Fatalf("codes %v, want exactly the burst of 13 created and 47 refused", codes)
		}
	})
}
