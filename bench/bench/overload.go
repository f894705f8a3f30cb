package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/space-sandbox/space/internal/config"
)

// OverloadResult is the overload scenario: what space-api and the peer (chi +
// redis_rate, the same limits per client) do past their capacity, each run measuring
// both, one after the other.
//
// Capacity C is a server's creates/s under a closed loop (wrk). Then a flood of
// creates from one budget key, open loop (runRaw: it sends at its rate whatever the
// answers take, over enough connections to carry it), at Multiples × C, beside a
// quiet client on a key of its own; and the same floods again beside a slowloris.
// Per flood, over the quiet client's arm: what the server answered a second (any
// status) as a multiple of C, what the flooder got admitted against what it gets
// without the flood, and the quiet client's p99 against its own alone.
type OverloadResult struct {
	Multiples []int
	QuietSend int     // the quiet client's creates/s
	FloodRate float64 // the flooder's bucket: refill a second; burst FloodBurst
	// FloodBurst is a tenth of a second of its rate: drained within the flood's Settle.
	FloodBurst int64
	// Settle is how long each flood runs before the quiet client starts; Duration is
	// the quiet client's arm, over which every figure of a flood is read.
	Settle, Duration time.Duration
	// RefDuration is the reference arm's measured part: the flooder alone sending
	// RefMultiple × its rate, under capacity.
	RefDuration time.Duration
	RefMultiple int
	CapConns    int // wrk's connections for C
	CapDuration time.Duration
	SlowConns   int
	MaxConns    int // the most connections a flood's generator holds
	Space, Peer OverloadServer
}

// OverloadServer is one server's figures, per run.
type OverloadServer struct {
	// Capacity is C, creates/s answered 201 under the closed loop.
	Capacity []float64
	// CapacityOther counts the closed loop's answers other than 201, all runs.
	CapacityOther map[string]int
	// Reference is the flooder's 201s a second without the flood.
	Reference []float64
	// Alone is the quiet client's p99 (ms) alone.
	Alone []float64
	// Plain are the floods by Multiples; Slow the same beside the slowloris.
	Plain, Slow []*OverloadArm
	// Slowloris is what the slowloris saw, per run.
	Slowloris []SlowStats
}

// OverloadArm is one flood at Multiple × C, per run.
type OverloadArm struct {
	Multiple int
	// Asked is the rate the flood's generator was given (creates/s); Conns the
	// connections it held, in the last run.
	Asked []float64
	Conns int
	// Offered, Answered are what the generator sent and what the server answered
	// (any status) a second over the quiet client's arm, as multiples of C.
	Offered, Answered []float64
	// Admitted is the flooder's 201s a second over the same window; Goodput that
	// over the run's Reference.
	Admitted, Goodput []float64
	// The quiet client: its p99 (ms), that over its p99 alone in the same run, its
	// share of creates answered 201.
	QuietP99, QuietRatio, QuietSuccess []float64
	// RunQueue is the machine's mean runnable threads (procs_running) over the arm;
	// Busy its CPU busy (%); ServerCores the server's cores; DriverCores the driver's
	// with its load streams' processes (the flood, the quiet client, the slowloris).
	RunQueue, Busy, ServerCores, DriverCores []float64
	// RedisCores and PostgresCores are the stores' cores (the Redis process; every
	// postgres process) over the same window.
	RedisCores, PostgresCores []float64
	// Unsent are the flood's requests its generator could not send, all runs.
	Unsent                       int
	FloodOutcomes, QuietOutcomes map[string]int
}

// overloadRates are the buckets of the overload scenario's clients: bench-capacity
// has one no run empties (C is the server's, not a bucket's), bench-quiet four times
// what it sends.
func overloadRates(sz sizes) map[string]*rateEntry {
	return map[string]*rateEntry{
		"bench-capacity": {RefillRPS: 1e6, Burst: 1e6},
		"bench-flood":    {RefillRPS: sz.overFloodRate, Burst: max(1, int64(sz.overFloodRate/10))},
		"bench-quiet":    {RefillRPS: float64(4 * sz.quietSend), Burst: int64(4 * sz.quietSend)},
	}
}

