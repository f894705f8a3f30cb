// Package bench is the driver behind `make bench` (cmd/space-bench of the bench
// module, bench/ in the repository: a module of its own, so that the product's go.mod
// carries no load generator and no peer limiter): it measures the admission decision
// and the create path of space-api on this machine and reports medians of several
// runs, with min and max, leading with ratios (ours against redis_rate, admission on
// against off, space-api against peer servers) because the machine is shared and
// noisy.
//
// Scenarios:
//
//   - script: Redis CPU per decision (INFO commandstats) for bucket.lua's two-bucket
//     and one-key decisions beside redis_rate v10's Allow, allow and reject paths, on
//     a private redis-server, and the instructions a decision costs Redis when 32
//     goroutines decide at once and the ones that wait go as one batch script call;
//   - decisions: decisions/s from Go with 1, 8 and 32 goroutines, on the services'
//     standalone Redis and Redis Cluster, ours beside redis_rate, with the
//     decisions a script call carried and a decision's p50 at 1 goroutine;
//   - http: the create path of one space-api process under a load generator: warm
//     hits, cold admits, what admission adds to a create (a server with admission on
//     and one with it off, interleaved), and the refusal ceiling: refused
//     creates/s of a client over its rate under wrk, beside two peers (a chi server
//     asking redis_rate, and the same answering 429 at once; package peer);
//   - flood: one client at 20× its rate beside a well-behaved one;
//   - overload: each server's capacity C, then open-loop floods at 2C and 5C beside
//     a quiet client, and again beside a slowloris: what space-api answers past its
//     capacity, what the flooder still gets admitted, and the quiet client's latency,
//     against the chi + redis_rate peer in the same runs (overload.go);
//   - keys: Redis memory per idle client key, decisions/s with 10, 10k and 1M client
//     keys, and idle keys expiring;
//   - replicas: three space-api processes sharing Redis and Postgres admit exactly the
//     cluster burst plus its refill;
//   - pool: the warm pool following a bursty trace of demand, against fixed pools, on
//     a fast clock (pool.go);
//   - lifecycle: one enforcement round of the sandbox lifecycle at 100,000 live
//     sandboxes, 1,000 of them due: the round's wall time, the due query's time in
//     Postgres and its plan, and the round right after with nothing due
//     (lifecycle.go);
//   - migrations: the upgrade from the release before's schema at a year of history
//     (1M sandboxes, 1M operations) while that release's creates go on: each
//     migration's duration and the longest a create waited, once more behind a long
//     transaction (migrations.go);
//   - soak: steady creates and deletes against one space-api whose retention is
//     short: the tables' rows and sizes and the creates' p99 over minutes (soak.go);
//   - scale: a hundred thousand tenants, each an API key and a budget key of its own:
//     a replica's heap and /metrics from the start to 200,000 tenants, decisions/s
//     and refused creates/s spread over 100,000 keys or tenants against one, a
//     10,000-client quota flag reloaded every 500 ms under load, and Redis bytes per
//     idle client key at 100,000 keys and their expiry (scale.go);
//   - gobench: the hot-path `go test -bench` benchmarks, allocations included;
//   - fleet: space-api's replicas with the kubernetes substrate on a real
//     kube-apiserver, kube-scheduler and kwok's simulated nodes: 1,000 sandboxes
//     with a warm pool of 200, one replica killed and started again midway, 200 of
//     them paused and restored; Pods per activation (exactly one), nothing orphaned
//     once settled, the API server's requests per activation by verb and its
//     priority and fairness's rejections, Pod readiness p50/p99 beside the floor of
//     Pods made straight through the API, and the Pod creation rate beside the
//     cluster bucket's (fleet.go).
//
// Private redis-servers, free ports and the bench's databases come from the product's
// internal/testenv, whose error-returning core serves tests and the bench alike.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// Env is what the scenarios run against and with.
type Env struct {
	// AdminURL is a Postgres URL on the services' server; the bench creates its own
	// databases beside it and drops them at the end.
	AdminURL string
	// RedisAddr is the services' standalone Redis, ClusterAddrs its Redis Cluster (for
	// the decisions scenario; every other scenario starts a private redis-server).
	RedisAddr    string
	ClusterAddrs []string
	// SpaceAPI is the space-api binary to run.
	SpaceAPI string
	// Templates is the SPACE_TEMPLATES_FILE of the servers.
	Templates string
	// Module is the repository root, where `go test -bench` runs; the bench module
	// (the peers' source) is its bench/ directory.
	Module string
	// Dir is a scratch directory (flags files, server logs, Redis data).
	Dir string
	// Progress receives one line per step; nil discards.
	Progress io.Writer
	// ProfileDir, when set, receives CPU profiles of space-api where a scenario takes
	// them (the overload scenario: one over each flood's measured window), to be read
	// with go tool pprof beside the binary (SpaceAPI).
	ProfileDir string

	leftovers sync.Once // DropLeftoverDatabases, at the first database of a run
	peersOnce sync.Once // building the peers of the refusal comparison
	peersErr  error
}

