package bench

import (
	"context"
	"fmt"
	"maps"
	"sort"
	"strings"
	"time"

	"github.com/space-sandbox/space/internal/testenv"
)

// Shapes of the HTTP scenarios: warm hits ask for the warm pool's shape; cold admits
// and rejects for a shape the pool never holds, so that every one of them misses the
// pool and reaches the charge.
const (
	warmBody = `{"template":"python-3.12","cpu_millis":1000,"memory_mib":2048,"disk_gib":10}`
	coldBody = `{"template":"python-3.12","cpu_millis":500,"memory_mib":1024,"disk_gib":5}`
)

var warmShape = poolShape{Template: "python-3.12", CPUMillis: 1000, MemoryMiB: 2048, DiskGiB: 10}

// HTTPRow is one kind of create under a closed loop: per run, the answers per second
// of the expected outcome and their p50 and p99 latency in ms.
type HTTPRow struct {
	Name     string
	Outcome  string // the expected outcome, e.g. "201 warm"
	RPS      []float64
	P50, P99 []float64
	// Unexpected counts answers of any other outcome, over all runs.
	Unexpected map[string]int
	Requests   int
}

func (r *HTTPRow) add(res *loadResult) {
	r.RPS = append(r.RPS, res.rps(r.Outcome))
	r.P50 = append(r.P50, ms(res.latency(r.Outcome, 50)))
	r.P99 = append(r.P99, ms(res.latency(r.Outcome, 99)))
	r.Requests += res.Requests
	for k, v := range res.Outcomes {
		if !strings.HasPrefix(k, r.Outcome) || (r.Outcome == "201" && k != "201") {
			if r.Unexpected == nil {
				r.Unexpected = map[string]int{}
			}
			r.Unexpected[k] += v
		}
	}
}

// addWrk adds one wrk run: wrk's percentiles are over every answer, which in the
// refusal runs are all of the expected status (any other is counted as unexpected).
func (r *HTTPRow) addWrk(res *wrkResult) {
	r.RPS = append(r.RPS, res.rps(r.Outcome))
	r.P50 = append(r.P50, ms(res.P50))
	r.P99 = append(r.P99, ms(res.P99))
	r.Requests += res.Requests
	for k, v := range res.Outcomes {
		if k != r.Outcome {
			if r.Unexpected == nil {
				r.Unexpected = map[string]int{}
			}
			r.Unexpected[k] += v
		}
	}
}

