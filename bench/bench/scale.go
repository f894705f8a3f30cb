package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/admission"
	"github.com/space-sandbox/space/internal/config"
	"github.com/space-sandbox/space/internal/keyed"
)

// The scale scenario (`-only scale`): space-api at its users' size, a hundred thousand
// tenants, against real space-api processes built from the tree, on a private
// redis-server and a database of the bench's own.
//
// Identity: SPACE_AUTH_MODE=api_key, with one API key per tenant issued straight into
// the database (internal/apikey's format: only the SHA-256 stored) and a quota flag
// that holds a tier table and no client list. That is how a platform of a hundred
// thousand tenants runs space-api: each tenant holds a key an operator issued, the key
// table bounds the ids, so every tenant is a budget key of its own on its tier
// (flags.Env.OwnKeys) while the flag stays a few hundred bytes. The alternative, a
// trusted gateway's X-Client-ID with a quota flag allowlisting every tenant, puts a
// 100,000-entry flag in every replica and skips the per-request key lookup and the
// key's last-use record, one of the per-key maps this scenario is about. The reload
// phase is the exception: it is the flag at size, in trusted_header mode, where a
// flag's client list is what gives a client its budget key.
//
// Every tenant's bucket is emptied first, by one real decision of the product's
// Admitter each (the tier's rate, refill 0 and burst 1, under the production key
// prefix): every create of the scenario is refused by its client's own bucket, after
// the whole per-key path (the API key's lookup, the tier, the concurrency lease, the
// reservation, the two-bucket decision in Redis, the undo). An admitted create would
// add a sandbox that stays, whose state grows with sandboxes, not tenants; a create
// refused by an empty cluster bucket is refused from memory before any per-key state
// once the replica knows the cluster bucket empty.
//
//  0. Decisions/s of the product's Admitter from Go over sizes.scale.tenants full
//     client buckets against one, on a redis-server of their own.
//  1. Memory: one replica; tenants create once each, closed loop; its heap, RSS and
//     /metrics sample count at the start and after 25%, 50%, 100%, 150% and 200% of
//     sizes.scale.tenants distinct tenants, each point after a collection the bench
//     forces, with the heap profile of that collection by allocation site.
//  2. Flat in tenants: refused creates/s under wrk, closed loop, spread over the
//     tenants' keys (each request the next tenant) against all from one tenant, on the
//     memory phase's replica (at size, and SPACE_REFUSAL_CACHE_MAX_AGE=0 so that
//     every refusal of both arms is asked of Redis, the same path) and on a fresh
//     replica with the default configuration (where one tenant's flood is refused from
//     memory), the four arms in a rotating order each run.
//  3. Reload at size: a trusted_header replica whose quota flag lists
//     sizes.scale.reloadClients clients on sizes.scale.reloadTiers tiers; creates
//     refused by the clients' own buckets, open loop, spread over the clients, in
//     segments with the flags file rewritten every reloadEvery (two generations in
//     turn, write and rename) and segments without, alternating; p50 and p99 of each
//     side, the reloads the replica counted, its CPU per reload, and the time from
//     each rename to the new flag in service.
//  4. Redis: bytes per idle client key (used_memory growth and MEMORY USAGE) at
//     sizes.scale.expiryKeys keys made by real decisions, on a redis-server of their
//     own, and DBSIZE back to its baseline after their refill time.

// scaleSizes are the scale scenario's counts and durations.
type scaleSizes struct {
	tenants int // distinct tenants at the scenario's size; the memory phase goes to 2×
	warmUp  int // tenants of the unmeasured warm-up before the start point
	conns   int // connections of the memory phase's creates and of wrk

	flatDur, flatWarmUp time.Duration
	decisionsDur        time.Duration
	// settle is how long the bench waits for the API keys' last-use writes, which
	// run off the request path (gathered for a second, then one UPDATE), before a
	// memory point and after a flat arm.
	settle time.Duration

	reloadClients, reloadTiers int
	reloadRate                 int // creates/s, open loop
	reloadSegment              time.Duration
	reloadRounds               int // rounds of one quiet and one reloading segment per run
	reloadEvery, reloadPoll    time.Duration

	expiryKeys   int
	expiryRefill time.Duration
}

