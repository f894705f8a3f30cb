package app

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/admission"
	"github.com/space-sandbox/space/internal/api"
	"github.com/space-sandbox/space/internal/config"
	"github.com/space-sandbox/space/internal/flags"
	"github.com/space-sandbox/space/internal/substrate"
	"github.com/space-sandbox/space/internal/testenv"
)

// fleet is what several replicas share, read by the test from outside: the database
// and the simulated substrate's state.
type fleet struct {
	t   *testing.T
	db  *pgxpool.Pool
	sub *substrate.Simulated
}

func newFleet(t *testing.T, env map[string]string) *fleet {
	return &fleet{t: t, db: testenv.Pool(t, env["SPACE_DATABASE_URL"]),
		sub: substrate.NewSimulated(substrate.SimulatedOptions{StateDir: env["SPACE_SIMULATED_STATE_DIR"]})}
}

func (f *fleet) count(sql string, args ...any) int {
	f.t.Helper()
	var n int
	if err := f.db.QueryRow(testenv.Context(f.t), sql, args...).Scan(&n); err != nil {
		f.t.Fatal(err)
	}
	return n
}

// transitional counts sandboxes starting, restoring or pausing, and unfinished
// operations.
func (f *fleet) unsettled() (sandboxes, operations int) {
	return f.count("SELECT count(*) FROM sandboxes WHERE state IN ('starting', 'restoring', 'pausing')"),
		f.count("SELECT count(*) FROM operations WHERE state IN ('queued', 'running')")
}

// orphans lists what the substrate runs that no row accounts for, and the rows whose
// resource is missing: both empty once the fleet is settled and swept.
func (f *fleet) orphans() (orphans, missing []string) {
	f.t.Helper()
	ctx := testenv.Context(f.t)
	resources, err := f.sub.List(ctx)
	if err != nil {
		f.t.Fatal(err)
	}
	owned := map[string]bool{}
	rows, err := f.db.Query(ctx, `SELECT substrate_ref FROM sandboxes WHERE state = 'running'
		UNION ALL SELECT coalesce(substrate_ref, 'slot-' || id::text) FROM pool_slots`)
	if err != nil {
		f.t.Fatal(err)
	}
	refs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		f.t.Fatal(err)
	}
	for _, r := range refs {
		owned[r] = true
	}
	// What keeps a sandbox's state (a snapshot, a claim) is its row's until the row
	// ends, paused or not.
	rows, err = f.db.Query(ctx, `SELECT id::text FROM sandboxes WHERE state NOT IN ('terminated', 'failed')`)
	if err != nil {
		f.t.Fatal(err)
	}
	kept, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		f.t.Fatal(err)
	}
	keeps := map[string]bool{}
	for _, id := range kept {
		keeps[id] = true
	}
	running := map[string]bool{}
	for _, r := range resources {
		if r.Storage {
			if !keeps[r.SandboxID] {
				orphans = append(orphans, fmt.Sprintf("%s (storage of sandbox %q)", r.Ref, r.SandboxID))
			}
			continue
		}
		running[r.Ref] = true
		if !owned[r.Ref] {
			orphans = append(orphans, fmt.Sprintf("%s (sandbox %q slot %q ready %v)", r.Ref, r.SandboxID, r.SlotID, r.Ready))
		}
	}
	for ref := range owned {
		if !running[ref] && !strings.HasPrefix(ref, "slot-") {
			missing = append(missing, ref)
		}
	}
	return orphans, missing
}