// unexpected renders the unexpected outcomes, "" for none.
func (r *HTTPRow) unexpected() string {
	var parts []string
	for k, v := range r.Unexpected {
		parts = append(parts, fmt.Sprintf("%d × %s", v, k))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// HTTPResult is the create-path scenario.
type HTTPResult struct {
	Workers    int
	Duration   time.Duration
	WarmUp     time.Duration
	WarmTarget int
	Warm       *HTTPRow
	Cold       *HTTPRow
	// Refusals is the refusal ceiling, under wrk.
	Refusals *RefusalResult
	// The admission on/off comparison: cold admits at OnOffRate creates/s, open loop,
	// alternating between a server with admission on and one with it off; per run the
	// p50 and p99 of each and the p50 difference, in ms.
	OnOffRate                    int
	OnOffSegment                 time.Duration
	OnOffRounds                  int
	OnP50, OffP50, OnP99, OffP99 []float64
	DeltaP50                     []float64
	OnOffUnexpected              map[string]int
	OnRequests, OffRequests      int
}

// RefusalResult is the refusal ceiling: refused creates/s of a client over
// its rate (a bucket of 1 that never refills), closed loop under wrk, on space-api and
// on two peers, each run measuring the four one after another in a rotating order so
// that a change of the machine's load falls on all of them.
type RefusalResult struct {
	Threads, Connections int
	Duration, WarmUp     time.Duration
	// NoCaps is space-api with the client's rate from the environment and no
	// concurrency or live cap; Full is the same client with both caps (the full path).
	NoCaps, Full *HTTPRow
	// RedisRate is the chi + redis_rate peer, Bare the chi peer with no store, Same
	// the bare peer answering space-api's own 429 (headers and body), and Constant
	// the same chi server reading no body and answering one pre-rendered 429: the
	// limit of HTTP itself on the machine.
	RedisRate, Bare, Same, Constant *HTTPRow
}

// Rows are the refusal rows in the report's order.
func (r *RefusalResult) Rows() []*HTTPRow {
	return []*HTTPRow{r.NoCaps, r.Full, r.RedisRate, r.Bare, r.Same, r.Constant}
}

// httpClients are the quota flag of the HTTP scenario: no live cap for the clients
// whose sandboxes pile up over a run (a cap would turn into a count of thousands of
// rows per create and measure that instead). The refused clients take the env client
// rate (refusalEnv); one has a concurrency cap and a live cap (the full path: the lease
// and its release, the live count), the other neither (concurrency 0 and live 0 mean
// no cap).
var httpClients = map[string]quota{
	"bench-warm":        {Concurrency: 1000},
	"bench-cold":        {Concurrency: 1000},
	"bench-reject":      {Concurrency: 1000, LiveSandboxes: 1000},
	"bench-reject-bare": {},
}

// httpRates gives the admitted clients buckets no run can empty; the refused clients
// have no entry, so the env client rate applies to them.
func httpRates() map[string]*rateEntry {
	return map[string]*rateEntry{
		"bench-warm": {RefillRPS: 1e6, Burst: 1e6},
		"bench-cold": {RefillRPS: 1e6, Burst: 1e6},
	}
}

// refusalEnv is the env client rate of the HTTP server: rate 0, burst 1, the client
// over its rate (its one token goes on its first create).
var refusalEnv = map[string]string{
	"SPACE_CLUSTER_ACTIVATION_ADMISSION_CLIENT_REFILL_RPS": "0",
	"SPACE_CLUSTER_ACTIVATION_ADMISSION_CLIENT_BURST":      "1",
}

// runHTTP drives one space-api (admission on, warm pool of the warm shape) through
// warm hits, cold admits and rejects, and, for what admission adds to a create, a
// pair of fresh servers identical but for SPACE_CLUSTER_ACTIVATION_ADMISSION_ENABLED,
// sharing one database, all on the same Postgres server and Redis.
func runHTTP(ctx context.Context, env *Env, runs int, sz sizes) (*HTTPResult, error) {
	rs, err := startRedis(ctx, env.Dir)
	if err != nil {
		return nil, err
	}
	defer rs.Stop()
	big := map[string]string{
		"SPACE_CLUSTER_ACTIVATION_ADMISSION_REFILL_RPS": "1000000",
		"SPACE_CLUSTER_ACTIVATION_ADMISSION_BURST":      "1000000",
	}
	res := &HTTPResult{
		Workers: sz.httpWorkers, Duration: sz.httpDur, WarmUp: sz.httpWarmUp, WarmTarget: sz.warmTarget,
		Warm:      &HTTPRow{Name: "warm hits", Outcome: "201 warm"},
		Cold:      &HTTPRow{Name: "cold admits", Outcome: "201"},
		OnOffRate: sz.onOffRate, OnOffSegment: sz.onOffDur, OnOffRounds: sz.onOffRounds,
	}
	if err := runOnOff(ctx, env, res, rs, big, runs, sz); err != nil {
		return nil, err
	}
	env.logf("http: admission on/off done")

	db, err := env.newDatabase(ctx)
	if err != nil {
		return nil, err
	}
	defer db.drop()
	pool := []poolShape{warmShape}
	pool[0].Target = sz.warmTarget
	flagsOn, err := flagsFile(httpClients, httpRates(), pool)
	if err != nil {
		return nil, err
	}
	onEnv := maps.Clone(big)
	maps.Copy(onEnv, refusalEnv)
	on, err := env.startServer(ctx, serverConfig{Name: "http", DB: db, RedisAddr: rs.Addr, Flags: flagsOn, Env: onEnv})
	if err != nil {
		return nil, err
	}
	defer on.stop()

	// The replenisher fills the pool at the start; measuring the cold path meanwhile
	// would measure the warm-ups too.
	if err := waitPool(ctx, db, sz.warmTarget); err != nil {
		return nil, err
	}
	closed := func(name, client, body string, max int) load {
		return load{Name: name, URL: on.PublicURL, Client: client, Body: body, Workers: sz.httpWorkers, Duration: sz.httpDur, MaxRequests: max}
	}

	// Each kind of load runs once unmeasured first: connection pools, prepared
	// statements and the Go heap settle before the runs that count.
	warmUp := func(l load) {
		l.Duration, l.MaxRequests = sz.httpWarmUp, 0
		l.run(ctx)
	}
	cold := closed("cold", "bench-cold", coldBody, 0)
	warmUp(cold)
	for range runs {
		res.Cold.add(cold.run(ctx))
		if err := on.alive(); err != nil {
			return nil, err
		}
	}
	env.logf("http: cold admits done")

	if res.Refusals, err = runRefusals(ctx, env, on, rs, runs, sz); err != nil {
		return nil, err
	}
	env.logf("http: refusals done")

	for range runs {
		if err := waitPool(ctx, db, sz.warmTarget); err != nil {
			return nil, err
		}
		// Three quarters of the pool: the replenisher refills as the run goes, but a
		// run never outpaces the pool and turns into cold starts.
		res.Warm.add(closed("warm", "bench-warm", warmBody, sz.warmTarget*3/4).run(ctx))
	}
	env.logf("http: warm hits done")
	if err := on.alive(); err != nil {
		return nil, err
	}
	return res, nil
}

// runOnOff alternates cold admits between two fresh servers, one with admission on
// and one with it off, on one database (with no warm pool to share) and the same
// Redis, in segments whose order flips every round, so that a change of the
// machine's load during a run falls on both sides alike.
func runOnOff(ctx context.Context, env *Env, res *HTTPResult, rs *testenv.RedisProcess, big map[string]string, runs int, sz sizes) error {
	db, err := env.newDatabase(ctx)
	if err != nil {
		return err
	}
	defer db.drop()
	flags, err := flagsFile(httpClients, httpRates(), nil)
	if err != nil {
		return err
	}
	offEnv := map[string]string{"SPACE_CLUSTER_ACTIVATION_ADMISSION_ENABLED": "false"}
	for k, v := range big {
		offEnv[k] = v
	}
	on, err := env.startServer(ctx, serverConfig{Name: "http-admission-on", DB: db, RedisAddr: rs.Addr, Flags: flags, Env: big})
	if err != nil {
		return err
	}
	defer on.stop()
	off, err := env.startServer(ctx, serverConfig{Name: "http-admission-off", DB: db, RedisAddr: rs.Addr, Flags: flags, Env: offEnv})
	if err != nil {
		return err
	}
	defer off.stop()
	for _, s := range []*apiServer{on, off} { // unmeasured: pools and statements settle
		load{URL: s.PublicURL, Client: "bench-cold", Body: coldBody, Rate: sz.onOffRate, Duration: sz.httpWarmUp}.run(ctx)
	}
	for run := range runs {
		var onRes, offRes []*loadResult
		for round := range sz.onOffRounds {
			order := []*apiServer{on, off}
			if (run+round)%2 == 1 {
				order = []*apiServer{off, on}
			}
			for _, s := range order {
				r := load{Name: s.Name, URL: s.PublicURL, Client: "bench-cold", Body: coldBody, Rate: sz.onOffRate, Duration: sz.onOffDur}.run(ctx)
				if s == on {
					onRes = append(onRes, r)
				} else {
					offRes = append(offRes, r)
				}
			}
		}
		onAll, offAll := merge(onRes), merge(offRes)
		for _, r := range []*loadResult{onAll, offAll} {
			for k, v := range r.Outcomes {
				if k != "201" {
					if res.OnOffUnexpected == nil {
						res.OnOffUnexpected = map[string]int{}
					}
					res.OnOffUnexpected[r.Name+" "+k] += v
				}
			}
		}
		res.OnRequests += onAll.Requests
		res.OffRequests += offAll.Requests
		onP50, offP50 := ms(onAll.latency("201", 50)), ms(offAll.latency("201", 50))
		res.OnP50 = append(res.OnP50, onP50)
		res.OffP50 = append(res.OffP50, offP50)
		res.OnP99 = append(res.OnP99, ms(onAll.latency("201", 99)))
		res.OffP99 = append(res.OffP99, ms(offAll.latency("201", 99)))
		res.DeltaP50 = append(res.DeltaP50, onP50-offP50)
	}
	for _, s := range []*apiServer{on, off} {
		if err := s.alive(); err != nil {
			return err
		}
	}
	return nil
}

// merge pools the results of several segments of one side.
func merge(rs []*loadResult) *loadResult {
	out := newLoadResult("")
	for _, r := range rs {
		out.Name = r.Name
		out.Requests += r.Requests
		out.Elapsed += r.Elapsed
		out.all = append(out.all, r.all...)
		for k, v := range r.Outcomes {
			out.Outcomes[k] += v
		}
		for k, v := range r.latencies {
			out.latencies[k] = append(out.latencies[k], v...)
		}
	}
	return out
}

// waitPool waits until the warm pool holds target ready slots.
func waitPool(ctx context.Context, db *database, target int) error {
	deadline := time.Now().Add(3 * time.Minute)
	var ready int64
	for {
		var err error
		ready, err = db.queryInt(ctx, "SELECT count(*) FROM pool_slots WHERE state = 'ready'")
		if err != nil {
			return err
		}
		if ready >= int64(target) {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("the warm pool holds %d ready slots after 3 minutes, want %d", ready, target)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