func scaleSizesFor(quick bool) scaleSizes {
	if quick {
		return scaleSizes{tenants: 400, warmUp: 20, conns: 4, flatDur: time.Second, decisionsDur: 300 * time.Millisecond, settle: 100 * time.Millisecond,
			reloadClients: 100, reloadTiers: 20, reloadRate: 50, reloadSegment: 600 * time.Millisecond, reloadRounds: 1,
			reloadEvery: 200 * time.Millisecond, reloadPoll: 50 * time.Millisecond,
			expiryKeys: 300, expiryRefill: time.Second}
	}
	return scaleSizes{tenants: 100_000, warmUp: 1000, conns: 16, flatDur: 3 * time.Second, flatWarmUp: time.Second, decisionsDur: 3 * time.Second, settle: 2 * time.Second,
		reloadClients: 10_000, reloadTiers: 20, reloadRate: 150, reloadSegment: 3 * time.Second, reloadRounds: 3,
		reloadEvery: 500 * time.Millisecond, reloadPoll: 50 * time.Millisecond,
		expiryKeys: 100_000, expiryRefill: time.Minute}
}

// scaleMarks are the memory phase's points, as fractions of sizes.scale.tenants.
var scaleMarks = []float64{0.25, 0.5, 1, 1.5, 2, 3, 4}

// steadyMark is the mark from which the heap must have stopped growing: twice the
// size, the size being each per-key map's bound (keyed.DefaultMax), once every map has
// been at its bound long enough for its evictions and its idle sweeps to have run.
// Between the size and twice it the heap still steps up once as they start: 23 to 36
// bytes a tenant in the recorded runs up to d3fc5d6, where a probe run to four times
// the size then read 7 bytes a tenant from twice to four times (docs/benchmarks.md,
// "A replica's heap past its maps' bound").
const steadyMark = 2

// ScaleResult is the scale scenario.
type ScaleResult struct {
	// Tenants is the scenario's size; the memory phase's last point is at Beyond, and
	// the heap is judged to have stopped growing from Steady (steadyMark) to Beyond.
	Tenants, Steady, Beyond, WarmUp, Conns int
	// Bound is keyed.DefaultMax, the entries of each per-key map of a replica;
	// BudgetKeys is SPACE_METRICS_BUDGET_KEYS's default.
	Bound, BudgetKeys int
	// Rate is every tenant's (its tier's) client rate.
	Rate space.Rate
	// Points are the memory phase's samples: the start, then each mark.
	Points []HeapPoint
	// Outcomes are the memory phase's answers; PerSec its creates a second.
	Outcomes map[string]int
	PerSec   float64

	Decisions ScaleDecisions
	Flat      ScaleFlat
	Reload    ScaleReload
	Redis     ScaleRedis
}

// ScaleDecisions is decisions/s of the product's Admitter from Go, each decision for
// a random one of Keys client keys against all for one key, per run.
type ScaleDecisions struct {
	Keys, Goroutines int
	Duration         time.Duration
	Spread, One      []float64
	// PeerSpread and PeerOne are the same for redis_rate's Allow over as many keys
	// of its own on the same server, in the same rotation: what a larger keyspace
	// costs Redis itself shows in both ratios alike.
	PeerSpread, PeerOne []float64
	// RedisCPU are the four arms' Redis main-thread CPU per decision in µs, per run,
	// in the order Spread, One, PeerSpread, PeerOne: where a larger keyspace's cost
	// lands, on the one thread every replica shares.
	RedisCPU [4][]float64
}

// ScaleFlat is the flat-in-tenants comparison.
type ScaleFlat struct {
	Keys, Connections int
	Duration, WarmUp  time.Duration
	// Spread and One are on the memory phase's replica (at size, every refusal asked
	// of Redis); FreshSpread and FreshOne on a fresh replica with the default
	// configuration.
	Spread, One, FreshSpread, FreshOne *HTTPRow
	// Touches are the API keys' last_used_at writes per refused create, by row name,
	// per run.
	Touches map[string][]float64
}

func (f *ScaleFlat) rows() []*HTTPRow { return []*HTTPRow{f.Spread, f.One, f.FreshSpread, f.FreshOne} }

// ScaleReload is the reload-at-size comparison.
type ScaleReload struct {
	Clients, Tiers, FlagBytes int
	Rate                      int
	Segment                   time.Duration
	Rounds                    int
	Every, Poll               time.Duration
	// Per run, in ms, over all its segments of each side.
	QuietP50, QuietP99, ReloadP50, ReloadP99 []float64
	// Reloads the replica counted (space_flags_reloads_total{result="success"}) in
	// the reloading segments and in the quiet ones, per run.
	Reloads, QuietReloads []float64
	// InService50 and InServiceMax are the median and the longest time, in ms, from a
	// rename of the flags file to the new flag in service (the replica's
	// space_flags_last_reload_success_timestamp_seconds), per run: the reload's own
	// time and the wait for the next poll. Observed counts the renames timed.
	InService50, InServiceMax []float64
	Observed                  int
	// CPUPerReload is the replica's CPU time in the reloading segments less that in
	// the quiet ones, divided by the reloads, in ms, per run.
	CPUPerReload []float64
	Outcomes     map[string]int
	Requests     int
}