// profile writes srv's CPU profile over the next d (whole seconds, at least one) to
// ProfileDir/name; a failure is logged, not returned: a profile explains a figure, it
// is not one.
func (e *Env) profile(ctx context.Context, srv *apiServer, d time.Duration, name string) {
	secs := max(1, int(d.Seconds()))
	body, err := httpGet(ctx, fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", srv.InternalURL, secs))
	if err == nil {
		err = os.WriteFile(filepath.Join(e.ProfileDir, name), body, 0o644)
	}
	if err != nil {
		e.logf("profile %s: %v", name, err)
		return
	}
	e.logf("profile %s: %ds of %s's CPU written to %s", name, secs, srv.Name, e.ProfileDir)
}

func (e *Env) logf(format string, args ...any) {
	if e.Progress != nil {
		fmt.Fprintf(e.Progress, "space-bench: "+format+"\n", args...)
	}
}

// Scenarios are the scenario names, in the order they run.
var Scenarios = []string{"script", "decisions", "http", "flood", "overload", "keys", "replicas", "pool", "lifecycle", "migrations", "soak", "scale", "gobench", "fleet"}

// Config is what to run and how much of it.
type Config struct {
	// Runs is how many times each figure is measured (its median, min and max are
	// reported). Default 3.
	Runs int
	// Quick shrinks every duration and count to a smoke run: the code paths, not the
	// figures.
	Quick bool
	// Only runs these scenarios (names of Scenarios); empty runs them all.
	Only []string
	// Soak is how long the soak scenario sends its load; 0 is the size's default.
	Soak time.Duration
}

func (c Config) wants(name string) bool {
	return len(c.Only) == 0 || slices.Contains(c.Only, name)
}

// sizes are the durations and counts of a run.
type sizes struct {
	scriptCalls int // decisions per script-cost cell
	// instructionCalls are the decisions per cell under callgrind, about 1 ms each.
	instructionCalls int
	decisionsDur     time.Duration // per decisions/s cell

	httpDur        time.Duration // per HTTP closed-loop run
	httpWarmUp     time.Duration // unmeasured load before each kind's runs
	httpWorkers    int           // connections of a closed loop
	warmTarget     int           // warm pool target of the warm-hit runs
	onOffRate      int           // creates/s of the admission on/off comparison
	onOffDur       time.Duration // per on or off segment
	onOffRounds    int           // rounds of on+off segments per run
	floodRate      float64       // the flooding client's refill rate; it sends 20× that
	goodRate       float64       // the well-behaved client's refill rate; it sends half
	floodDur       time.Duration
	quietSend      int           // the quiet neighbour's creates/s
	quietDur       time.Duration // each of its arms' measured part
	fixedFlood     int           // the fixed flood beside it, creates/s
	floodConns     int           // the connections the fixed flood holds (wrk2 -c)
	keyCounts      []int
	keysDur        time.Duration
	memoryKeys     int
	expiryKeys     int
	replicaDur     time.Duration
	replicaBurst   int64
	replicaRefill  float64
	replicaWorkers int
	goBenchTime    string
	goBenchCount   int
	// goPairTime is the -benchtime of each run of a goBenchPair: longer than
	// goBenchTime, as one run of each is all a pair's ratio has.
	goPairTime string
	// The lifecycle's table: live sandboxes, how many of them are due (a divisor of
	// live), and how many clients own them.
	lifecycleLive, lifecycleDue, lifecycleClients int
	// The migrations' history (sandboxes, operations, their clients), the release
	// before's writes a second during it (creates, queued operations), how long they
	// run alone first, and how long the long transaction stays open (0: no such run).
	migrationSandboxes, migrationOperations, migrationClients int
	migrationCreateRate, migrationOpRate                      int
	migrationBaseline, migrationHold                          time.Duration
	// The soak: how long, how often it samples, the retention, how long a sandbox
	// lives before its delete, synchronous and queued creates a second.
	soakDur, soakEvery, soakRetention, soakHold time.Duration
	soakRate, soakAsyncRate                     int

	// The overload scenario: the closed loop that measures C, each flood's time
	// before the quiet client starts, the flooder's reference arm, its bucket's rate,
	// the slowloris's connections, the floods as multiples of C, and the most
	// connections a flood's generator holds.
	overCapDur, overSettle, overRefDur time.Duration
	overFloodRate                      float64
	overSlowConns                      int
	overMultiples                      []int
	overMaxConns                       int
	scale                              scaleSizes

	// The fleet: sandboxes created, the warm pool's target, simulated nodes, and
	// creates in flight; sandboxes paused and restored after the creates, and Pods
	// made straight through the API for the floor of a Pod's readiness.
	fleetSandboxes, fleetPool, fleetNodes, fleetWorkers int
	fleetPauses, fleetFloor                             int
	fleetReadyTimeout                                   time.Duration
	// fleetReconcile, when set, is the replicas' SPACE_RECONCILE_INTERVAL, and ten
	// times it their SPACE_RECONCILE_GRACE: the smoke run's, so that a warm-up its kill
	// cut is settled within a minute rather than the defaults' two.
	fleetReconcile time.Duration
}

func sizesFor(quick bool) sizes {
	if quick {
		return sizes{
			scriptCalls: 200, instructionCalls: 50, decisionsDur: 100 * time.Millisecond,
			httpDur: 300 * time.Millisecond, httpWarmUp: 100 * time.Millisecond, httpWorkers: 4, warmTarget: 40,
			onOffRate: 50, onOffDur: 200 * time.Millisecond, onOffRounds: 1,
			floodRate: 5, goodRate: 4, floodDur: 600 * time.Millisecond, quietSend: 20, quietDur: 600 * time.Millisecond, fixedFlood: 200, floodConns: 8,
			overCapDur: time.Second, overSettle: 200 * time.Millisecond, overRefDur: 500 * time.Millisecond, overFloodRate: 20,
			overSlowConns: 50, overMultiples: []int{2, 5}, overMaxConns: 256,
			keyCounts: []int{10, 1000}, keysDur: 100 * time.Millisecond, memoryKeys: 500, expiryKeys: 200,
			replicaDur: 600 * time.Millisecond, replicaBurst: 20, replicaRefill: 5, replicaWorkers: 2,
			goBenchTime: "1x", goBenchCount: 1, goPairTime: "1x",
			lifecycleLive: 2000, lifecycleDue: 20, lifecycleClients: 20,
			migrationSandboxes: 20_000, migrationOperations: 20_000, migrationClients: 200,
			migrationCreateRate: 20, migrationOpRate: 10, migrationBaseline: time.Second, migrationHold: 3 * time.Second,
			soakDur: 20 * time.Second, soakEvery: 5 * time.Second, soakRetention: 5 * time.Second, soakHold: time.Second,
			soakRate: 20, soakAsyncRate: 5,
			scale:          scaleSizesFor(true),
			fleetSandboxes: 20, fleetPool: 5, fleetNodes: 2, fleetWorkers: 4, fleetPauses: 6, fleetFloor: 4, fleetReadyTimeout: 15 * time.Second, fleetReconcile: 200 * time.Millisecond,
		}
	}
	return sizes{
		scriptCalls: 10000, instructionCalls: 2000, decisionsDur: time.Second,
		httpDur: 2 * time.Second, httpWarmUp: time.Second, httpWorkers: 16, warmTarget: 2000,
		onOffRate: 150, onOffDur: time.Second, onOffRounds: 4,
		floodRate: 50, goodRate: 20, floodDur: 4 * time.Second, quietSend: 100, quietDur: 10 * time.Second, fixedFlood: 5000, floodConns: 64,
		overCapDur: 3 * time.Second, overSettle: time.Second, overRefDur: 5 * time.Second, overFloodRate: 500,
		overSlowConns: 1000, overMultiples: []int{2, 5}, overMaxConns: 2048,
		keyCounts: []int{10, 10_000, 1_000_000}, keysDur: 1500 * time.Millisecond, memoryKeys: 10_000, expiryKeys: 10_000,
		replicaDur: 4 * time.Second, replicaBurst: 200, replicaRefill: 50, replicaWorkers: 4,
		goBenchTime: "1s", goBenchCount: 3, goPairTime: "3s",
		lifecycleLive: 100_000, lifecycleDue: 1000, lifecycleClients: 1000,
		migrationSandboxes: 1_000_000, migrationOperations: 1_000_000, migrationClients: 10_000,
		migrationCreateRate: 50, migrationOpRate: 20, migrationBaseline: 10 * time.Second, migrationHold: 12 * time.Second,
		soakDur: 5 * time.Minute, soakEvery: 15 * time.Second, soakRetention: 30 * time.Second, soakHold: 2 * time.Second,
		soakRate: 50, soakAsyncRate: 10,
		scale:          scaleSizesFor(false),
		fleetSandboxes: 1000, fleetPool: 200, fleetNodes: 12, fleetWorkers: 32, fleetPauses: 200, fleetFloor: 100, fleetReadyTimeout: 30 * time.Second,
	}
}

// Report is everything a run measured; a scenario that did not run is nil.
type Report struct {
	Started time.Time
	Took    time.Duration
	Runs    int
	// CheapRuns is the runs of the script and decisions scenarios.
	CheapRuns int
	Quick     bool
	Machine   Machine
	Script    *ScriptResult
	Decision  *DecisionsResult
	HTTP      *HTTPResult
	Flood     *FloodResult
	Overload  *OverloadResult
	Keys      *KeysResult
	Replicas  *ReplicasResult
	Pool      *PoolResult
	Lifecycle *LifecycleResult
	// Migrations and Soak are the scenarios of the schema and the history over time.
	Migrations *MigrationsResult
	Soak       *SoakResult
	Scale      *ScaleResult
	GoBench    *GoBenchResult
	Fleet      *FleetResult
}

// Run runs the scenarios of cfg and returns what they measured. A scenario that fails
// stops the run: a half-measured report is not written.
func Run(ctx context.Context, env *Env, cfg Config) (*Report, error) {
	if cfg.Runs <= 0 {
		cfg.Runs = 3
	}
	for _, name := range cfg.Only {
		if !slices.Contains(Scenarios, name) {
			return nil, fmt.Errorf("unknown scenario %q (have %s)", name, strings.Join(Scenarios, ", "))
		}
	}
	if env.Dir == "" {
		return nil, errors.New("bench: Env.Dir is required")
	}
	sz := sizesFor(cfg.Quick)
	if cfg.Soak > 0 {
		sz.soakDur = cfg.Soak
	}
	// The Redis-only comparisons with redis_rate take seconds a run and sit close to
	// their targets: they get at least five runs.
	cheapRuns := cfg.Runs
	if !cfg.Quick {
		cheapRuns = max(cfg.Runs, 5)
	}
	rep := &Report{Started: time.Now(), Runs: cfg.Runs, CheapRuns: cheapRuns, Quick: cfg.Quick, Machine: describeMachine(ctx, env)}
	steps := []struct {
		name string
		run  func() error
	}{
		{"script", func() (err error) { rep.Script, err = runScript(ctx, env, cheapRuns, sz); return }},
		{"decisions", func() (err error) { rep.Decision, err = runDecisions(ctx, env, cheapRuns, sz); return }},
		{"http", func() (err error) { rep.HTTP, err = runHTTP(ctx, env, cfg.Runs, sz); return }},
		{"flood", func() (err error) { rep.Flood, err = runFlood(ctx, env, cfg.Runs, sz); return }},
		{"overload", func() (err error) { rep.Overload, err = runOverload(ctx, env, cfg.Runs, sz); return }},
		{"keys", func() (err error) { rep.Keys, err = runKeys(ctx, env, cfg.Runs, sz); return }},
		{"replicas", func() (err error) { rep.Replicas, err = runReplicas(ctx, env, cfg.Runs, sz); return }},
		{"pool", func() (err error) { rep.Pool, err = runPool(ctx, env, cfg.Quick); return }},
		{"lifecycle", func() (err error) { rep.Lifecycle, err = runLifecycle(ctx, env, cfg.Runs, sz); return }},
		{"migrations", func() (err error) { rep.Migrations, err = runMigrations(ctx, env, cfg.Runs, sz); return }},
		{"soak", func() (err error) { rep.Soak, err = runSoak(ctx, env, sz); return }},
		{"scale", func() (err error) { rep.Scale, err = runScale(ctx, env, cfg.Runs, sz); return }},
		{"gobench", func() (err error) { rep.GoBench, err = runGoBench(ctx, env, sz); return }},
		{"fleet", func() (err error) { rep.Fleet, err = runFleet(ctx, env, sz); return }},
	}
	for _, s := range steps {
		if !cfg.wants(s.name) {
			continue
		}
		start := time.Now()
		env.logf("%s: start", s.name)
		if err := s.run(); err != nil {
			return nil, fmt.Errorf("scenario %s: %w", s.name, err)
		}
		env.logf("%s: done in %s", s.name, time.Since(start).Round(100*time.Millisecond))
	}
	rep.Took = time.Since(rep.Started)
	return rep, nil
}