// runOverload runs the overload scenario on one space-api and the peer, with one
// private Redis and one database.
func runOverload(ctx context.Context, env *Env, runs int, sz sizes) (*OverloadResult, error) {
	st, err := env.newStack(ctx)
	if err != nil {
		return nil, err
	}
	defer st.close()
	rates := overloadRates(sz)
	res := &OverloadResult{
		Multiples: sz.overMultiples, QuietSend: sz.quietSend, FloodRate: sz.overFloodRate, FloodBurst: rates["bench-flood"].Burst,
		Settle: sz.overSettle, Duration: sz.quietDur, RefDuration: sz.overRefDur, RefMultiple: 2,
		CapConns: sz.httpWorkers, CapDuration: sz.overCapDur, SlowConns: sz.overSlowConns, MaxConns: sz.overMaxConns,
	}
	// No concurrency or live cap: what bounds the work is the server's gate (and the
	// flooder's bucket), nothing per client.
	flags, err := flagsFile(map[string]quota{"bench-capacity": {}, "bench-flood": {}, "bench-quiet": {}}, rates, nil)
	if err != nil {
		return nil, err
	}
	srv, err := env.startServer(ctx, serverConfig{Name: "overload", DB: st.db, RedisAddr: st.redis.Addr, Flags: flags, Env: map[string]string{
		"SPACE_CLUSTER_ACTIVATION_ADMISSION_REFILL_RPS": "1000000",
		"SPACE_CLUSTER_ACTIVATION_ADMISSION_BURST":      "1000000",
	}})
	if err != nil {
		return nil, err
	}
	defer srv.stop()
	var limits []string
	for _, client := range []string{"bench-capacity", "bench-flood", "bench-quiet"} {
		r := rates[client]
		limits = append(limits, fmt.Sprintf("-limit=%s:%d:%d:1s", client, int(r.RefillRPS), r.Burst))
	}
	peer, err := env.startPeer(ctx, peerRedisRate, st.redis.Addr, limits...)
	if err != nil {
		return nil, err
	}
	defer peer.stop()

	servers := []*overloadTarget{{name: "space-api", srv: srv, to: &res.Space, redisPid: st.redis.Pid()},
		{name: "the peer", srv: peer, to: &res.Peer, redisPid: st.redis.Pid()}}
	for _, s := range servers {
		s.to.init(res.Multiples)
		// Unmeasured first: connections, prepared statements, the heap.
		if _, err := env.runWrk(ctx, res.capacityLoad(s.srv, sz.httpWarmUp)); err != nil {
			return nil, err
		}
	}
	for run := range runs {
		// Each step runs on both servers back to back, so that the ratios against the
		// peer compare arms minutes apart at most; which server goes first
		// alternates from run to run.
		order := []*overloadTarget{servers[run%2], servers[(run+1)%2]}
		if err := res.run(ctx, env, order); err != nil {
			return nil, err
		}
		env.logf("overload: run %d of %d done", run+1, runs)
	}
	return res, nil
}

// overloadTarget is one server of the scenario and what its runs measured.
type overloadTarget struct {
	name     string
	srv      *apiServer
	to       *OverloadServer
	redisPid int
	// The current run's C, the flooder's reference and the quiet client's p99 alone.
	c, reference, alone float64
}

func (o *OverloadServer) init(multiples []int) {
	o.CapacityOther = map[string]int{}
	for _, m := range multiples {
		o.Plain = append(o.Plain, &OverloadArm{Multiple: m, FloodOutcomes: map[string]int{}, QuietOutcomes: map[string]int{}})
		o.Slow = append(o.Slow, &OverloadArm{Multiple: m, FloodOutcomes: map[string]int{}, QuietOutcomes: map[string]int{}})
	}
}