// ScaleRedis is the Redis memory of idle client keys at size.
type ScaleRedis struct {
	Keys        int
	BytesPerKey float64
	// MemoryUsage is the mean MEMORY USAGE of the last keys made (up to 100, those
	// still there), Sampled of them: the key's own allocation, without its share of
	// the keyspace's dictionaries and expiry table that BytesPerKey includes.
	MemoryUsage float64
	Sampled     int
	// Refill is the keys' bucket's refill time from empty (burst 1 at 1/Refill a
	// second); MakeTime how long making them took.
	Refill, MakeTime time.Duration
	// DBSIZE before them (the cluster key), right after, and how long after the last
	// write it was back to Baseline.
	Baseline, Peak int64
	GoneAfter      time.Duration
}

// scaleRate is every tenant's client rate: its one token goes on the drain, and
// never comes back.
var scaleRate = space.Rate{RefillRPS: 0, Burst: 1}

// scaleCluster is the replicas' cluster bucket: too large for the scenario to empty,
// so that every refusal is the client's.
var scaleCluster = space.Rate{RefillRPS: 1_000_000, Burst: 1_000_000}

// scaleConcurrency is the tiers' concurrency cap: a lease is taken and given back
// for every create, and no arm's connections reach it (one tenant's flood over 16
// connections would otherwise be refused its place, a cheaper refusal than its
// rate's).
const scaleConcurrency = 1000

// scaleEnv is the environment of the scenario's replicas, with vars: the cluster
// bucket, and admission failing closed on a 2 s Redis timeout (as the replicas
// scenario's), so that a Redis call slowed by this loaded machine is an error, never
// a create admitted unbudgeted (failing open, a replica admits what it does not know
// to be empty, and each admission is a sandbox that stays).
func scaleEnv(vars map[string]string) map[string]string {
	out := map[string]string{
		"SPACE_CLUSTER_ACTIVATION_ADMISSION_REFILL_RPS":   strconv.FormatFloat(scaleCluster.RefillRPS, 'f', -1, 64),
		"SPACE_CLUSTER_ACTIVATION_ADMISSION_BURST":        strconv.FormatInt(scaleCluster.Burst, 10),
		"SPACE_CLUSTER_ACTIVATION_ADMISSION_FAILURE_MODE": "closed",
		"SPACE_REDIS_TIMEOUT":                             "2s",
	}
	maps.Copy(out, vars)
	return out
}

func runScale(ctx context.Context, env *Env, runs int, sz sizes) (*ScaleResult, error) {
	s := sz.scale
	res := &ScaleResult{Tenants: s.tenants, Steady: s.tenants * steadyMark, Beyond: int(float64(s.tenants) * scaleMarks[len(scaleMarks)-1]), WarmUp: s.warmUp, Conns: s.conns,
		Bound: keyed.DefaultMax, BudgetKeys: config.Default().MetricsBudgetKeys, Rate: scaleRate}

	// 4 first: its keys expire while the rest runs.
	expired, err := startExpiry(ctx, env, &res.Redis, s)
	if err != nil {
		return nil, err
	}
	defer expired.stop()
	env.logf("scale: %d idle client keys, %.0f bytes each; waiting for them to expire", res.Redis.Keys, res.Redis.BytesPerKey)

	if err := res.decisions(ctx, env, runs, s); err != nil {
		return nil, err
	}

	db, err := env.newDatabase(ctx)
	if err != nil {
		return nil, err
	}
	defer db.drop()
	rs, err := startRedis(ctx, env.Dir)
	if err != nil {
		return nil, err
	}
	defer rs.Stop()
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr, ContextTimeoutEnabled: true, ReadTimeout: 5 * time.Second})
	defer rdb.Close()

	tenants := tenantNames("tenant-", res.Beyond)
	warm := tenantNames("warm-", s.warmUp)
	all := append(append(append([]string{}, tenants...), warm...), "solo")
	keys, err := issueKeys(ctx, db, all)
	if err != nil {
		return nil, err
	}
	if err := drain(ctx, rdb, scaleCluster, scaleRate, all, 8); err != nil {
		return nil, err
	}
	env.logf("scale: %d API keys issued, their buckets emptied", len(all))

	flags, err := tierFlags(map[string]any{"standard": tierEntry(scaleRate, scaleConcurrency, 50)}, nil, 10)
	if err != nil {
		return nil, err
	}
	apiEnv := scaleEnv(map[string]string{"SPACE_AUTH_MODE": "api_key", "SPACE_FALLBACK_TIER": "standard"})
	sizedEnv := maps.Clone(apiEnv)
	sizedEnv["SPACE_REFUSAL_CACHE_MAX_AGE"] = "0"
	sized, err := env.startServer(ctx, serverConfig{Name: "scale-tenants", DB: db, RedisAddr: rs.Addr, Flags: flags, Env: sizedEnv})
	if err != nil {
		return nil, err
	}
	defer sized.stop()
	bearer := func(i int) string { return "Authorization: Bearer " + keys.secrets[i] }
	if err := res.memory(ctx, env, sized, bearer, s.settle); err != nil {
		return nil, err
	}

	fresh, err := env.startServer(ctx, serverConfig{Name: "scale-fresh", DB: db, RedisAddr: rs.Addr, Flags: flags, Env: apiEnv})
	if err != nil {
		return nil, err
	}
	defer fresh.stop()
	if err := res.flat(ctx, env, db, sized, fresh, keys, runs, s); err != nil {
		return nil, err
	}
	sized.stop()
	fresh.stop()

	if err := res.reload(ctx, env, db, rs.Addr, rdb, runs, s); err != nil {
		return nil, err
	}

	if err := expired.wait(); err != nil {
		return nil, err
	}
	env.logf("scale: %d idle client keys gone %s after their last write (refill time %s)", res.Redis.Keys, res.Redis.GoneAfter.Round(time.Millisecond), res.Redis.Refill)
	return res, nil
}

