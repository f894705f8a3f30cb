package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// NeighbourResult is the flood scenario's second part: the create latency of a quiet
// client alone, beside a flood at a fixed rate (open loop) and beside a flood as fast
// as wrk goes (closed loop), each run's three arms back to back on the same server.
// The flooder is over its rate throughout, so nearly all its creates are refused.
//
// The fixed flood starts with the flooder's bucket full (it refilled while the quiet
// client ran alone): its first creates are admitted, cold, as its burst allows, and
// only then is it a flood over its rate. The quiet client's creates sent in the
// flood's first Settle are its p99 beside that burst (BurstP99, reported, no target);
// FixedP99 is those sent after, beside the flood over its rate.
type NeighbourResult struct {
	QuietSend   int // the quiet client's creates/s, well within its rate
	FixedFlood  int // the fixed flood's creates/s
	FloodConns  int // the fixed flood's connections
	Connections int // wrk's connections for the flood as fast as it goes
	Duration    string
	Settle      time.Duration

	// What space-api and the peer (chi + redis_rate, the same limits per client, the
	// same floods) did; APIKey is space-api in api_key mode, each client sending its
	// API key (a flood by one key).
	Space, APIKey, Peer NeighbourArms
}

// neighbourServer is a server of the quiet neighbour's arms, and the clients' API
// keys when it identifies them by key (nil: by X-Client-ID).
type neighbourServer struct {
	srv  *apiServer
	keys map[string]string
}

// NeighbourArms are one server's figures per run: the quiet client's p99 (ms) by arm,
// its worst success, the flooder's answers per second.
type NeighbourArms struct {
	Alone, Burst, Fixed, Saturated []float64
	// Success is the quiet client's share of creates answered 201, the worst of the
	// three arms.
	Success []float64
	// FixedFloodRPS and SaturatedFloodRPS are the flooder's answers per second.
	FixedFloodRPS, SaturatedFloodRPS []float64
	// Outcomes are the quiet client's answers, all arms and runs.
	Outcomes map[string]int
	// Server is the quiet client's p99 (ms) inside the server, from its access log
	// (space-api only: the peers log no requests). Busy and Steal are the machine's
	// CPU time during each arm, in percent: what its processes used, and what the
	// hypervisor gave to other guests while a vCPU here was ready to run.
	Server, Busy, Steal ArmSet
	// Cores are the CPU seconds a second each process of cpuUserNames (by index) used
	// during each arm.
	Cores []ArmSet
	// Sent are the quiet client's creates in each arm's measured part, and Logged
	// those of them the server's log holds (space-api only): the smoke test's check
	// that the log is read back whole.
	Sent, Logged ArmSet
	// Steps are the mean wait (ms) of each step of the activations space-api made
	// during each arm (space_sandbox_activation_step_seconds), by activationSteps'
	// index: where a create's time went, beside each flood; SlowSteps the share (%)
	// of those waits over a millisecond, where the tail went. Space-api only.
	Steps, SlowSteps []ArmSet
}

// activationSteps are the steps of space_sandbox_activation_step_seconds that a
// create takes, in its order.
var activationSteps = []string{"place", "book", "charge", "start", "finish"}

// stepWatch is the sums and counts of each activation step's histogram on a
// space-api at a moment; nil for a server with no internal listener (the peers).
type stepWatch struct {
	sum, count, fast []float64 // fast: the waits of at most slowStep
}

// slowStep is the wait past which a step counts as slow: a bucket bound of the
// step histogram, and several times what a round trip takes on an idle machine.
const slowStep = "0.001"

// watchSteps reads srv's activation step histograms; nil when it has none to read.
func watchSteps(srv *apiServer) *stepWatch {
	if srv.InternalURL == "" {
		return nil
	}
	body, err := httpGet(context.Background(), srv.InternalURL+"/metrics")
	if err != nil {
		return nil
	}
	w := &stepWatch{}
	for _, st := range activationSteps {
		w.sum = append(w.sum, sumMetric(body, "space_sandbox_activation_step_seconds_sum", "kind", "create", "step", st))
		w.count = append(w.count, sumMetric(body, "space_sandbox_activation_step_seconds_count", "kind", "create", "step", st))
		w.fast = append(w.fast, sumMetric(body, "space_sandbox_activation_step_seconds_bucket", "kind", "create", "step", st, "le", slowStep))
	}
	return w
}