// capacityLoad is the closed loop that measures C: wrk, the scenarios' connections.
func (res *OverloadResult) capacityLoad(srv *apiServer, d time.Duration) wrkLoad {
	return wrkLoad{Name: "capacity", URL: srv.PublicURL, Client: "bench-capacity", Body: coldBody, Connections: res.CapConns, Duration: d}
}

// quiet is the quiet client's stream on srv.
func (res *OverloadResult) quiet(srv *apiServer) load {
	return load{Name: "quiet", URL: srv.PublicURL, Client: "bench-quiet", Body: coldBody, Rate: res.QuietSend, Duration: res.Duration}
}

// run is one run on both servers, each step on one then the other: C, the flooder's
// reference, the quiet client alone; each flood; then, for each server in turn, the
// floods again beside the slowloris.
func (res *OverloadResult) run(ctx context.Context, env *Env, servers []*overloadTarget) error {
	for _, s := range servers {
		if err := res.baseline(ctx, env, s); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		env.logf("overload: %s: C %.0f creates/s, the flooder alone %.0f/s, the quiet client's p99 alone %.2f ms", s.name, s.c, s.reference, s.alone)
	}
	for i, m := range res.Multiples {
		for _, s := range servers {
			env.logf("overload: %s: flood at %d×C", s.name, m)
			if err := res.flood(ctx, env, s, s.to.Plain[i], ""); err != nil {
				return fmt.Errorf("%s: %w", s.name, err)
			}
		}
	}
	for _, s := range servers {
		slow, err := startSlowloris(ctx, s.srv.PublicURL, res.SlowConns)
		if err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		for i, m := range res.Multiples {
			env.logf("overload: %s: flood at %d×C beside the slowloris", s.name, m)
			if err = res.flood(ctx, env, s, s.to.Slow[i], "-slowloris"); err != nil {
				break
			}
		}
		stats, serr := slow.stop()
		if err := errors.Join(err, serr); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		s.to.Slowloris = append(s.to.Slowloris, *stats)
		if err := s.srv.alive(); err != nil {
			return err
		}
	}
	return nil
}

// baseline measures s's C, the flooder's reference and the quiet client alone.
func (res *OverloadResult) baseline(ctx context.Context, env *Env, s *overloadTarget) error {
	w, err := env.runWrk(ctx, res.capacityLoad(s.srv, res.CapDuration))
	if err != nil {
		return err
	}
	for k, v := range w.Outcomes {
		if k != "201" {
			s.to.CapacityOther[k] += v
		}
	}
	if s.c = w.rps("201"); s.c <= 0 {
		return fmt.Errorf("capacity: no create answered 201 (%v)", w.Outcomes)
	}
	s.to.Capacity = append(s.to.Capacity, s.c)

	// The flooder alone, over its rate and far under C: what its bucket gives it.
	ref, err := load{Name: "reference", URL: s.srv.PublicURL, Client: "bench-flood", Body: coldBody,
		Rate: max(1, int(float64(res.RefMultiple)*res.FloodRate)), Duration: res.Settle + res.RefDuration,
		Conns: 64, Raw: true}.runApart(ctx)
	if err != nil {
		return err
	}
	s.reference = float64(ref.answeredWithin("201", res.Settle, res.Settle+res.RefDuration)) / res.RefDuration.Seconds()
	s.to.Reference = append(s.to.Reference, s.reference)

	alone, err := res.quiet(s.srv).runApart(ctx)
	if err != nil {
		return err
	}
	if alone.Requests == 0 {
		return errors.New("the quiet client sent nothing alone")
	}
	s.alone = ms(alone.latency("", 99))
	s.to.Alone = append(s.to.Alone, s.alone)
	return nil
}