// decisions is decisions/s of the product's Admitter over r.Tenants client keys
// against one, on a redis-server of their own holding r.Tenants full buckets
// (populate: the allow path, every decision writes), 8 goroutines, the two arms in a
// rotating order each run.
func (r *ScaleResult) decisions(ctx context.Context, env *Env, runs int, s scaleSizes) error {
	d := &r.Decisions
	d.Keys, d.Goroutines, d.Duration = r.Tenants, 8, s.decisionsDur
	srv, err := startRedis(ctx, env.Dir)
	if err != nil {
		return err
	}
	defer srv.Stop()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, ReadTimeout: 5 * time.Second})
	defer rdb.Close()
	if err := populate(ctx, rdb, d.Keys); err != nil {
		return err
	}
	a, err := newAdmitter(rdb, keysPrefix, keysClientRate)
	if err != nil {
		return err
	}
	decideOn := func(key func() string) decider {
		return func(ctx context.Context) (bool, error) {
			return charge1(ctx, a, space.ClientKey(key()), &keysClientRate)
		}
	}
	lim := redis_rate.NewLimiter(rdb)
	peerOn := func(key func() string) decider {
		return func(ctx context.Context) (bool, error) {
			r, err := lim.Allow(ctx, key(), peerKeysLimit)
			return err == nil && r.Allowed == 1, err
		}
	}
	n := d.Keys
	spread := func() string { return "c" + strconv.Itoa(rand.IntN(n)) }
	one := func() string { return "c0" }
	arms := []struct {
		out, cpu *[]float64
		decide   decider
	}{
		{&d.Spread, &d.RedisCPU[0], decideOn(spread)},
		{&d.One, &d.RedisCPU[1], decideOn(one)},
		{&d.PeerSpread, &d.RedisCPU[2], peerOn(spread)},
		{&d.PeerOne, &d.RedisCPU[3], peerOn(one)},
	}
	for _, i := range []int{1, 3} { // loads the scripts
		if _, err := arms[i].decide(ctx); err != nil {
			return err
		}
	}
	for run := range runs {
		for _, arm := range rotate(arms, run) {
			var made int64
			var elapsed time.Duration
			served, err := redisCPUOf(ctx, rdb, func() (err error) {
				made, elapsed, _, err = decideFor(ctx, arm.decide, d.Goroutines, d.Duration)
				return err
			})
			if err != nil {
				return fmt.Errorf("scale decisions: %w", err)
			}
			*arm.out = append(*arm.out, float64(made)/elapsed.Seconds())
			if made > 0 {
				*arm.cpu = append(*arm.cpu, float64(served.Microseconds())/float64(made))
			}
		}
		env.logf("scale: decisions/s run %d: %s keys %.0f/s, one key %.0f/s; redis_rate %.0f/s and %.0f/s", run+1, count(n), d.Spread[run], d.One[run], d.PeerSpread[run], d.PeerOne[run])
	}
	return nil
}