// since returns each step's mean wait in ms since w, and the share (%) of its waits
// over slowStep, from srv's histograms now; nil when either reading is missing. A
// step with no activation meanwhile reads 0 in both.
func (w *stepWatch) since(srv *apiServer) (means, slow []float64) {
	now := watchSteps(srv)
	if w == nil || now == nil {
		return nil, nil
	}
	means, slow = make([]float64, len(activationSteps)), make([]float64, len(activationSteps))
	for i := range activationSteps {
		if n := now.count[i] - w.count[i]; n > 0 {
			means[i] = 1000 * (now.sum[i] - w.sum[i]) / n
			slow[i] = max(0, 100*(n-(now.fast[i]-w.fast[i]))/n)
		}
	}
	return means, slow
}

// cpuUserNames name the processes whose CPU the quiet neighbour's arms report: what
// shares the machine's cores with the server while it answers.
var cpuUserNames = []string{"the server", "the driver and its load generators (wrk apart)", "Redis", "Postgres (every backend)"}

// cpuUsers are the processes of cpuUserNames: the server, this process with the
// load streams it runs apart, the scenario's Redis, and every process named
// postgres.
func cpuUsers(srv *apiServer, redisPid int) []cpuUser {
	return []cpuUser{
		{pids: []int{srv.pid()}},
		{pids: []int{os.Getpid()}, streams: true},
		{pids: []int{redisPid}},
		{names: []string{"postgres"}},
	}
}

// ArmSet is one figure of the three arms the quiet neighbour's target compares, per
// run; the fixed flood's are those of its part after Settle, as its p99.
type ArmSet struct{ Alone, Fixed, Saturated []float64 }

// armFigures are what one arm measured besides the driver's latencies.
type armFigures struct {
	serverP99 float64 // ms; 0 where the server logs no requests
	logged    int     // the quiet client's creates read back from the server's log
	cpu       CPUShare
	cores     []float64 // by cpuUserNames
	cpuOK     bool
	steps     []float64 // by activationSteps, ms; nil for a peer
	slowSteps []float64 // by activationSteps, % over slowStep; nil for a peer
}

// add appends one run's figures of the three arms.
func (a *NeighbourArms) add(alone, fixed, saturated armFigures) {
	type figure struct {
		to  *ArmSet
		get func(armFigures) (float64, bool)
	}
	figures := []figure{
		{&a.Server, func(f armFigures) (float64, bool) { return f.serverP99, f.serverP99 > 0 }},
		{&a.Logged, func(f armFigures) (float64, bool) { return float64(f.logged), f.serverP99 > 0 }},
		{&a.Busy, func(f armFigures) (float64, bool) { return f.cpu.Busy, f.cpuOK }},
		{&a.Steal, func(f armFigures) (float64, bool) { return f.cpu.Steal, f.cpuOK }},
	}
	if a.Cores == nil {
		a.Cores = make([]ArmSet, len(cpuUserNames))
	}
	if a.Steps == nil {
		a.Steps, a.SlowSteps = make([]ArmSet, len(activationSteps)), make([]ArmSet, len(activationSteps))
	}
	// at is xs's i-th figure, when the arm has it.
	at := func(xs []float64, i int) (float64, bool) {
		if i >= len(xs) {
			return 0, false
		}
		return xs[i], true
	}
	for i := range a.Steps {
		figures = append(figures,
			figure{&a.Steps[i], func(f armFigures) (float64, bool) { return at(f.steps, i) }},
			figure{&a.SlowSteps[i], func(f armFigures) (float64, bool) { return at(f.slowSteps, i) }})
	}
	for i := range a.Cores {
		figures = append(figures, figure{&a.Cores[i], func(f armFigures) (float64, bool) {
			if !f.cpuOK {
				return 0, false
			}
			return at(f.cores, i)
		}})
	}
	for _, x := range figures {
		for _, arm := range []struct {
			to *[]float64
			f  armFigures
		}{{&x.to.Alone, alone}, {&x.to.Fixed, fixed}, {&x.to.Saturated, saturated}} {
			if v, ok := x.get(arm.f); ok {
				*arm.to = append(*arm.to, v)
			}
		}
	}
}

// armWatch is an arm's measured part begun: where the server's log was, the CPU
// counters, space-api's activation step histograms (nil for a peer), and when.
type armWatch struct {
	srv   *apiServer
	mark  logMark
	cpu   cpuWatch
	steps *stepWatch
	start time.Time
}

func watchArm(srv *apiServer, users []cpuUser) armWatch {
	return armWatch{srv: srv, mark: markLog(srv.LogPath), cpu: watchCPU(users...), steps: watchSteps(srv), start: time.Now()}
}