// flood runs one flood at arm.Multiple × C on s beside the quiet client and adds its
// figures to arm. With Env.ProfileDir, space-api's CPU profile over the quiet client's
// arm is written there, named by the flood and what it ran beside (suffix).
func (res *OverloadResult) flood(ctx context.Context, env *Env, s *overloadTarget, arm *OverloadArm, suffix string) error {
	srv, c := s.srv, s.c
	users := cpuUsers(srv, s.redisPid)
	quiet := res.quiet(srv)
	rate := max(1, int(math.Round(float64(arm.Multiple)*c)))
	// Connections enough to carry the rate at 100 ms an answer: past that, the
	// generator is a closed loop over them, and offers what they carry.
	conns := min(max(64, rate/10), res.MaxConns)
	floodLen := res.Settle + res.Duration + floodSlack
	floodOn := make(chan struct{})
	var flood, q *loadResult
	var floodErr, quietErr error
	var watch cpuWatch
	var queue float64
	var wg sync.WaitGroup
	wg.Go(func() {
		flood, floodErr = load{Name: "flood", URL: srv.PublicURL, Client: "bench-flood", Body: coldBody, Rate: rate,
			Duration: floodLen, Conns: conns, Raw: true}.runApartNotify(ctx, floodOn)
	})
	wg.Go(func() {
		<-floodOn
		if !sleepCtx(ctx, res.Settle) {
			quietErr = ctx.Err()
			return
		}
		watch = watchCPU(users...)
		stop := sampleRunQueue(&queue)
		var profiled sync.WaitGroup
		if env.ProfileDir != "" && s.name == "space-api" {
			name := fmt.Sprintf("overload-%dxC%s-%s.pprof", arm.Multiple, suffix, time.Now().UTC().Format("150405"))
			profiled.Go(func() { env.profile(ctx, srv, res.Duration-time.Second, name) })
		}
		q, quietErr = quiet.runApart(ctx)
		stop()
		profiled.Wait()
	})
	wg.Wait()
	if err := errors.Join(floodErr, quietErr); err != nil {
		return err
	}
	cpu, cores, cpuOK := watch.share()
	if q.Requests == 0 || flood.Requests == 0 {
		return fmt.Errorf("flood at %d× C: the quiet client sent %d creates, the flood %d", arm.Multiple, q.Requests, flood.Requests)
	}
	// The flood's figures over the quiet client's arm, in the flood's time (and
	// within the flood, should the quiet client's process have started late).
	from := q.First.Sub(flood.First)
	to := min(from+q.Elapsed, floodLen)
	secs := (to - from).Seconds()
	if from < 0 || secs < res.Duration.Seconds()/2 {
		return fmt.Errorf("flood at %d× C: the quiet client's arm (%s from the flood's start, %s long) is not within the flood", arm.Multiple, from, q.Elapsed)
	}
	arm.Asked = append(arm.Asked, float64(rate))
	arm.Conns = conns
	arm.Offered = append(arm.Offered, float64(flood.sentWithin(from, to))/secs/c)
	arm.Answered = append(arm.Answered, float64(flood.answeredWithin("", from, to))/secs/c)
	admitted := float64(flood.answeredWithin("201", from, to)) / secs
	arm.Admitted = append(arm.Admitted, admitted)
	if s.reference > 0 {
		arm.Goodput = append(arm.Goodput, admitted/s.reference)
	}
	p99 := ms(q.latency("", 99))
	arm.QuietP99 = append(arm.QuietP99, p99)
	if s.alone > 0 {
		arm.QuietRatio = append(arm.QuietRatio, p99/s.alone)
	}
	arm.QuietSuccess = append(arm.QuietSuccess, 100*float64(q.count("201"))/float64(q.Requests))
	arm.RunQueue = append(arm.RunQueue, queue)
	if cpuOK {
		arm.Busy = append(arm.Busy, cpu.Busy)
		arm.ServerCores = append(arm.ServerCores, cores[0])
		arm.DriverCores = append(arm.DriverCores, cores[1])
		arm.RedisCores = append(arm.RedisCores, cores[2])
		arm.PostgresCores = append(arm.PostgresCores, cores[3])
	}
	arm.Unsent += flood.Unsent
	for k, v := range flood.Outcomes {
		arm.FloodOutcomes[k] += v
	}
	for k, v := range q.Outcomes {
		arm.QuietOutcomes[k] += v
	}
	return nil
}