// memory is phase 1: the warm-up tenants, the start point, then each mark's tenants
// and its point.
func (r *ScaleResult) memory(ctx context.Context, env *Env, srv *apiServer, header func(i int) string, settle time.Duration) error {
	create := func(host string, i int) []byte { return createRequest(host, header(i), coldBody) }
	// The warm-up tenants' keys follow the tenants' in the key table.
	if _, _, err := createEach(ctx, srv.PublicURL, create, r.Beyond, r.Beyond+r.WarmUp, r.Conns); err != nil {
		return err
	}
	point := func(n int) error {
		// The keys' last-use writes run off the request path: let them end.
		time.Sleep(settle)
		p, err := sampleHeap(ctx, srv, n, filepath.Join(env.Dir, fmt.Sprintf("scale-heap-%d.txt", n)))
		if err != nil {
			return err
		}
		r.Points = append(r.Points, p)
		env.logf("scale: %d tenants: heap in use %.1f MiB, alloc %.1f MiB, RSS %.1f MiB, %d series", n, p.HeapInuse/(1<<20), p.HeapAlloc/(1<<20), p.RSS/(1<<20), p.Series)
		return nil
	}
	if err := point(0); err != nil {
		return err
	}
	r.Outcomes = map[string]int{}
	done := 0
	var took time.Duration
	for _, m := range scaleMarks {
		to := int(float64(r.Tenants) * m)
		out, elapsed, err := createEach(ctx, srv.PublicURL, create, done, to, r.Conns)
		if err != nil {
			return err
		}
		for k, v := range out {
			r.Outcomes[k] += v
		}
		took += elapsed
		done = to
		if err := srv.alive(); err != nil {
			return err
		}
		if err := point(to); err != nil {
			return err
		}
	}
	r.PerSec = float64(done) / took.Seconds()
	return nil
}

// flat is phase 2: refused creates/s spread over the tenants against one tenant, on
// the sized replica and on a fresh one.
func (r *ScaleResult) flat(ctx context.Context, env *Env, db *database, sized, fresh *apiServer, keys *tenantKeys, runs int, s scaleSizes) error {
	f := &r.Flat
	f.Keys, f.Connections, f.Duration, f.WarmUp = r.Tenants, s.conns, max(time.Second, s.flatDur.Round(time.Second)), s.flatWarmUp
	f.Spread = &HTTPRow{Name: fmt.Sprintf("at size, %s tenants", count(r.Tenants)), Outcome: "429 client_activation"}
	f.One = &HTTPRow{Name: "at size, one tenant", Outcome: "429 client_activation"}
	f.FreshSpread = &HTTPRow{Name: fmt.Sprintf("fresh, default, %s tenants", count(r.Tenants)), Outcome: "429 client_activation"}
	f.FreshOne = &HTTPRow{Name: "fresh, default, one tenant", Outcome: "429 client_activation"}
	f.Touches = map[string][]float64{}
	values := make([]string, r.Tenants)
	for i := range values {
		values[i] = "Bearer " + keys.secrets[i]
	}
	spreadFile, err := writeLines(env.Dir, "scale-spread.txt", values)
	if err != nil {
		return err
	}
	oneFile, err := writeLines(env.Dir, "scale-one.txt", []string{"Bearer " + keys.secrets[len(keys.secrets)-1]})
	if err != nil {
		return err
	}
	// Every arm's create must be refused by its tenant's own bucket.
	for _, srv := range []*apiServer{sized, fresh} {
		for _, v := range []string{values[0], "Bearer " + keys.secrets[len(keys.secrets)-1]} {
			out, _, err := createEach(ctx, srv.PublicURL, func(host string, _ int) []byte {
				return createRequest(host, "Authorization: "+v, coldBody)
			}, 0, 1, 1)
			if err != nil {
				return err
			}
			if out["429 client_activation"] != 1 {
				return fmt.Errorf("%s: a tenant's create was answered %v, want 429 client_activation", srv.Name, out)
			}
		}
	}
	type arm struct {
		row  *HTTPRow
		srv  *apiServer
		file string
	}
	arms := []arm{{f.Spread, sized, spreadFile}, {f.One, sized, oneFile}, {f.FreshSpread, fresh, spreadFile}, {f.FreshOne, fresh, oneFile}}
	offset := 0
	load := func(a arm, d time.Duration) rotatingLoad {
		return rotatingLoad{Name: a.row.Name, URL: a.srv.PublicURL, Header: "Authorization", ValuesFile: a.file, Offset: offset,
			Body: coldBody, Connections: f.Connections, Duration: d}
	}
	run := func(a arm, d time.Duration) (*wrkResult, error) {
		res, err := env.runRotating(ctx, load(a, d))
		if err == nil && a.file == spreadFile {
			offset = (offset + res.Requests) % r.Tenants
		}
		return res, err
	}
	if f.WarmUp >= time.Second {
		for _, a := range arms {
			if _, err := run(a, f.WarmUp); err != nil {
				return err
			}
		}
	}
	for i := range runs {
		for j := range arms {
			a := arms[(i+j)%len(arms)]
			since, err := dbNow(ctx, db)
			if err != nil {
				return err
			}
			res, err := run(a, f.Duration)
			if err != nil {
				return err
			}
			a.row.addWrk(res)
			// The last-use writes of the arm's keys run off the request path.
			time.Sleep(s.settle)
			touched, err := db.queryInt(ctx, "SELECT count(*) FROM api_keys WHERE last_used_at >= $1", since)
			if err != nil {
				return err
			}
			f.Touches[a.row.Name] = append(f.Touches[a.row.Name], float64(touched)/float64(max(res.Requests, 1)))
		}
		for _, srv := range []*apiServer{sized, fresh} {
			if err := srv.alive(); err != nil {
				return err
			}
		}
		env.logf("scale: flat run %d: %s tenants %.0f/s, one %.0f/s; fresh %.0f/s, %.0f/s", i+1, count(r.Tenants),
			f.Spread.RPS[i], f.One.RPS[i], f.FreshSpread.RPS[i], f.FreshOne.RPS[i])
	}
	return nil
}

