package app

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/admission"
	"github.com/space-sandbox/space/internal/api"
	"github.com/space-sandbox/space/internal/config"
	"github.com/space-sandbox/space/internal/pool"
	"github.com/space-sandbox/space/internal/reload"
	"github.com/space-sandbox/space/internal/testenv"
)

// overCap is python-3.12 with a disk over the template's cap of 50 GiB.
const overCapBody = `{"template":"python-3.12","cpu_millis":1000,"memory_mib":2048,"disk_gib":60}`

func TestWarmPoolFollowsItsTemplates(t *testing.T) {
	t.Parallel()

	t.Run("a create whose cold shape fails to resolve charges no bucket", func(t *testing.T) {
		t.Parallel()
		// A pool target over the template's disk cap: refused, never warmed, never
		// charged; a create of that shape is 422 on both paths.
		cfg := testConfig(t)
		cfg.Admission.Cluster = space.Rate{RefillRPS: 1e-6, Burst: 1000}
		cfg.Flags.File = testenv.WriteFile(t, "flags.json", quotaFlags(acmeQuota,
			`[{"template":"python-3.12","cpu_millis":1000,"memory_mib":2048,"disk_gib":60,"target":2}]`))
		m := NewMain(cfg, NewLogger(io.Discard, "error"))
		m.RedisPrefix = testenv.Prefix(t)
		m.noReplenisher = true
		if err := m.Run(testenv.Context(t)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		s := &server{t: t, m: m}
		s.create("acme", pythonBody) // creates the client's bucket, so "untouched" means something
		before := s.rawBuckets("acme")
		res, err := m.Replenisher.Round(testenv.Context(t))
		if err != nil || res.Warmed != 0 {
			t.Fatalf("round = %+v, %v; want nothing warmed for the refused target", res, err)
		}
		if got := s.metric("space_pool_targets_refused_total"); got < 1 {
			t.Fatalf("space_pool_targets_refused_total = %v, want the target counted", got)
		}
		for _, prefer := range []string{"", async} {
			r := s.do("POST", "/v1/sandboxes", "acme", overCapBody, "Prefer", prefer)
			if p := r.problem(t); r.StatusCode != 422 || p.Field != "disk_gib" {
				t.Fatalf("Prefer %q: %d %+v, want 422 naming disk_gib", prefer, r.StatusCode, p)
			}
		}
		if after := s.rawBuckets("acme"); after != before {
			t.Fatalf("a refused target or an unresolvable create was charged:\n before %s\n after  %s", before, after)
		}
		var slots int
		if err := m.DB.QueryRow(testenv.Context(t), "SELECT count(*) FROM pool_slots").Scan(&slots); err != nil || slots != 0 {
			t.Fatalf("%d slots (%v), want none", slots, err)
		}
	})

	t.Run("after a template's image changes no create gets an old slot and the pool is back at target", func(t *testing.T) {
		t.Parallel()
		reloaded := make(chan reload.Result, 8)
		cfg := testConfig(t)
		cfg.Admission.Cluster = space.Rate{RefillRPS: 1e-6, Burst: 1000}
		cfg.Sandbox.TemplatesPollInterval = 10 * time.Millisecond
		cfg.Flags.File = testenv.WriteFile(t, "flags.json", quotaFlags(acmeQuota,
			`[{"template":"python-3.12","cpu_millis":1000,"memory_mib":2048,"disk_gib":10,"target":2}]`))
		m := NewMain(cfg, NewLogger(io.Discard, "error"))
		m.RedisPrefix = testenv.Prefix(t)
		m.noReplenisher = true
		m.OnTemplatesReload = func(r reload.Result) { reloaded <- r }
		if err := m.Run(testenv.Context(t)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		s := &server{t: t, m: m}
		round := func() pool.RoundResult {
			res, err := m.Replenisher.Round(testenv.Context(t))
			if err != nil {
				t.Fatal(err)
			}
			return res
		}
		if res := round(); res.Warmed != 2 {
			t.Fatalf("first round warmed %d, want the target of 2", res.Warmed)
		}
		old := m.Templates.Current()["python-3.12"].Version
		writeFlags(t, cfg.Sandbox.TemplatesFile, strings.Replace(testTemplates, "python:3.12-slim", "python:3.12.7-slim", 1))
		if r := <-reloaded; r.Err != nil || !r.Swapped {
			t.Fatalf("reload = %+v", r)
		}
		current := m.Templates.Current()["python-3.12"].Version
		if current == old {
			t.Fatal("a changed image kept the template's version")
		}
		// The two old slots are still ready: no create gets one.
		sb := s.create("acme", pythonBody)
		if sb.Warm || sb.TemplateVersion != current {
			t.Fatalf("create after the reload = warm %v, version %s; want a cold start of version %s", sb.Warm, sb.TemplateVersion, current)
		}
		res := round()
		if res.Retired != 2 || res.Warmed != 2 {
			t.Fatalf("round after the reload = %+v, want the 2 old slots retired and 2 new warmed", res)
		}
		var stale, fresh int
		if err := m.DB.QueryRow(testenv.Context(t), `SELECT count(*) FILTER (WHERE template_version <> $1),
			count(*) FILTER (WHERE template_version = $1 AND state = 'ready') FROM pool_slots`, current).Scan(&stale, &fresh); err != nil {
			t.Fatal(err)
		}
		if stale != 0 || fresh != 2 {
			t.Fatalf("%d old-version slots and %d ready new ones, want 0 and 2", stale, fresh)
		}
		if sb := s.create("acme", pythonBody); !sb.Warm || sb.TemplateVersion != current {
			t.Fatalf("create = warm %v, version %s; want a warm hit of version %s", sb.Warm, sb.TemplateVersion, current)
		}
	})
}

// costTemplates give gpu an activation cost of 3.
const costTemplates = `{"templates": {
	"python-3.12": {"image": "python:3.12-slim", "max_disk_gib": 50},
	"gpu": {"image": "cuda:12", "activation_cost": 3}
}}`

const gpuBody = `{"template":"gpu","cpu_millis":4000,"memory_mib":16384,"disk_gib":20}`

func TestActivationCost(t *testing.T) {
	t.Parallel()

	t.Run("cost 3 with a client burst of 7 admits two and refuses the third with both buckets untouched", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, e2eOptions{
			quota: `{"clients": {"acme": {"concurrency": 50, "live_sandboxes": 100}}, "rate": {"acme": {"refill_rps": 0.000001, "burst": 7}}}`,
			config: func(c *config.Config) {
				c.Sandbox.TemplatesFile = testenv.WriteFile(t, "templates.json", costTemplates)
			}})
		c0, a0 := s.tokens("acme", &space.Rate{RefillRPS: 0.000001, Burst: 7})
		s.create("acme", gpuBody)
		s.create("acme", gpuBody)
		c1, a1 := s.tokens("acme", &space.Rate{RefillRPS: 0.000001, Burst: 7})
		if !near(c0-c1, 6) || !near(a0-a1, 6) {
			t.Fatalf("two gpu creates took cluster %v and client %v tokens, want 6 of each", c0-c1, a0-a1)
		}
		before := s.rawBuckets("acme")
		r := s.do("POST", "/v1/sandboxes", "acme", gpuBody)
		if p := r.problem(t); r.StatusCode != 429 || p.Bucket != space.BucketClientActivation {
			t.Fatalf("third gpu create = %d %+v, want a client_activation 429", r.StatusCode, p)
		}
		if r.Header.Get("Retry-After") == "" {
			t.Fatal("no Retry-After")
		}
		if after := s.rawBuckets("acme"); after != before {
			t.Fatalf("a refused activation of cost 3 took tokens:\n before %s\n after  %s", before, after)
		}
		// The one token left still admits a cost-1 template.
		s.create("acme", pythonBody)
		var limits api.LimitsBody
		s.do("GET", "/v1/limits", "acme", "").json(t, &limits)
		if limits.ActivationCosts["gpu"] != 3 || limits.ActivationCosts["python-3.12"] != 1 {
			t.Fatalf("reported costs %v", limits.ActivationCosts)
		}
	})

	t.Run("a cost above a bucket's burst is refused at load, naming the template and the bucket", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			tune   func(*config.Config)
			bucket string
		}{
			{func(c *config.Config) { c.Admission.Cluster = space.Rate{RefillRPS: 1, Burst: 2} }, "SPACE_CLUSTER_ACTIVATION_ADMISSION_BURST"},
			{func(c *config.Config) { c.Admission.Client = &space.Rate{RefillRPS: 1, Burst: 2} }, "SPACE_CLUSTER_ACTIVATION_ADMISSION_CLIENT_BURST"},
		} {
			cfg := testConfig(t)
			cfg.Sandbox.TemplatesFile = testenv.WriteFile(t, "templates.json", costTemplates)
			tc.tune(&cfg)
			m := NewMain(cfg, NewLogger(io.Discard, "error"))
			err := m.Run(testenv.Context(t))
			m.Close()
			if err == nil || !strings.Contains(err.Error(), `"gpu"`) || !strings.Contains(err.Error(), tc.bucket) || !strings.Contains(err.Error(), "SPACE_TEMPLATES_FILE") {
				t.Errorf("start with a cost of 3 over a burst of 2 = %v, want an error naming gpu and %s", err, tc.bucket)
			}
		}
	})

	t.Run("a cost above a client's flag burst is a 422 naming the template", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, e2eOptions{
			quota: `{"clients": {"acme": {"concurrency": 50, "live_sandboxes": 100}}, "rate": {"acme": {"refill_rps": 1, "burst": 2}}}`,
			config: func(c *config.Config) {
				c.Sandbox.TemplatesFile = testenv.WriteFile(t, "templates.json", costTemplates)
			}})
		r := s.do("POST", "/v1/sandboxes", "acme", gpuBody)
		if p := r.problem(t); r.StatusCode != 422 || p.Field != "template" || !strings.Contains(p.Detail, "could never be admitted") {
			t.Fatalf("gpu create over acme's burst = %d %+v, want a 422 naming the template", r.StatusCode, p)
		}
	})

	t.Run("a cost above a client's burst is a 422 whether its bucket is full, empty or known empty", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, e2eOptions{
			quota: `{"clients": {"acme": {"concurrency": 50, "live_sandboxes": 100}}, "rate": {"acme": {"refill_rps": 0.000001, "burst": 2}}}`,
			config: func(c *config.Config) {
				c.Sandbox.TemplatesFile = testenv.WriteFile(t, "templates.json", costTemplates)
				c.Admission.RefusalCacheMaxAge = time.Hour // known empty for the whole test, however slow
			}})
		never := func(when string) {
			t.Helper()
			r := s.do("POST", "/v1/sandboxes", "acme", gpuBody)
			if p := r.problem(t); r.StatusCode != 422 || p.Field != "template" || r.Header.Get("Retry-After") != "" {
				t.Fatalf("gpu create (cost 3, burst 2) with the bucket %s = %d %+v, Retry-After %q; want a 422 naming the template",
					when, r.StatusCode, p, r.Header.Get("Retry-After"))
			}
		}
		never("full")
		s.create("acme", pythonBody)
		s.create("acme", pythonBody)
		if r := s.do("POST", "/v1/sandboxes", "acme", pythonBody); r.StatusCode != 429 {
			t.Fatalf("a create of the empty bucket = %d, want Redis's 429", r.StatusCode)
		}
		never("empty")
		s.knownCold(pythonShape)
		local := s.metric("space_sandbox_admission_local_refusals_total", `bucket="client_activation"`)
		if r := s.do("POST", "/v1/sandboxes", "acme", pythonBody); r.StatusCode != 429 ||
			s.metric("space_sandbox_admission_local_refusals_total", `bucket="client_activation"`) != local+1 {
			t.Fatalf("a create of the bucket known empty = %d, want a 429 from memory", r.StatusCode)
		}
		never("known empty in memory")
	})

	t.Run("three replicas with mixed costs admit exactly burst plus refill times elapsed", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig(t)
		cfg.Sandbox.TemplatesFile = testenv.WriteFile(t, "templates.json", costTemplates)
		cfg.Admission.Cluster = space.Rate{RefillRPS: 10, Burst: 30}
		cfg.Flags.File = testenv.WriteFile(t, "flags.json", quotaFlags(`{"default": {"concurrency": 1000, "live_sandboxes": 100000}}`, ""))
		replicas := startMains(t, cfg, 3, true)
		rdb := replicas[0].Redis
		start, err := rdb.Time(testenv.Context(t)).Result()
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		tokens := 0
		var wg sync.WaitGroup
		for i := range 90 {
			wg.Go(func() {
				body, cost := pythonBody, 1
				if i%2 == 0 {
					body, cost = gpuBody, 3
				}
				s := &server{t: t, m: replicas[i%3]}
				if code := s.requestNoFail(s.m.PublicURL(), "POST", "/v1/sandboxes", fmt.Sprintf("client-%d", i%5), body); code == http.StatusCreated {
					mu.Lock()
					tokens += cost
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		// What the cluster bucket holds now says how long it refilled: the tokens taken
		// are the burst plus that refill, minus what is left.
		d, _, err := replicas[0].Admitter.Report(testenv.Context(t), space.Charge{Cost: 1})
		if err != nil {
			t.Fatal(err)
		}
		end, err := rdb.Time(testenv.Context(t)).Result()
		if err != nil {
			t.Fatal(err)
		}
		refilled := end.Sub(start).Seconds() * 10
		taken := 30 + refilled - d.Cluster.Remaining
		if float64(tokens) > taken+0.01 || float64(tokens) < taken-refilled-1 {
			t.Fatalf("admitted %d tokens of activations; the bucket says %.2f were taken (burst 30, %.2f refilled, %.2f left)",
				tokens, taken, refilled, d.Cluster.Remaining)
		}
		if raw, err := rdb.Get(testenv.Context(t), admission.ClusterKey(replicas[0].RedisPrefix)).Result(); err != nil || len(raw) != 32 {
			t.Fatalf("cluster key %q, %v", raw, err)
		}
	})
}

func TestWarmPoolFollowsDemand(t *testing.T) {
	t.Parallel()

	t.Run("creates on every replica grow the pool of a shape given min and max", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig(t)
		cfg.Flags.File = testenv.WriteFile(t, "flags.json", quotaFlags(acmeQuota,
			`[{"template":"python-3.12","cpu_millis":1000,"memory_mib":2048,"disk_gib":10,"min":0,"max":50}]`))
		// One simulated cluster for both replicas: a slot one warms, the other adopts.
		cfg.Sandbox.SimulatedStateDir = t.TempDir()
		replicas := startMains(t, cfg, 2, true)
		leader, other := replicas[0], &server{t: t, m: replicas[1]}
		res, err := leader.Replenisher.Round(testenv.Context(t))
		if err != nil || res.Warmed != 0 {
			t.Fatalf("a round before any demand = %+v, %v; want an empty pool (min 0)", res, err)
		}
		for range 5 {
			if sb := other.create("acme", pythonBody); sb.Warm {
				t.Fatal("a create of an empty pool was warm")
			}
		}
		// The other replica adds its claims to the demand every second; here at once.
		if err := replicas[1].Pool.FlushDemand(testenv.Context(t)); err != nil {
			t.Fatal(err)
		}
		res, err = leader.Replenisher.Round(testenv.Context(t))
		shape := space.Shape{Template: "python-3.12", CPUMillis: 1000, MemoryMiB: 2048, DiskGiB: 10}
		target := res.Targets[shape]
		if err != nil || target < 1 || res.Warmed != target {
			t.Fatalf("a round after 5 misses on the other replica = %+v, %v; want a target above 0, warmed", res, err)
		}
		if sb := other.create("acme", pythonBody); !sb.Warm {
			t.Fatal("a create after the pool grew was cold")
		}
		s := &server{t: t, m: leader}
		sel := `shape="python-3.12/1000m/2048Mi/10Gi"`
		if got := other.metric("space_pool_target_slots", sel); got != float64(target) {
			t.Errorf("the other replica reports a target of %v, want the leader's %d", got, target)
		}
		if got := s.metric("space_pool_target_max_slots", sel); got != 50 {
			t.Errorf("space_pool_target_max_slots = %v, want the flag's 50", got)
		}
		if got := s.metric("space_pool_demand_slots", sel); got <= 0 {
			t.Errorf("space_pool_demand_slots = %v, want the demand of 5 claims", got)
		}
		if got := other.metric("space_pool_claims_by_template_total", `template="python-3.12"`, `result="miss"`); got != 5 {
			t.Errorf("misses of python-3.12 = %v, want 5", got)
		}
	})

	t.Run("warm-ups leave SPACE_POOL_REFILL_RESERVE of the cluster bucket to the users", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig(t)
		cfg.Admission.Cluster = space.Rate{RefillRPS: 1e-6, Burst: 10}
		cfg.Pool.RefillReserve = 0.25 // ceil(2.5): 3 tokens
		cfg.Flags.File = testenv.WriteFile(t, "flags.json", quotaFlags(acmeQuota,
			`[{"template":"python-3.12","cpu_millis":1000,"memory_mib":2048,"disk_gib":10,"target":20}]`))
		m := NewMain(cfg, NewLogger(io.Discard, "error"))
		m.RedisPrefix = testenv.Prefix(t)
		m.noReplenisher = true
		if err := m.Run(testenv.Context(t)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		s := &server{t: t, m: m}
		res, err := m.Replenisher.Round(testenv.Context(t))
		if err != nil || res.Warmed != 7 || !res.Rejected {
			t.Fatalf("round = %+v, %v; want 7 warmed and the 8th refused: 3 of the 10 tokens are the users'", res, err)
		}
		for range 3 {
			if sb := s.create("acme", `{"template":"node-22","cpu_millis":1000,"memory_mib":1024,"disk_gib":5}`); sb.Warm {
				t.Fatal("a node-22 create was warm")
			}
		}
		if got := s.metric("space_pool_refills_skipped_total", `reason="reserve"`); got != 1 {
			t.Errorf("refills skipped for the reserve = %v, want 1", got)
		}
	})
}