// sampleRunQueue samples the machine's runnable threads (/proc/stat procs_running,
// this sampler among them) every 50 ms until the returned stop, which leaves their
// mean in mean.
func sampleRunQueue(mean *float64) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		var sum, n float64
		for {
			select {
			case <-done:
				if n > 0 {
					*mean = sum / n
				}
				return
			case <-tick.C:
				if v, ok := procsRunning(); ok {
					sum += v
					n++
				}
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// procsRunning is /proc/stat's procs_running: the threads runnable now.
func procsRunning() (float64, bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, false
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "procs_running "); ok {
			n, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return n, err == nil
		}
	}
	return 0, false
}

// namedOverload is one server's figures under the name the report gives it.
type namedOverload struct {
	name string
	s    *OverloadServer
}

func (res *OverloadResult) servers() []namedOverload {
	return []namedOverload{{"space-api", &res.Space}, {"peer: chi + redis_rate", &res.Peer}}
}

// overloadCheck is one of the scenario's goals over a set of floods (plain, or beside
// the slowloris): what it measured, with the peer's figures beside (measured) or
// space-api's alone (short), and whether it is met.
type overloadCheck struct {
	measured, short string
	met             bool
}

// checks judges the goals over space-api's floods arms against the peer's peers (the
// same floods, same order).
func (res *OverloadResult) checks(arms, peers []*OverloadArm) (answered, success, quiet, goodput overloadCheck) {
	answered.met, success.met, quiet.met, goodput.met = true, true, true, true
	var a, s, q, g, as, ss, qs, gs []string
	for i, arm := range arms {
		p := peers[i]
		x := fmt.Sprintf("%d×C", arm.Multiple)
		an := summarize(arm.Answered)
		a = append(a, fmt.Sprintf("%s %s (offered %s; the peer %s of %s offered)", x, an.format("%.2fC"), summarize(arm.Offered).format("%.2fC"),
			summarize(p.Answered).format("%.2fC"), summarize(p.Offered).format("%.2fC")))
		as = append(as, x+" "+an.format("%.2fC"))
		answered.met = answered.met && an.Runs > 0 && an.Median >= 0.9
		sc := summarize(arm.QuietSuccess)
		success.met = success.met && sc.Runs > 0 && sc.Min >= 100
		s = append(s, fmt.Sprintf("%s %s (the peer %s)", x, sc.format("%.1f%%"), summarize(p.QuietSuccess).format("%.1f%%")))
		ss = append(ss, x+" "+sc.format("%.1f%%"))
		of := ratioStats(arm.QuietRatio, p.QuietRatio)
		q = append(q, fmt.Sprintf("%s %s against the peer's %s: %s of it", x, summarize(arm.QuietRatio).format("%.2f×"),
			summarize(p.QuietRatio).format("%.2f×"), of.format("%.2f")))
		qs = append(qs, x+" "+of.format("%.2f")+" of the peer's")
		quiet.met = quiet.met && of.Runs > 0 && of.Median <= 0.5
		gp := summarize(arm.Goodput)
		g = append(g, fmt.Sprintf("%s %s (%s/s; the peer %s)", x, gp.format("%.3f×"), summarize(arm.Admitted).format("%.0f"), summarize(p.Goodput).format("%.3f×")))
		gs = append(gs, x+" "+gp.format("%.3f×"))
		goodput.met = goodput.met && gp.Runs > 0 && math.Abs(gp.Median-1) <= 0.05
	}
	join := func(c *overloadCheck, long, short []string) {
		c.measured, c.short = strings.Join(long, "; "), strings.Join(short, ", ")
	}
	join(&answered, a, as)
	join(&success, s, ss)
	join(&quiet, q, qs)
	join(&goodput, g, gs)
	return
}