// dbNow is the database's clock.
func dbNow(ctx context.Context, db *database) (time.Time, error) {
	var t time.Time
	n, err := db.queryInt(ctx, "SELECT (extract(epoch FROM clock_timestamp()) * 1e6)::bigint")
	if err == nil {
		t = time.UnixMicro(n)
	}
	return t, err
}

// reload is phase 3.
func (r *ScaleResult) reload(ctx context.Context, env *Env, db *database, redisAddr string, rdb *redis.Client, runs int, s scaleSizes) error {
	l := &r.Reload
	l.Clients, l.Tiers, l.Rate, l.Segment, l.Rounds, l.Every, l.Poll = s.reloadClients, s.reloadTiers, s.reloadRate, s.reloadSegment, s.reloadRounds, s.reloadEvery, s.reloadPoll
	l.Outcomes = map[string]int{}
	clients := tenantNames("reload-", l.Clients)
	if err := drain(ctx, rdb, scaleCluster, scaleRate, clients, 8); err != nil {
		return err
	}
	tiers := map[string]any{}
	for i := range l.Tiers {
		tiers["tier-"+strconv.Itoa(i)] = tierEntry(scaleRate, scaleConcurrency+i, 20+i)
	}
	listed := map[string]any{}
	for i, c := range clients {
		listed[c] = map[string]any{"tier": "tier-" + strconv.Itoa(i%l.Tiers)}
	}
	// The two generations differ in the "default" entry's concurrency, which no
	// listed client is under (each tier sets its own): every reload is a whole new
	// flag to read, parse and swap, and changes nothing a request is decided by.
	var gens [2]string
	for g := range gens {
		var err error
		if gens[g], err = tierFlags(tiers, listed, 10+g); err != nil {
			return err
		}
	}
	l.FlagBytes = len(gens[0])
	srv, err := env.startServer(ctx, serverConfig{Name: "scale-reload", DB: db, RedisAddr: redisAddr, Flags: gens[0],
		Env: scaleEnv(map[string]string{"SPACE_FALLBACK_TIER": "tier-0", "SPACE_FLAGS_POLL_INTERVAL": l.Poll.String()})})
	if err != nil {
		return err
	}
	defer srv.stop()
	path := filepath.Join(env.Dir, "scale-reload-flags.json")
	gen := 0
	rewrite := func() error {
		gen = 1 - gen
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(gens[gen]), 0o600); err != nil {
			return err
		}
		return os.Rename(tmp, path)
	}
	next := 0
	// inService reads when the replica last put a new flag in service.
	inService := func() (time.Time, error) {
		v, err := srv.metric(ctx, "space_flags_last_reload_success_timestamp_seconds")
		return time.Unix(0, int64(v*1e9)), err
	}
	var waits []time.Duration // rename to in service, of the segments since the last reset
	segment := func(reloading bool, d time.Duration) (*loadResult, float64, uint64, error) {
		rotated := append(append([]string{}, clients[next:]...), clients[:next]...)
		before, err := srv.metric(ctx, "space_flags_reloads_total", "result", "success")
		if err != nil {
			return nil, 0, 0, err
		}
		_, t0, _ := readProcTicks("/proc/" + strconv.Itoa(srv.pid()))
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var werr error
		rewrites := 0
		// The last rename; the replica's swap time read just before the next is its
		// wait (Every is longer than the poll interval). The quiet segments read the
		// metric as often, so that both sides serve the same scrapes.
		var renamed time.Time
		observe := func() error {
			at, err := inService()
			if err == nil && !renamed.IsZero() && at.After(renamed) {
				waits = append(waits, at.Sub(renamed))
			}
			renamed = time.Time{}
			return err
		}
		wg.Go(func() {
			tick := time.NewTicker(l.Every)
			defer tick.Stop()
			for {
				if werr = observe(); werr != nil {
					return
				}
				// Each rename a random part of a poll interval after the tick: Every
				// is a multiple of the poll interval, and renames in step with the
				// polls would all wait the same.
				select {
				case <-stop:
					return
				case <-time.After(rand.N(l.Poll)):
				}
				if reloading {
					if werr = rewrite(); werr != nil {
						return
					}
					renamed = time.Now()
					rewrites++
				}
				select {
				case <-stop:
					return
				case <-tick.C:
				}
			}
		})
		res := load{Name: "reload", URL: srv.PublicURL, Clients: rotated, Body: coldBody, Rate: l.Rate, Duration: d}.run(ctx)
		close(stop)
		wg.Wait()
		_, t1, _ := readProcTicks("/proc/" + strconv.Itoa(srv.pid()))
		if werr != nil {
			return nil, 0, 0, fmt.Errorf("rewrite the flags file: %w", werr)
		}
		// A rename in the segment's last poll interval is reloaded just after it: the
		// next segment starts once the replica has reloaded every rewrite (two renames
		// within one poll are one reload), or 5 s on.
		var after float64
		for deadline := time.Now().Add(5 * time.Second); ; {
			if after, err = srv.metric(ctx, "space_flags_reloads_total", "result", "success"); err != nil {
				return nil, 0, 0, err
			}
			if after-before >= float64(rewrites) || time.Now().After(deadline) {
				break
			}
			time.Sleep(l.Poll / 2)
		}
		// The counter is incremented just before the timestamp is set.
		for deadline := time.Now().Add(2 * time.Second); !renamed.IsZero(); {
			at, err := inService()
			if err != nil {
				return nil, 0, 0, err
			}
			if at.After(renamed) || time.Now().After(deadline) {
				break
			}
			time.Sleep(l.Poll / 10)
		}
		if err := observe(); err != nil {
			return nil, 0, 0, err
		}
		next = (next + res.Requests) % len(clients)
		return res, after - before, t1 - t0, nil
	}
	// Unmeasured first: connections, statements and the Go heap settle.
	if _, _, _, err := segment(true, l.Segment); err != nil {
		return err
	}
	for i := range runs {
		waits = waits[:0]
		var quiet, busy []*loadResult
		var reloads, quietReloads float64
		var quietTicks, busyTicks uint64
		for round := range l.Rounds {
			for k := range 2 {
				reloading := (i+round+k)%2 == 1
				res, n, ticks, err := segment(reloading, l.Segment)
				if err != nil {
					return err
				}
				if reloading {
					busy, reloads, busyTicks = append(busy, res), reloads+n, busyTicks+ticks
				} else {
					quiet, quietReloads, quietTicks = append(quiet, res), quietReloads+n, quietTicks+ticks
				}
				for k, v := range res.Outcomes {
					l.Outcomes[k] += v
				}
				l.Requests += res.Requests
			}
		}
		q, b := merge(quiet), merge(busy)
		l.QuietP50 = append(l.QuietP50, ms(q.latency("", 50)))
		l.QuietP99 = append(l.QuietP99, ms(q.latency("", 99)))
		l.ReloadP50 = append(l.ReloadP50, ms(b.latency("", 50)))
		l.ReloadP99 = append(l.ReloadP99, ms(b.latency("", 99)))
		l.Reloads = append(l.Reloads, reloads)
		l.QuietReloads = append(l.QuietReloads, quietReloads)
		wait50 := 0.0
		if len(waits) > 0 {
			wait50 = ms(percentile(waits, 50))
			l.InService50 = append(l.InService50, wait50)
			l.InServiceMax = append(l.InServiceMax, ms(slices.Max(waits)))
			l.Observed += len(waits)
		}
		if reloads > 0 {
			l.CPUPerReload = append(l.CPUPerReload, (float64(busyTicks)-float64(quietTicks))*1000/clockTicks/reloads)
		}
		if err := srv.alive(); err != nil {
			return err
		}
		env.logf("scale: reload run %d: p99 %.2f ms quiet, %.2f ms reloading (%.0f reloads; %d timed, rename to in service %.0f ms at the median)", i+1, l.QuietP99[i], l.ReloadP99[i], reloads, len(waits), wait50)
	}
	return nil
}