// figures reads the arm's figures besides the driver's, once its measured part is
// over: the server's own p99 of the quiet client's creates begun since the watch,
// and the CPU shares since then.
func (w armWatch) figures() (armFigures, error) {
	var f armFigures
	f.cpu, f.cores, f.cpuOK = w.cpu.share()
	f.steps, f.slowSteps = w.steps.since(w.srv)
	ls, err := w.mark.serverLatencies("bench-quiet", w.start)
	if err != nil {
		return f, err
	}
	if len(ls) > 0 {
		f.serverP99 = ms(percentile(ls, 99))
		f.logged = len(ls)
	}
	return f, nil
}

// floodSlack is how much longer than the quiet client's arm the fixed flood runs: the
// quiet client's process starts only once the flood's is sending, and may take that
// long to send its own first create.
const floodSlack = 2 * time.Second

// runNeighbour measures the quiet neighbour on srv, whose flags give bench-quiet a
// rate far above what it sends and bench-flood the flood scenario's rate, then the
// same arms on peer (chi + redis_rate, with the same limits).
func runNeighbour(ctx context.Context, env *Env, srv *apiServer, keyed neighbourServer, peer *apiServer, redisPid, runs int, sz sizes) (*NeighbourResult, error) {
	res := &NeighbourResult{QuietSend: sz.quietSend, FixedFlood: sz.fixedFlood, FloodConns: sz.floodConns, Connections: sz.httpWorkers,
		Duration: sz.quietDur.String(), Settle: sz.floodDur / 8}
	for range runs {
		for _, s := range []struct {
			on neighbourServer
			to *NeighbourArms
		}{{neighbourServer{srv: srv}, &res.Space}, {keyed, &res.APIKey}, {neighbourServer{srv: peer}, &res.Peer}} {
			if err := res.arms(ctx, env, s.on, redisPid, sz, s.to); err != nil {
				return nil, err
			}
		}
	}
	env.logf("flood: quiet neighbour done")
	return res, nil
}

// namedArms are one server's arms under the name the report gives it.
type namedArms struct {
	name string
	arms NeighbourArms
}

// servers are space-api's arms, in api_key mode too, and the peer's.
func (n *NeighbourResult) servers() []namedArms {
	return []namedArms{{"space-api", n.Space}, {"space-api, api_key", n.APIKey}, {"peer: chi + redis_rate", n.Peer}}
}