// targets are the scenario's goals, judged on space-api's medians (the quiet
// client's success on its worst run), the peer's figures beside.
func (res *OverloadResult) targets() []Target {
	at := res.multiples()
	answered, success, quiet, goodput := res.checks(res.Space.Plain, res.Peer.Plain)
	ts := []Target{
		{"past its capacity C (open loop at " + at + "), space-api answers ≥ 0.9 C a second, any status", answered.measured, answered.met},
		{fmt.Sprintf("a quiet client (%d/s, a key of its own) keeps 100%% success beside floods at %s", res.QuietSend, at), success.measured, success.met},
		{"the quiet client's p99 beside/alone ≤ half the peer's, beside floods at " + at, quiet.measured, quiet.met},
		{"the flooder's admitted creates/s within 5% of theirs without the flood, at " + at, goodput.measured, goodput.met},
	}
	sa, ss, sq, sg := res.checks(res.Space.Slow, res.Peer.Slow)
	var parts []string
	for _, c := range []struct {
		name string
		c    overloadCheck
	}{{"answered", sa}, {"the quiet client's success", ss}, {"its p99 ratio", sq}, {"goodput", sg}} {
		mark := ""
		if !c.c.met {
			mark = " (not met)"
		}
		parts = append(parts, c.name+mark+" "+c.c.short)
	}
	ts = append(ts, Target{fmt.Sprintf("beside a slowloris of %d connections, the four above hold", res.SlowConns), strings.Join(parts, "; "),
		sa.met && ss.met && sq.met && sg.met})
	return ts
}

// summary writes the scenario's lines of the plain-text summary.
func (res *OverloadResult) summary(b *strings.Builder) {
	for _, s := range res.servers() {
		fmt.Fprintf(b, "  overload on %s: C %s creates/s; the flooder alone %s admitted/s (rate %g); the quiet client's p99 alone %s ms\n", s.name,
			summarize(s.s.Capacity).format("%.0f"), summarize(s.s.Reference).format("%.1f"), res.FloodRate, summarize(s.s.Alone).format("%.2f"))
		for _, set := range []struct {
			name string
			arms []*OverloadArm
		}{{"", s.s.Plain}, {" beside the slowloris", s.s.Slow}} {
			for _, a := range set.arms {
				fmt.Fprintf(b, "  overload on %s, %d×C%s: offered %s, answered %s; admitted %s/s (%s); quiet p99 %s ms (%s), %s 201; run queue %s, server %s cores, driver %s; flood %s\n",
					s.name, a.Multiple, set.name, summarize(a.Offered).format("%.2fC"), summarize(a.Answered).format("%.2fC"),
					summarize(a.Admitted).format("%.1f"), summarize(a.Goodput).format("%.3f×"), summarize(a.QuietP99).format("%.2f"),
					summarize(a.QuietRatio).format("%.2f×"), summarize(a.QuietSuccess).format("%.1f%%"), summarize(a.RunQueue).format("%.1f"),
					summarize(a.ServerCores).format("%.2f"), summarize(a.DriverCores).format("%.2f"), outcomes(a.FloodOutcomes))
			}
		}
		for i, st := range s.s.Slowloris {
			fmt.Fprintf(b, "  overload on %s: slowloris run %d: %d connections, %d–%d open over %s, %d closed by the server (open %s each), %d dials, %d dial errors\n",
				s.name, i+1, st.Conns, st.MinOpen, st.MaxOpen, st.Held.Round(time.Millisecond), st.Closed, st.Lifetime.Round(time.Millisecond), st.Dials, st.DialErrors)
		}
	}
}