// tierEntry is one tier of the quota flag: rate, concurrency cap and live cap.
func tierEntry(rate space.Rate, concurrency, live int) map[string]any {
	return map[string]any{"refill_rps": rate.RefillRPS, "burst": rate.Burst, "concurrency": concurrency, "live_sandboxes": live}
}

// tierFlags renders a flags file whose quota flag has the tier table tiers, the
// clients listed (nil: none) and the default concurrency def, and an empty warm pool.
func tierFlags(tiers, clients map[string]any, def int) (string, error) {
	quota := map[string]any{"tiers": tiers, "default": quota{Concurrency: def, LiveSandboxes: 50}}
	if clients != nil {
		quota["clients"] = clients
	}
	variant := func(v any) map[string]any {
		return map[string]any{"state": "ENABLED", "variants": map[string]any{"on": v}, "defaultVariant": "on"}
	}
	b, err := json.Marshal(map[string]any{"flags": map[string]any{
		"space-api-client-concurrency-quotas": variant(quota),
		"space-api-warm-pool":                 variant(map[string]any{"shapes": []poolShape{}}),
	}})
	if err != nil {
		return "", fmt.Errorf("flags file: %w", err)
	}
	return string(b), nil
}

// expiry is phase 4, whose keys expire while the other phases run.
type expiry struct {
	done chan error
	stop func()
}