func TestRecovery(t *testing.T) {
	t.Parallel()

	t.Run("a replica killed mid-burst leaves nothing stuck, lost, doubled or orphaned", func(t *testing.T) {
		t.Parallel()
		pool := `[{"template":"python-3.12","cpu_millis":1000,"memory_mib":2048,"disk_gib":10,"target":3}]`
		env := replicaEnv(t, quotaFlags(`{"clients": {"acme": {"concurrency": 100, "live_sandboxes": 24}}}`, pool), map[string]string{
			"SPACE_SIMULATED_COLD_START":   "1s",
			"SPACE_SIMULATED_TIMEOUT":      "3s",
			"SPACE_RECONCILE_INTERVAL":     "200ms",
			"SPACE_RECONCILE_GRACE":        "500ms",
			"SPACE_DISPATCHER_JOB_TIMEOUT": "4s",
		})
		a := startReplica(t, "a", env)
		b := startReplica(t, "b", env)
		f := newFleet(t, env)
		testenv.Eventually(t, 30*time.Second, "the warm pool to fill", func() bool {
			return f.count("SELECT count(*) FROM pool_slots WHERE state = 'ready'") == 3
		})

		s := &server{t: t}
		var wg sync.WaitGroup
		var mu sync.Mutex
		var ops []string
		fire := func(r *replica, body string, async bool) {
			wg.Go(func() {
				var header []string
				if async {
					header = []string{"Prefer", "respond-async"}
				}
				req, err := http.NewRequest("POST", r.public+"/v1/sandboxes", strings.NewReader(body))
				if err != nil {
					t.Error(err)
					return
				}
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set(api.HeaderClientID, "acme")
				for i := 0; i+1 < len(header); i += 2 {
					req.Header.Set(header[i], header[i+1])
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					return // the killed replica's own requests
				}
				defer resp.Body.Close()
				if resp.StatusCode >= 500 && r == b {
					t.Errorf("the surviving replica answered %d", resp.StatusCode)
				}
				if async && resp.StatusCode == http.StatusAccepted {
					var op space.Operation
					if err := json.NewDecoder(resp.Body).Decode(&op); err == nil {
						mu.Lock()
						ops = append(ops, op.ID)
						mu.Unlock()
					}
				}
			})
		}
		for range 6 {
			fire(a, pythonBody, false) // three warm hits, then cold starts
			fire(a, pythonBody, true)
		}
		for range 3 {
			fire(b, `{"template":"node-22","cpu_millis":500,"memory_mib":512,"disk_gib":1}`, false)
			fire(b, pythonBody, true)
		}
		testenv.Eventually(t, 30*time.Second, "cold starts in flight", func() bool {
			return f.count("SELECT count(*) FROM sandboxes WHERE state = 'starting'") >= 4
		})
		a.kill()
		wg.Wait()
		if len(ops) < 3 {
			t.Fatalf("only %d queued operations were accepted", len(ops))
		}

		testenv.Eventually(t, 2*time.Minute, "every sandbox and operation to settle", func() bool {
			sbs, unfinished := f.unsettled()
			return sbs == 0 && unfinished == 0
		})
		for _, id := range ops {
			var state, sandboxID, sbState string
			if err := f.db.QueryRow(testenv.Context(t), `SELECT o.state, o.sandbox_id::text, coalesce(s.state, 'none')
				FROM operations o LEFT JOIN sandboxes s ON s.id = o.sandbox_id WHERE o.id = $1`, id).Scan(&state, &sandboxID, &sbState); err != nil {
				t.Fatal(err)
			}
			found, err := f.sub.Find(testenv.Context(t), sandboxID)
			if err != nil {
				t.Fatal(err)
			}
			if state != "succeeded" || sbState != "running" || len(found.Resources) != 1 {
				t.Errorf("operation %s: %s, its sandbox %s with %d resources; want succeeded, running, one", id, state, sbState, len(found.Resources))
			}
		}
		testenv.Eventually(t, 30*time.Second, "a sweep to leave no orphan", func() bool {
			orphans, missing := f.orphans()
			return len(orphans) == 0 && len(missing) == 0
		})
		// Every live place is a running sandbox's: a create still fits under the cap.
		live := f.count("SELECT count(*) FROM sandboxes WHERE budget_key = 'acme' AND state IN ('starting', 'running', 'pausing', 'restoring')")
		running := f.count("SELECT count(*) FROM sandboxes WHERE budget_key = 'acme' AND state = 'running'")
		if live != running || live >= 24 {
			t.Fatalf("%d live places for %d running sandboxes", live, running)
		}
		if r := s.request(b.public, "POST", "/v1/sandboxes", "acme", pythonBody); r.StatusCode != 201 {
			t.Fatalf("a create after the recovery = %d %s", r.StatusCode, r.body)
		}
	})

	t.Run("a drain shorter than a cold start leaves rows the next replica settles", func(t *testing.T) {
		t.Parallel()
		env := replicaEnv(t, "", map[string]string{
			"SPACE_SIMULATED_COLD_START": "3s",
			"SPACE_SIMULATED_TIMEOUT":    "4s",
			"SPACE_SHUTDOWN_TIMEOUT":     "300ms",
			"SPACE_RECONCILE_INTERVAL":   "200ms",
			"SPACE_RECONCILE_GRACE":      "300ms",
		})
		a := startReplica(t, "a", env)
		f := newFleet(t, env)
		s := &server{t: t}
		var wg sync.WaitGroup
		for range 3 {
			wg.Go(func() { s.requestNoFail(a.public, "POST", "/v1/sandboxes", "initech", pythonBody) })
		}
		testenv.Eventually(t, 30*time.Second, "the creates to be starting", func() bool {
			return f.count("SELECT count(*) FROM sandboxes WHERE state = 'starting'") == 3
		})
		_ = a.terminate() // the drain is cut short: its exit status says so
		wg.Wait()
		if n := f.count("SELECT count(*) FROM sandboxes WHERE state = 'starting'"); n != 3 {
			t.Fatalf("%d sandboxes starting after the cut drain, want the 3 in flight", n)
		}
		startReplica(t, "b", env)
		testenv.Eventually(t, time.Minute, "the cut creates to be settled and their half-made resources stopped", func() bool {
			sbs, _ := f.unsettled()
			orphans, _ := f.orphans()
			return sbs == 0 && len(orphans) == 0
		})
		if n := f.count("SELECT count(*) FROM sandboxes WHERE state = 'failed' AND last_error LIKE 'settled by the reconciler%'"); n != 3 {
			t.Fatalf("%d settled as failed with the reason, want 3", n)
		}
	})

	// cutRunningWrite sends a create (with header pairs) and cuts Postgres once it is
	// starting, so that the write recording it running fails; it returns the sandbox's
	// id once the reconciler has settled it, and the server.
	cutRunningWrite := func(t *testing.T, header ...string) (*server, string) {
		t.Helper()
		var proxy *testenv.Proxy
		s := startServer(t, e2eOptions{quota: acmeQuota, config: func(c *config.Config) {
			c.DatabaseURL, proxy = testenv.ProxyDatabaseURL(t, c.DatabaseURL)
			c.Sandbox.SimulatedColdStart = time.Second
			c.Sandbox.SimulatedTimeout = 2 * time.Second
			// The reconciler's bound counts from the booking, the cold start's timeout
			// from when it starts, after the charge and the place: the grace covers
			// what a loaded machine spends between the two (200 ms did not, once).
			c.Reconcile = config.Reconcile{Interval: 100 * time.Millisecond, Grace: 2 * time.Second}
		}})
		done := make(chan response, 1)
		go func() { done <- s.do("POST", "/v1/sandboxes", "acme", pythonBody, header...) }()
		var id string
		testenv.Eventually(t, 10*time.Second, "the create to be starting", func() bool {
			return s.m.DB.QueryRow(testenv.Context(t), "SELECT id::text FROM sandboxes WHERE state = 'starting'").Scan(&id) == nil
		})
		proxy.Cut()
		if r := <-done; r.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("the create whose running write failed = %d %s, want 503", r.StatusCode, r.body)
		}
		proxy.Restore()
		testenv.Eventually(t, 30*time.Second, "the reconciler to settle the sandbox", func() bool {
			var sb space.Sandbox
			r := s.do("GET", "/v1/sandboxes/"+id, "acme", "")
			r.json(t, &sb)
			return r.StatusCode == 200 && sb.State != space.StateStarting
		})
		return s, id
	}

	t.Run("postgres down between a cold start and its running write, no key: the sandbox nobody was told of fails and is stopped", func(t *testing.T) {
		t.Parallel()
		s, id := cutRunningWrite(t)
		sb, err := s.m.Sandboxes.Get(testenv.Context(t), "acme", id)
		if err != nil {
			t.Fatal(err)
		}
		if sb.State != space.StateFailed || !strings.Contains(sb.LastError, "not answered") {
			t.Fatalf("settled as %s (%s), want failed as not answered", sb.State, sb.LastError)
		}
		// The reconciler's guarded write decides and its stop of what ran follows in
		// the same round (docs/design.md, Recovery): the row reads failed while the
		// stop may still be under way.
		testenv.Eventually(t, 30*time.Second, "what ran for the failed sandbox to be stopped", func() bool {
			found, err := s.m.Substrate.Find(testenv.Context(t), id)
			if err != nil {
				t.Fatal(err)
			}
			return len(found.Resources) == 0
		})
	})

	t.Run("postgres down between a cold start and its running write, with a key: the sandbox is kept running for the retry", func(t *testing.T) {
		t.Parallel()
		s, id := cutRunningWrite(t, "Idempotency-Key", "outage-1")
		stored, err := s.m.Sandboxes.Get(testenv.Context(t), "acme", id) // with its substrate ref, which the API does not show
		if err != nil {
			t.Fatal(err)
		}
		sim := s.m.Substrate.(*substrate.Simulated)
		if stored.State != space.StateRunning || !sim.IsRunning(stored.SubstrateRef) {
			t.Fatalf("settled as %s (%s) on %q, want running on the resource its cold start made", stored.State, stored.LastError, stored.SubstrateRef)
		}
		r := s.do("POST", "/v1/sandboxes", "acme", pythonBody, "Idempotency-Key", "outage-1")
		var sb space.Sandbox
		r.json(t, &sb)
		if r.StatusCode != http.StatusCreated || sb.ID != id {
			t.Fatalf("the retry = %d %s, want 201 with sandbox %s", r.StatusCode, r.body, id)
		}
	})

	t.Run("a sandbox deleted while starting is accepted and ends terminated with nothing left running", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, e2eOptions{quota: acmeQuota, config: func(c *config.Config) {
			c.Sandbox.SimulatedColdStart = time.Second
		}})
		done := make(chan response, 1)
		go func() { done <- s.do("POST", "/v1/sandboxes", "acme", pythonBody) }()
		var id string
		testenv.Eventually(t, 10*time.Second, "the create to be starting", func() bool {
			return s.m.DB.QueryRow(testenv.Context(t), "SELECT id::text FROM sandboxes WHERE state = 'starting'").Scan(&id) == nil
		})
		if r := s.do("DELETE", "/v1/sandboxes/"+id, "acme", ""); r.StatusCode != http.StatusAccepted {
			t.Fatalf("delete of a starting sandbox = %d %s, want 202", r.StatusCode, r.body)
		}
		if r := <-done; r.StatusCode != http.StatusConflict {
			t.Fatalf("the create whose sandbox was deleted = %d %s, want 409", r.StatusCode, r.body)
		}
		var sb space.Sandbox
		s.do("GET", "/v1/sandboxes/"+id, "acme", "").json(t, &sb)
		found, err := s.m.Substrate.Find(testenv.Context(t), id)
		if sb.State != space.StateTerminated || err != nil || len(found.Resources) != 0 {
			t.Fatalf("sandbox %s with %d resources (%v), want terminated with none", sb.State, len(found.Resources), err)
		}
		if r := s.do("DELETE", "/v1/sandboxes/"+id, "acme", ""); r.StatusCode != http.StatusNoContent {
			t.Fatalf("a second delete = %d, want 204", r.StatusCode)
		}
	})

	t.Run("serve exits with an error when a listener dies", func(t *testing.T) {
		t.Parallel()
		m := startMain(t, testConfig(t))
		served := make(chan error, 1)
		go func() { served <- m.Serve(testenv.Context(t)) }()
		m.publicLn.Close()
		select {
		case err := <-served:
			if err == nil || !strings.Contains(err.Error(), "listener failed") {
				t.Fatalf("Serve = %v, want the listener's failure", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("Serve did not return after its listener died")
		}
	})
}

func TestRedisOutage(t *testing.T) {
	t.Parallel()

	// outage is a server on a private Redis behind a proxy that counts the commands
	// that reach the network.
	type outage struct {
		s     *server
		redis *testenv.RedisServer
		proxy *testenv.Proxy
	}
	start := func(t *testing.T, mode config.FailureMode) outage {
		redisSrv := testenv.StartRedis(t)
		proxy := testenv.StartProxy(t, redisSrv.Addr)
		s := startServer(t, e2eOptions{
			quota: `{"clients": {"acme": {"concurrency": 50, "live_sandboxes": 1000}}, "rate": {"acme": {"refill_rps": 0.000001, "burst": 60}}}`,
			config: func(c *config.Config) {
				// testConfig's timeout, not the 100ms default: a loaded machine's slow
				// moment before the pause must not read as Redis gone (the breaker would
				// open, and fail-open decisions spend the bucket the test counts).
				c.Redis.Addrs = []string{proxy.Addr}
				c.Admission.FailureMode = mode
			}})
		return outage{s: s, redis: redisSrv, proxy: proxy}
	}
	// flood sends n creates, 4 at a time, and returns their statuses and latencies.
	flood := func(s *server, n int) ([]int, []time.Duration) {
		var mu sync.Mutex
		var codes []int
		var took []time.Duration
		var wg sync.WaitGroup
		sem := make(chan struct{}, 4)
		for range n {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				begin := time.Now()
				r := s.requestNoFail(s.m.PublicURL(), "POST", "/v1/sandboxes", "acme", pythonBody)
				mu.Lock()
				codes = append(codes, r)
				took = append(took, time.Since(begin))
				mu.Unlock()
			})
		}
		wg.Wait()
		return codes, took
	}

	for _, mode := range []config.FailureMode{config.FailOpen, config.FailClosed} {
		t.Run(fmt.Sprintf("redis paused during a flood costs one timeout, not three (%s), and admission is exact after", mode), func(t *testing.T) {
			t.Parallel()
			o := start(t, mode)
			for range 5 {
				o.s.create("acme", pythonBody)
			}
			_, normal := flood(o.s, 20)
			acme := &space.Rate{RefillRPS: 0.000001, Burst: 60}
			before, _, err := o.s.m.Admitter.Report(testenv.Context(t), space.Charge{Key: "acme", Rate: acme, Cost: 1})
			if err != nil {
				t.Fatal(err)
			}
			o.redis.Pause()
			sentBefore := o.proxy.Sent()
			const n = 40
			codes, took := flood(o.s, n)
			sent := o.proxy.Sent() - sentBefore
			// Failing open, the replica spends acme's bucket as its last decision left
			// it: the 35 tokens of 60 the 25 creates before left, then 429s. Failing
			// closed, every create is a 503.
			want := map[int]int{http.StatusServiceUnavailable: n}
			if mode == config.FailOpen {
				left := int(before.Client.Remaining)
				want = map[int]int{http.StatusCreated: left, http.StatusTooManyRequests: n - left}
			}
			got := map[int]int{}
			for _, c := range codes {
				got[c]++
			}
			if !maps.Equal(got, want) {
				t.Fatalf("the creates during the outage were answered %v, want %v: %v", got, want, codes)
			}
			// Without the breaker each create sends its lease and its admission to the
			// stopped Redis (two or three commands); with it, three calls trip it and
			// then only a probe a second goes out.
			if sent >= n {
				t.Fatalf("%d commands reached the paused redis for %d creates; the breaker did not stop them", sent, n)
			}
			metrics := string(o.s.internal("GET", "/metrics", "").body)
			if !strings.Contains(metrics, `space_redis_circuit_breaker_transitions_total{to="open"}`) ||
				strings.Contains(metrics, `space_redis_circuit_breaker_transitions_total{to="open"} 0`) {
				t.Fatalf("no transition to open counted:\n%s", grepLines(metrics, "circuit_breaker"))
			}
			t.Logf("%s: p50 create %v before the outage, %v during it; %d commands reached redis for %d creates",
				mode, percentile(normal, 50), percentile(took, 50), sent, n)

			o.redis.Resume()
			testenv.Eventually(t, 10*time.Second, "a probe to close the breaker", func() bool {
				// A request first: only a call through the breaker can close it.
				return o.s.requestNoFail(o.s.m.PublicURL(), "GET", "/v1/limits", "acme", "") == 200 && o.s.m.Breaker.State() == "closed"
			})
			// Exact again: what Redis holds is what is admitted, to the token.
			d, _, err := o.s.m.Admitter.Report(testenv.Context(t), space.Charge{Key: "acme", Rate: &space.Rate{RefillRPS: 0.000001, Burst: 60}, Cost: 1})
			if err != nil {
				t.Fatal(err)
			}
			left := int(d.Client.Remaining)
			if n, p := o.s.admitted("acme", left+1); n != left || p.Bucket != space.BucketClientActivation {
				t.Fatalf("after the outage %d admitted then %+v, want exactly the %d tokens left", n, p, left)
			}
		})
	}

	t.Run("two replicas in an outage admit one cluster burst between them, not one each", func(t *testing.T) {
		t.Parallel()
		redisSrv := testenv.StartRedis(t)
		proxy := testenv.StartProxy(t, redisSrv.Addr)
		cfg := testConfig(t)
		cfg.Redis.Addrs = []string{proxy.Addr}
		cfg.Redis.Timeout = 100 * time.Millisecond
		cfg.Admission.FailureMode = config.FailOpen
		cfg.Admission.Cluster = space.Rate{RefillRPS: 1e-6, Burst: 10}
		cfg.Flags.File = testenv.WriteFile(t, "flags.json", quotaFlags(`{"clients": {"acme": {"concurrency": 50, "live_sandboxes": 1000}}, "rate": {"acme": {"refill_rps": 0.000001, "burst": 1000}}}`, ""))
		ms := startMains(t, cfg, 2, false)
		// The second replica counted both at its start; the first counts again now,
		// as its next heartbeat would.
		if n, err := ms[0].Roster.Beat(testenv.Context(t)); err != nil || n != 2 || ms[1].Roster.Count() != 2 {
			t.Fatalf("the replicas counted %d (%v) and %d, want 2 and 2", n, err, ms[1].Roster.Count())
		}
		proxy.Cut()
		for i, m := range ms {
			s := &server{t: t, m: m}
			got := map[int]int{}
			for range 8 {
				got[s.requestNoFail(m.PublicURL(), "POST", "/v1/sandboxes", "acme", pythonBody)]++
			}
			// The cluster bucket of 10, never learnt (full), shared by 2: 5 each.
			if want := map[int]int{http.StatusCreated: 5, http.StatusTooManyRequests: 3}; !maps.Equal(got, want) {
				t.Fatalf("replica %d answered %v during the outage, want %v", i, got, want)
			}
			r := s.do("POST", "/v1/sandboxes", "acme", pythonBody)
			if p := r.problem(t); r.StatusCode != http.StatusTooManyRequests || p.Bucket != space.BucketClusterActivation {
				t.Fatalf("replica %d past its share: %d %+v, want a 429 of the cluster bucket", i, r.StatusCode, p)
			}
			if got := s.metric("space_replicas"); got != 2 {
				t.Fatalf("replica %d: space_replicas %v, want 2", i, got)
			}
		}
	})
}