// arms runs the three arms once against srv: the quiet client alone, beside the fixed
// flood (the quiet client's creates split at Settle), beside wrk's flood; and adds the
// run's figures to to.
func (n *NeighbourResult) arms(ctx context.Context, env *Env, on neighbourServer, redisPid int, sz sizes, to *NeighbourArms) error {
	srv := on.srv
	users := cpuUsers(srv, redisPid)
	quiet := load{Name: "quiet", URL: srv.PublicURL, Client: "bench-quiet", Key: on.keys["bench-quiet"], Body: coldBody, Rate: sz.quietSend, Duration: sz.quietDur}
	succeeded := func(l *loadResult) float64 { return 100 * float64(l.count("201")) / float64(max(l.Requests, 1)) }
	watch := watchArm(srv, users)
	alone, err := quiet.runApart(ctx)
	if err != nil {
		return err
	}
	aloneFig, err := watch.figures()
	if err != nil {
		return err
	}

	// The quiet client starts once the fixed flood's process is sending (at the
	// lowest priority, on a busy machine, its start can take longer than the whole
	// arm), and runs Settle longer than alone, so that as many of its creates as alone
	// are sent beside the flood over its rate. The flood runs floodSlack longer, for
	// the quiet client's own start; only the quiet creates sent while it ran count.
	var fixed, flood *loadResult
	var fixedErr, floodErr error
	var wg sync.WaitGroup
	floodOn := make(chan struct{})
	wg.Go(func() {
		flood, floodErr = load{Name: "fixed flood", URL: srv.PublicURL, Client: "bench-flood", Key: on.keys["bench-flood"], Body: coldBody, Rate: sz.fixedFlood,
			Duration: n.Settle + sz.quietDur + floodSlack, Conns: sz.floodConns, Raw: true, Yield: true}.runApartNotify(ctx, floodOn)
	})
	wg.Go(func() {
		<-floodOn
		wg.Go(func() {
			// The arm's figures, as its p99, are those after Settle.
			time.Sleep(n.Settle)
			watch = watchArm(srv, users)
		})
		q := quiet
		q.Duration += n.Settle
		fixed, fixedErr = q.runApart(ctx)
	})
	wg.Wait()
	if err := errors.Join(floodErr, fixedErr); err != nil {
		return err
	}
	// The server's own p99 too is of the creates begun after the flood's Settle,
	// counted from the flood's first request (the CPU counters were read at Settle
	// from the streams' start, a process's start-up earlier).
	if s := flood.First.Add(n.Settle); s.After(watch.start) {
		watch.start = s
	}
	fixedFig, err := watch.figures()
	if err != nil {
		return err
	}

	var saturated *loadResult
	var wrk *wrkResult
	var wrkErr error
	var saturatedFig armFigures
	var saturatedErr error
	wg.Go(func() {
		wrk, wrkErr = env.runWrk(ctx, wrkLoad{Name: "saturating flood", URL: srv.PublicURL, Client: "bench-flood", Key: on.keys["bench-flood"], Body: coldBody,
			Connections: sz.httpWorkers, Duration: sz.quietDur + time.Second, Yield: true})
	})
	wg.Go(func() {
		// wrk connects first; the quiet client starts once the flood is on, and ends
		// before it (wrk runs a second longer): every create of its arm is beside it.
		time.Sleep(100 * time.Millisecond)
		watch := watchArm(srv, users)
		if saturated, saturatedErr = quiet.runApart(ctx); saturatedErr == nil {
			saturatedFig, saturatedErr = watch.figures()
		}
	})
	wg.Wait()
	if err := errors.Join(wrkErr, saturatedErr); err != nil {
		return err
	}
	if err := srv.alive(); err != nil {
		return err
	}
	if alone.Requests == 0 || fixed.Requests == 0 || saturated.Requests == 0 {
		return fmt.Errorf("neighbour: the quiet client sent nothing")
	}
	to.Alone = append(to.Alone, ms(alone.latency("", 99)))
	// The flood's burst is the Settle after the flood's first request, which its
	// process sent before the quiet client's first; its over-the-rate part lasts until
	// its last request. Both windows are read in the quiet client's time.
	burst := flood.First.Sub(fixed.First)
	over := burst + n.Settle
	end := max(flood.First.Add(flood.Elapsed).Sub(fixed.First), over+1)
	to.Burst = append(to.Burst, ms(fixed.latencyWithin(max(burst, 0), max(over, 0), 99)))
	to.Fixed = append(to.Fixed, ms(fixed.latencyWithin(max(over, 0), end, 99)))
	to.Sent.Alone = append(to.Sent.Alone, float64(alone.Requests))
	to.Sent.Fixed = append(to.Sent.Fixed, float64(fixed.countWithin(max(over, 0), end)))
	to.Sent.Saturated = append(to.Sent.Saturated, float64(saturated.Requests))
	to.Saturated = append(to.Saturated, ms(saturated.latency("", 99)))
	to.add(aloneFig, fixedFig, saturatedFig)
	to.Success = append(to.Success, min(succeeded(alone), succeeded(fixed), succeeded(saturated)))
	to.FixedFloodRPS = append(to.FixedFloodRPS, flood.rps(""))
	to.SaturatedFloodRPS = append(to.SaturatedFloodRPS, float64(wrk.Requests)/max(wrk.Elapsed.Seconds(), 1e-9))
	if to.Outcomes == nil {
		to.Outcomes = map[string]int{}
	}
	for _, l := range []*loadResult{alone, fixed, saturated} {
		for k, v := range l.Outcomes {
			to.Outcomes[k] += v
		}
	}
	return nil
}

// targets are the quiet neighbour's goals: its p99 within 2× of its own alone under
// the flood as fast as wrk goes, whether clients are named by a gateway's header or
// by their API keys, and every create answered 201. Beside the fixed flood its p99 is
// reported with no goal: its ratio moved by 3× between runs of one build, the peer's
// too; the overload scenario's goals, each read against the peer in the same run,
// took its place.
func (n *NeighbourResult) targets() []Target {
	saturated := ratioStats(n.Space.Saturated, n.Space.Alone)
	keyed := ratioStats(n.APIKey.Saturated, n.APIKey.Alone)
	success := summarize(append(append([]float64{}, n.Space.Success...), n.APIKey.Success...))
	return []Target{
		{"a quiet neighbour's p99 ≤ 2× its own alone, beside a flood as fast as wrk goes", saturated.format("%.2f×"), saturated.Median <= 2},
		{"the same in api_key mode, the flood sent with one API key", keyed.format("%.2f×"), keyed.Median <= 2},
		{"the quiet neighbour keeps 100% success beside both floods, in both modes", success.format("%.1f%%"), success.Min >= 100},
	}
}