// markdown writes the scenario's section of docs/benchmarks.md.
func (res *OverloadResult) markdown(b *strings.Builder) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("### 9. Overload\n\n")
	w("space-api (its defaults: %s) and the peer (chi + redis_rate, each client its own limit of the same rate and burst, and no bound on its work), on one private Redis and one database. ", overloadDefaults())
	w("**Capacity C**: creates answered 201 a second under wrk (1 thread, %d connections, closed loop, %s), from a client whose bucket no run empties. ", res.CapConns, res.CapDuration)
	w("Then `bench-flood` (bucket %g/s, burst %d) floods the server **open loop** at %s: a plain HTTP/1.1 client (bench/bench/raw.go) in a process of its own, sending each create when it is due whatever the answers take, over as many connections as carry the rate at 100 ms an answer (at most %d); a create it could not send by the flood's end is not sent. It runs at the servers' CPU priority, not at nice 19 as the floods of section 4: there it got too little of a busy machine to offer 5C, and it costs about 25 µs of CPU a create, taken from the same 2 cores (the driver's cores below). ",
		res.FloodRate, res.FloodBurst, res.multiples(), res.MaxConns)
	w("After %s of flood, `bench-quiet` (a key of its own, %d creates/s, a quarter of its rate) sends for %s; every figure of a flood is read over that window: what the generator sent (offered) and what the server answered, any status, as multiples of the same run's C; the flooder's 201s a second, against its 201s without the flood (the same client alone sending %d× its rate, far under capacity: its 201s over %s after its first %s); the quiet client's p99 against its own alone in the same run, and that ratio against the peer's. Each step runs on both servers back to back (which goes first alternates from run to run), so that the ratios against the peer compare arms a minute apart at most. The targets are judged on the medians of space-api's figures, the quiet client's success on its worst run. ",
		res.Settle, res.QuietSend, res.Duration, res.RefMultiple, res.RefDuration, res.Settle)
	w("Then the same floods beside a slowloris of %d connections, in a process of its own at nice 19: each sends one byte of a request's headers a second and is opened again when the server closes it (space-api closes a connection whose headers are not in within 5 s; the peer within 10 s).\n\n", res.SlowConns)

	w("| median [min–max] | space-api | peer: chi + redis_rate |\n|---|---:|---:|\n")
	w("| capacity C, creates/s | %s | %s |\n", summarize(res.Space.Capacity).format("%.0f"), summarize(res.Peer.Capacity).format("%.0f"))
	w("| the flooder's creates admitted a second without the flood | %s | %s |\n", summarize(res.Space.Reference).format("%.1f"), summarize(res.Peer.Reference).format("%.1f"))
	w("| the quiet client's p99 alone, ms | %s | %s |\n\n", summarize(res.Space.Alone).format("%.2f"), summarize(res.Peer.Alone).format("%.2f"))

	type row struct {
		name        string
		space, peer *OverloadArm
	}
	var rows []row
	for i, m := range res.Multiples {
		rows = append(rows, row{fmt.Sprintf("%d×C", m), res.Space.Plain[i], res.Peer.Plain[i]})
	}
	for i, m := range res.Multiples {
		rows = append(rows, row{fmt.Sprintf("%d×C beside the slowloris", m), res.Space.Slow[i], res.Peer.Slow[i]})
	}
	w("Past capacity: what each server answered, and what the flooder got admitted.\n\n")
	w("| flood | space-api: offered | answered | flooder's 201/s | against without | peer: offered | answered | flooder's 201/s | against without |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		w("| %s", r.name)
		for _, a := range []*OverloadArm{r.space, r.peer} {
			w(" | %s | %s | %s | %s", summarize(a.Offered).format("%.2fC"), summarize(a.Answered).format("%.2fC"),
				summarize(a.Admitted).format("%.1f"), summarize(a.Goodput).format("%.3f×"))
		}
		w(" |\n")
	}
	w("\nThe quiet client beside each flood.\n\n")
	w("| flood | space-api: p99 ms | against alone | peer: p99 ms | against alone | space-api's ratio against the peer's | answered 201: space-api | peer |\n|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		w("| %s | %s | %s | %s | %s | %s | %s | %s |\n", r.name, summarize(r.space.QuietP99).format("%.2f"), summarize(r.space.QuietRatio).format("%.2f×"),
			summarize(r.peer.QuietP99).format("%.2f"), summarize(r.peer.QuietRatio).format("%.2f×"),
			ratioStats(r.space.QuietRatio, r.peer.QuietRatio).format("%.2f"), summarize(r.space.QuietSuccess).format("%.1f%%"), summarize(r.peer.QuietSuccess).format("%.1f%%"))
	}
	w("\nThe machine over the quiet client's arm: its runnable threads (`procs_running`, sampled every 50 ms: the run queue, 2 cores), its CPU busy, and the cores of the server, of the driver with its load streams' processes (flood, quiet client, slowloris), of Redis and of Postgres (every postgres process); what the four leave of the 2 cores is the kernel's work for no process (interrupts) and other processes'.\n\n")
	w("| flood | space-api: run queue | busy | server cores | driver cores | Redis | Postgres | peer: run queue | busy | server cores | driver cores | Redis | Postgres |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		w("| %s", r.name)
		for _, a := range []*OverloadArm{r.space, r.peer} {
			w(" | %s | %s | %s | %s | %s | %s", summarize(a.RunQueue).format("%.1f"), summarize(a.Busy).format("%.0f%%"),
				summarize(a.ServerCores).format("%.2f"), summarize(a.DriverCores).format("%.2f"),
				summarize(a.RedisCores).format("%.2f"), summarize(a.PostgresCores).format("%.2f"))
		}
		w(" |\n")
	}
	w("\nThe flood's answers, all runs, and its generator: the connections it held, and the creates it could not send by the flood's end (where it lacked the CPU or the connections to offer its rate).\n\n")
	w("| flood | space-api: answers | connections | not sent | peer: answers | connections | not sent |\n|---|---|---:|---:|---|---:|---:|\n")
	for _, r := range rows {
		w("| %s", r.name)
		for _, a := range []*OverloadArm{r.space, r.peer} {
			w(" | %s | %d | %d", outcomes(a.FloodOutcomes), a.Conns, a.Unsent)
		}
		w(" |\n")
	}
	w("\nThe quiet client's answers, every arm and run: from space-api %s; from the peer %s.\n\n", outcomes(res.quietOutcomes(&res.Space)), outcomes(res.quietOutcomes(&res.Peer)))
	for _, s := range []struct {
		name string
		s    *OverloadServer
	}{{"space-api", &res.Space}, {"the peer", &res.Peer}} {
		var parts []string
		for _, st := range s.s.Slowloris {
			closed := "none closed by the server"
			if st.Closed > 0 {
				closed = fmt.Sprintf("%d closed by the server, after %s each (median)", st.Closed, st.Lifetime.Round(100*time.Millisecond))
			}
			parts = append(parts, fmt.Sprintf("%d–%d open over %s, %s, %d dial errors", st.MinOpen, st.MaxOpen, st.Held.Round(100*time.Millisecond), closed, st.DialErrors))
		}
		w("The slowloris against %s, per run: %s.\n", s.name, strings.Join(parts, "; "))
	}
	w("\n")
}

// overloadDefaults are the overload settings space-api runs with in the scenario: its
// defaults, read from the product (a constant here still said 64 requests at work
// after the default became 32).
func overloadDefaults() string {
	return fmt.Sprintf("%d requests at work, %d waiting per budget key and %s in all, a wait of %s at most",
		config.DefaultMaxInFlight, config.DefaultMaxQueuedPerClient, thousands(config.DefaultMaxQueued), config.DefaultMaxQueueWait)
}

func (res *OverloadResult) multiples() string {
	var parts []string
	for _, m := range res.Multiples {
		parts = append(parts, fmt.Sprintf("%d×C", m))
	}
	return strings.Join(parts, " and ")
}

func (res *OverloadResult) quietOutcomes(s *OverloadServer) map[string]int {
	all := map[string]int{}
	for _, a := range append(append([]*OverloadArm{}, s.Plain...), s.Slow...) {
		for k, v := range a.QuietOutcomes {
			all[k] += v
		}
	}
	return all
}