func TestBucketExpiryAndRetryAfter(t *testing.T) {
	t.Parallel()

	t.Run("a rate lowered while a client's bucket is empty still refuses it after the old expiry", func(t *testing.T) {
		t.Parallel()
		reloaded := make(chan flags.ReloadResult, 8)
		cfg := testConfig(t)
		cfg.Flags.File = testenv.WriteFile(t, "flags.json", quotaFlags(`{"clients": {"acme": {"concurrency": 50, "live_sandboxes": 100}}, "rate": {"acme": {"refill_rps": 2, "burst": 2}}}`, ""))
		cfg.Flags.PollInterval = 10 * time.Millisecond
		m := NewMain(cfg, NewLogger(io.Discard, "error"))
		m.RedisPrefix = testenv.Prefix(t)
		m.OnFlagsReload = func(r flags.ReloadResult) { reloaded <- r }
		if err := m.Run(testenv.Context(t)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		s := &server{t: t, m: m}
		// Drained to its first refusal: the burst of 2, and what refilled at 2/s while
		// the creates ran (a loaded machine is slow to send them).
		if n, p := s.admitted("acme", 20); n < 2 || p.Bucket != space.BucketClientActivation {
			t.Fatalf("admitted %d then %+v, want at least the burst of 2, then a refusal", n, p)
		}
		// The bucket is empty and its key expires within a second, at the old rate.
		writeFlags(t, cfg.Flags.File, quotaFlags(`{"clients": {"acme": {"concurrency": 50, "live_sandboxes": 100}}, "rate": {"acme": {"refill_rps": 0.001, "burst": 2}}}`, ""))
		if r := <-reloaded; r.Err != nil {
			t.Fatal(r.Err)
		}
		// The reload's signal comes once the lowered rate is parsed
		// (flags.Resolver.Prepare): the next create meets it.
		if n, _ := s.admitted("acme", 1); n != 0 {
			t.Fatal("admitted right after the rate was lowered")
		}
		time.Sleep(1500 * time.Millisecond) // past the old expiry
		if n, p := s.admitted("acme", 1); n != 0 || p.Bucket != space.BucketClientActivation {
			t.Fatalf("after the old expiry: admitted %d (%+v); the empty bucket came back full", n, p)
		}
		if ttl, err := m.Redis.PTTL(testenv.Context(t), admission.ClientKey(m.RedisPrefix, "acme")).Result(); err != nil || ttl < 1000*time.Second {
			t.Fatalf("the bucket's key lives %v (%v), want the lowered rate's refill of about 2,000s", ttl, err)
		}
	})

	t.Run("a bucket that refills once a week is told to retry in no less than a week", func(t *testing.T) {
		t.Parallel()
		week := 7 * 24 * time.Hour
		s := startServer(t, e2eOptions{quota: fmt.Sprintf(`{"clients": {"acme": {}}, "rate": {"acme": {"refill_rps": %g, "burst": 1}}}`, 1/week.Seconds())})
		s.create("acme", pythonBody)
		r := s.do("POST", "/v1/sandboxes", "acme", pythonBody)
		retry, err := strconv.Atoi(r.Header.Get("Retry-After"))
		if r.StatusCode != 429 || err != nil || retry < int(week/time.Second) {
			t.Fatalf("429 with Retry-After %q, want at least a week (%d s)", r.Header.Get("Retry-After"), int(week/time.Second))
		}
	})
}

// requestNoFail sends a request (with header pairs) and returns its status, 0 when
// it could not be sent.
// answerOf is requestNoFail's answer as a word: the status, with a problem's code
// (a refusal's bucket) after it, or the transport's error.
func (s *server) answerOf(base, method, path, client, body string) string {
	resp, err := sendNoFail(base, method, path, client, body)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	var p api.Problem
	if resp.StatusCode >= 400 && json.NewDecoder(resp.Body).Decode(&p) == nil {
		return fmt.Sprintf("%d %s %s", resp.StatusCode, p.Code, p.Bucket)
	}
	return strconv.Itoa(resp.StatusCode)
}

func (s *server) requestNoFail(base, method, path, client, body string, header ...string) int {
	resp, err := sendNoFail(base, method, path, client, body, header...)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// sendNoFail sends a request as client (none when empty) with header pairs, and
// returns the response or the error, for a caller that must not fail the test on it.
func sendNoFail(base, method, path, client, body string, header ...string) (*http.Response, error) {
	req, err := http.NewRequest(method, base+path, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if client != "" {
		req.Header.Set(api.HeaderClientID, client)
	}
	return http.DefaultClient.Do(req)
}

func percentile(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[min(len(s)-1, len(s)*p/100)]
}

func grepLines(text, substr string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func writeFlags(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}