func (e *expiry) wait() error { return <-e.done }

// startExpiry makes s.expiryKeys idle client keys by real decisions on a redis-server
// of their own, measures their memory, and polls DBSIZE in the background until it is
// back to what it was before them.
func startExpiry(ctx context.Context, env *Env, res *ScaleRedis, s scaleSizes) (*expiry, error) {
	srv, err := startRedis(ctx, env.Dir)
	if err != nil {
		return nil, err
	}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, ReadTimeout: 5 * time.Second})
	cleanup := func() { rdb.Close(); srv.Stop() }
	rate := space.Rate{RefillRPS: 1 / s.expiryRefill.Seconds(), Burst: 1}
	res.Keys, res.Refill = s.expiryKeys, s.expiryRefill
	a, err := newAdmitter(rdb, keysPrefix, scaleCluster)
	if err != nil {
		cleanup()
		return nil, err
	}
	// The cluster key is there before and after (it lives far longer): what must go
	// is the client keys.
	if _, err := charge1(ctx, a, "", nil); err != nil {
		cleanup()
		return nil, err
	}
	fail := func(err error) (*expiry, error) { cleanup(); return nil, err }
	if res.Baseline, err = rdb.DBSize(ctx).Result(); err != nil {
		return fail(fmt.Errorf("DBSIZE: %w", err))
	}
	before, err := infoInt(ctx, rdb, "memory", "used_memory")
	if err != nil {
		return fail(err)
	}
	start := time.Now()
	if err := admitEach(ctx, a, "idle-", &rate, s.expiryKeys, 8); err != nil {
		return fail(err)
	}
	last := time.Now()
	res.MakeTime = last.Sub(start)
	after, err := infoInt(ctx, rdb, "memory", "used_memory")
	if err != nil {
		return fail(err)
	}
	if res.Peak, err = rdb.DBSize(ctx).Result(); err != nil {
		return fail(fmt.Errorf("DBSIZE: %w", err))
	}
	// Bytes per key over the keys still there: on a slow machine the first may have
	// expired before the last was made.
	if res.Peak <= res.Baseline {
		return fail(fmt.Errorf("DBSIZE %d after making %d keys, baseline %d: they expired before the last was made (%s, refill %s)", res.Peak, s.expiryKeys, res.Baseline, res.MakeTime, s.expiryRefill))
	}
	res.BytesPerKey = float64(after-before) / float64(res.Peak-res.Baseline)
	var usage int64
	for i := max(0, s.expiryKeys-100); i < s.expiryKeys; i++ {
		key := admission.ClientKey(keysPrefix, space.ClientKey("idle-"+strconv.Itoa(i)))
		n, err := rdb.MemoryUsage(ctx, key, 0).Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			return fail(fmt.Errorf("MEMORY USAGE: %w", err))
		}
		usage += n
		res.Sampled++
	}
	if res.Sampled > 0 {
		res.MemoryUsage = float64(usage) / float64(res.Sampled)
	}

	pollCtx, cancel := context.WithCancel(ctx)
	e := &expiry{done: make(chan error, 1), stop: func() { cancel(); cleanup() }}
	go func() {
		deadline := last.Add(s.expiryRefill + time.Minute)
		for {
			size, err := rdb.DBSize(pollCtx).Result()
			if err != nil {
				e.done <- fmt.Errorf("DBSIZE: %w", err)
				return
			}
			if size <= res.Baseline {
				res.GoneAfter = time.Since(last)
				e.done <- nil
				return
			}
			if time.Now().After(deadline) {
				e.done <- fmt.Errorf("%d of %d idle keys still there %s after their last write (refill time %s)", size-res.Baseline, s.expiryKeys, time.Since(last).Round(time.Second), s.expiryRefill)
				return
			}
			select {
			case <-pollCtx.Done():
				e.done <- pollCtx.Err()
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return e, nil
}
