package bench

import (
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Target is one of the bench's targets, judged on the run's medians.
type Target struct {
	Name     string
	Measured string
	Met      bool
}

// Targets judges the run against the targets; a scenario that did not run has none.
func (r *Report) Targets() []Target {
	var ts []Target
	if s := r.Script; s != nil {
		// Judged on the instructions Redis ran (callgrind): the CPU a call costs Redis,
		// which no other work on the machine moves. The wall time in Redis and its
		// thread's CPU time are shown beside, with their spread.
		ratio := func(a, b *ScriptCell) (instr float64, text string) {
			instr = a.Instructions / b.Instructions
			return instr, fmt.Sprintf("%.2f× instructions (µs %s, process CPU time %s)", instr,
				ratioStats(a.Usec, b.Usec).format("%.2f×"), ratioStats(a.CPUUsec, b.CPUUsec).format("%.2f×"))
		}
		worst := 0.0
		var parts []string
		for _, path := range []string{"allow", "reject"} {
			instr, text := ratio(s.Cell(implSpace, path), s.Cell(implRedisRate, path))
			worst = max(worst, instr)
			parts = append(parts, path+" "+text)
		}
		ts = append(ts, Target{"two-bucket Redis CPU per call ≤ 1.15× redis_rate's", strings.Join(parts, ", "), worst <= 1.15})
		for _, x := range []struct {
			impl, name string
			bound      float64
		}{
			{implSpaceSoft, "with a soft limit ≤ 1.15×", 1.15},
			{implSpaceReserved, "for a tier with a reserve ≤ 1.3×", 1.3},
		} {
			instr, text := ratio(s.Cell(x.impl, "allow"), s.Cell(implSpace, "allow"))
			ts = append(ts, Target{"Redis CPU per admitted activation " + x.name + " the two-bucket script's", text, instr <= x.bound})
		}
	}
	if d := r.Decision; d != nil {
		// The goal is at 8 and 32 goroutines, where a replica's request path runs;
		// one goroutine is shown beside them.
		worst := 1e9
		var parts []string
		for _, topo := range []string{"standalone", "cluster"} {
			for _, g := range []int{1, 8, 32} {
				st := ratioStats(d.Cell(implSpace, topo, g).PerSec, d.Cell(implRedisRate, topo, g).PerSec)
				if g > 1 {
					worst = min(worst, st.Median)
				}
				parts = append(parts, fmt.Sprintf("%s/%d %.2f×", topo, g, st.Median))
			}
		}
		ts = append(ts, Target{"decisions/s from Go ≥ 1.0× redis_rate's at 8 and 32 goroutines", strings.Join(parts, ", "), worst >= 1})
		// Concurrent decisions of one Admitter go to Redis as one script call (the
		// coalescer's batches): at 32 goroutines that call's overhead is paid once for
		// many. The latency of one decision with nothing to wait for is shown beside,
		// since a batch must not cost the caller who is alone.
		worst32 := 1e9
		parts = parts[:0]
		for _, topo := range []string{"standalone", "cluster"} {
			st := ratioStats(d.Cell(implSpace, topo, 32).PerSec, d.Cell(implRedisRate, topo, 32).PerSec)
			worst32 = min(worst32, st.Median)
			parts = append(parts, fmt.Sprintf("%s/32 %s", topo, st.format("%.2f×")))
		}
		// Where the driver and Redis share the machine's cores, space's decisions/s
		// cannot pass the cores over what a decision costs the two together: that
		// ceiling, against redis_rate's decisions/s in the same run, is shown beside.
		for _, topo := range []string{"standalone", "cluster"} {
			a, p := d.Cell(implSpace, topo, 32), d.Cell(implRedisRate, topo, 32)
			if len(a.RedisCPU) == 0 || len(p.RedisCPU) == 0 {
				continue
			}
			cpu := summarize(a.ClientCPU).Median + summarize(a.RedisCPU).Median
			ceiling := float64(r.Machine.CPUs) * 1e6 / cpu
			parts = append(parts, fmt.Sprintf("%s/32 CPU a decision, driver + Redis, %.1f µs (redis_rate %.1f µs; Redis's own %s against %s µs): at most %.0f/s on %d cores, %.2f× redis_rate's", topo,
				cpu, summarize(p.ClientCPU).Median+summarize(p.RedisCPU).Median, summarize(a.RedisCPU).format("%.2f"), summarize(p.RedisCPU).format("%.2f"),
				ceiling, r.Machine.CPUs, ceiling/summarize(p.PerSec).Median))
		}
		for _, topo := range []string{"standalone", "cluster"} {
			parts = append(parts, fmt.Sprintf("p50 at 1 goroutine %s %s ms (redis_rate %s ms)", topo,
				summarize(d.Cell(implSpace, topo, 1).P50).format("%.3f"), summarize(d.Cell(implRedisRate, topo, 1).P50).format("%.3f")))
		}
		ts = append(ts, Target{"decisions/s ≥ 2× redis_rate's at 32 goroutines", strings.Join(parts, ", "), worst32 >= 2})
	}
	if h := r.HTTP; h != nil {
		st := summarize(h.DeltaP50)
		ts = append(ts, Target{"admission adds ≤ 0.5 ms at p50 to a create", st.format("%+.2f ms"), st.Median <= 0.5})
		if f := h.Refusals; f != nil {
			full := summarize(f.Full.RPS)
			ts = append(ts, Target{"≥ 4,000 rejected creates/s on one replica (full path)", full.format("%.0f/s"), full.Median >= 4000})
			noCaps, fullPath := ratioStats(f.NoCaps.RPS, f.RedisRate.RPS), ratioStats(f.Full.RPS, f.RedisRate.RPS)
			ts = append(ts, Target{"refused creates/s ≥ 1.1× chi + redis_rate (no caps / full path)",
				noCaps.format("%.2f×") + " / " + fullPath.format("%.2f×"), noCaps.Median >= 1.1 && fullPath.Median >= 1.1})
			// What the overload work asks of a refusal from memory: the HTTP part's
			// ceiling on this machine, less a tenth for everything a refusal knows.
			// Beside it, the same ratio to the bare peer answering space-api's own 429:
			// what is left once the answer the API promises (its headers and body) is
			// paid on both sides.
			bare, same := ratioStats(f.NoCaps.RPS, f.Bare.RPS), ratioStats(f.NoCaps.RPS, f.Same.RPS)
			ts = append(ts, Target{"refused creates/s ≥ 0.9× bare chi (no caps)",
				bare.format("%.2f×") + " (÷ bare chi answering space-api's 429: " + same.format("%.2f×") + ")", bare.Median >= 0.9})
		}
	}
	if f := r.Flood; f != nil {
		st := summarize(f.Space.GoodSuccess)
		ts = append(ts, Target{"the well-behaved client keeps 100% success during the flood", st.format("%.1f%%"), st.Min >= 100})
		if n := f.Neighbour; n != nil {
			ts = append(ts, n.targets()...)
		}
	}
	if o := r.Overload; o != nil {
		ts = append(ts, o.targets()...)
	}
	if g := r.GoBench; g != nil {
		for _, gb := range goBenchmarks {
			if gb.Pair == nil {
				continue
			}
			if t, ok := gb.Pair.target(g, gb.Pkg); ok {
				ts = append(ts, t)
			}
		}
	}
	ts = append(ts, r.poolTargets()...)
	ts = append(ts, r.lifecycleTargets()...)
	ts = append(ts, r.migrationsTargets()...)
	ts = append(ts, r.soakTargets()...)
	ts = append(ts, r.fleetTargets()...)
	ts = append(ts, r.scaleTargets()...)
	return ts
}

// Summary is the plain-text summary printed on stdout: ratios and targets first,
// then the absolute figures.
func (r *Report) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "space-bench: medians of %d runs (script and decisions: %d) [min–max]; %d CPUs shared by the servers, Postgres, Redis and the load generator (load average at start %s)\n\n",
		r.Runs, r.CheapRuns, r.Machine.CPUs, r.Machine.LoadAvg)
	b.WriteString("Ratios and targets\n")
	for _, t := range r.Targets() {
		mark := "MET"
		if !t.Met {
			mark = "NOT MET"
		}
		fmt.Fprintf(&b, "  %-7s %s: %s\n", mark, t.Name, t.Measured)
	}
	if k := r.Keys; k != nil && len(k.Counts) > 1 {
		lo, hi := k.Counts[0], k.Counts[len(k.Counts)-1]
		fmt.Fprintf(&b, "  decisions/s with %s client keys vs %s: %s (redis_rate over as many keys: %s)\n", count(hi), count(lo),
			ratioStats(k.PerSec[hi], k.PerSec[lo]).format("%.2f×"), ratioStats(k.PeerPerSec[hi], k.PeerPerSec[lo]).format("%.2f×"))
	}
	if p := r.Replicas; p != nil {
		var diffs []string
		for _, run := range p.Runs {
			diffs = append(diffs, fmt.Sprintf("%+d", run.Diff()))
		}
		fmt.Fprintf(&b, "  %d replicas: admitted − (burst + refill × elapsed) = %s per run\n", p.Replicas, strings.Join(diffs, ", "))
	}
	if f := r.Fleet; f != nil {
		fmt.Fprintf(&b, "  fleet: %d sandboxes (%d warm) with a pool of %d on %d kwok nodes, a replica killed midway, %d paused and restored: %d pods created at %.1f/s (cluster bucket %g/s), pod ready p50 %s p99 %s (floor %s, %s), %.3f pods an activation, %.1f API requests an activation, %.0f rejected by the API server's priority and fairness\n",
			f.Sandboxes, f.Run.Warm, f.Pool, f.Nodes, f.Pauses, f.Run.PodsCreated, f.Run.PodRate, f.ClusterRefill, f.Run.ReadyP50.Round(time.Millisecond), f.Run.ReadyP99.Round(time.Millisecond),
			f.FloorP50.Round(time.Millisecond), f.FloorP99.Round(time.Millisecond), f.Account.PerActivation(), f.Run.requests(), f.Run.Rejected)
	}
	b.WriteString("\nFigures\n")
	if s := r.Script; s != nil {
		for _, c := range s.Cells {
			fmt.Fprintf(&b, "  script %-14s %-6s %6.0f Redis instructions/call, %s Redis µs/call\n", c.Impl, c.Path, c.Instructions, summarize(c.Usec).format("%.2f"))
		}
		if bi := s.Batched; bi != nil && bi.Calls > 0 {
			fmt.Fprintf(&b, "  script %-14s %-6s %6.0f Redis instructions/decision from %d goroutines, %.1f decisions a call\n", implSpace, "allow", bi.Instructions, bi.Goroutines, float64(bi.Decisions)/float64(bi.Calls))
		}
	}
	if d := r.Decision; d != nil {
		for _, c := range d.Cells {
			fmt.Fprintf(&b, "  decisions/s %-10s %-2d goroutines %-10s %s", c.Topology, c.Goroutines, c.Impl, summarize(c.PerSec).format("%.0f"))
			if len(c.P50) > 0 {
				fmt.Fprintf(&b, ", p50 %s ms", summarize(c.P50).format("%.3f"))
			}
			if c.Impl == implSpace {
				fmt.Fprintf(&b, ", %s decisions a script call", summarize(c.PerCall).format("%.1f"))
			}
			fmt.Fprintf(&b, ", client CPU %s µs a decision, Redis CPU %s µs a decision", summarize(c.ClientCPU).format("%.1f"), summarize(c.RedisCPU).format("%.2f"))
			b.WriteString("\n")
		}
	}
	if h := r.HTTP; h != nil {
		for _, row := range []*HTTPRow{h.Warm, h.Cold} {
			fmt.Fprintf(&b, "  http %-20s %s req/s, p50 %s ms, p99 %s ms (%d connections)\n", row.Name,
				summarize(row.RPS).format("%.0f"), summarize(row.P50).format("%.2f"), summarize(row.P99).format("%.2f"), h.Workers)
		}
		if f := h.Refusals; f != nil {
			for _, row := range f.Rows() {
				fmt.Fprintf(&b, "  http refused, %-20s %s req/s, p50 %s ms, p99 %s ms; %s chi + redis_rate, %s bare chi, %s space-api's answer (wrk, %d connections)\n", row.Name,
					summarize(row.RPS).format("%.0f"), summarize(row.P50).format("%.2f"), summarize(row.P99).format("%.2f"),
					ratioStats(row.RPS, f.RedisRate.RPS).format("%.2f×"), ratioStats(row.RPS, f.Bare.RPS).format("%.2f×"), ratioStats(row.RPS, f.Same.RPS).format("%.2f×"), f.Connections)
			}
		}
		fmt.Fprintf(&b, "  http cold create p50 at %d/s: admission on %s ms, off %s ms\n", h.OnOffRate,
			summarize(h.OnP50).format("%.2f"), summarize(h.OffP50).format("%.2f"))
	}
	if f := r.Flood; f != nil {
		for _, a := range f.servers() {
			fmt.Fprintf(&b, "  flood on %s: good client %s success, p50 %s ms, p99 %s ms; %s Redis commands and %s Redis µs per create\n", a.name,
				summarize(a.arm.GoodSuccess).format("%.1f%%"), summarize(a.arm.GoodP50).format("%.2f"), summarize(a.arm.GoodP99).format("%.2f"),
				summarize(a.arm.CallsPerRequest).format("%.2f"), summarize(a.arm.RedisUsecPerRequest).format("%.1f"))
		}
		if n := f.Neighbour; n != nil {
			for _, a := range n.servers() {
				fmt.Fprintf(&b, "  flood: quiet neighbour at %d/s on %s, p99 ms alone %s, beside %d/s %s (%s; its first %s, the flooder's burst: %s), beside wrk's %s %s\n",
					n.QuietSend, a.name, summarize(a.arms.Alone).format("%.2f"), n.FixedFlood, summarize(a.arms.Fixed).format("%.2f"),
					ratioStats(a.arms.Fixed, a.arms.Alone).format("%.2f×"), n.Settle, summarize(a.arms.Burst).format("%.2f"),
					summarize(a.arms.Saturated).format("%.2f"), ratioStats(a.arms.Saturated, a.arms.Alone).format("%.2f×"))
			}
			fmt.Fprintf(&b, "  flood: the quiet client's p99 ms inside space-api alone %s, beside %d/s %s, beside wrk's %s; CPU stolen by the hypervisor in those arms %s, %s, %s\n",
				summarize(n.Space.Server.Alone).format("%.2f"), n.FixedFlood, summarize(n.Space.Server.Fixed).format("%.2f"), summarize(n.Space.Server.Saturated).format("%.2f"),
				summarize(n.Space.Steal.Alone).format("%.0f%%"), summarize(n.Space.Steal.Fixed).format("%.0f%%"), summarize(n.Space.Steal.Saturated).format("%.0f%%"))
			fmt.Fprintf(&b, "  flood: the quiet client's answers from space-api: %s\n", outcomes(n.Space.Outcomes))
		}
	}
	if o := r.Overload; o != nil {
		o.summary(&b)
	}
	if k := r.Keys; k != nil {
		fmt.Fprintf(&b, "  keys: %.0f bytes per idle client key; %d idle keys gone %s after their last write (TTL %s)\n",
			k.BytesPerKey, k.ExpiryKeys, k.ExpiryGoneAfter.Round(time.Millisecond), k.ExpiryTTL)
		for _, n := range k.Counts {
			fmt.Fprintf(&b, "  keys: %s client keys: %s decisions/s (redis_rate %s)\n", count(n), summarize(k.PerSec[n]).format("%.0f"), summarize(k.PeerPerSec[n]).format("%.0f"))
		}
	}
	if p := r.Replicas; p != nil {
		for i, run := range p.Runs {
			fmt.Fprintf(&b, "  replicas run %d: admitted %d (per replica %v), expected %d, exact %.3f, %d requests; the peer admitted %d of a window of %.1f\n",
				i+1, run.Admitted, run.PerReplica, run.Expected, run.Exact, run.Requests, run.Peer.Admitted, run.Peer.Window)
		}
	}
	if g := r.GoBench; g != nil {
		for _, l := range g.Lines {
			fmt.Fprintf(&b, "  go bench %s %s\n", l.Name, l.brief())
		}
	}
	r.poolSummary(&b)
	r.lifecycleSummary(&b)
	r.migrationsSummary(&b)
	r.soakSummary(&b)
	r.scaleSummary(&b)
	fmt.Fprintf(&b, "\ntook %s\n", r.Took.Round(time.Second))
	return b.String()
}

func (l *GoBenchLine) brief() string {
	var parts []string
	for _, u := range l.Units {
		st := summarize(l.Metrics[u])
		// Whole numbers from 100 up (ns/op of a round trip is six digits, all of
		// them meaningful to compare); three significant digits below.
		verb := "%.3g"
		if st.Min >= 100 {
			verb = "%.0f"
		}
		parts = append(parts, st.format(verb)+" "+u)
	}
	return strings.Join(parts, ", ")
}

// thousands renders n with a comma between each three digits: 1,024.
func thousands(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0 && s[i-1] != '-'; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// count renders a key count as 10, 10k, 1M.
func count(n int) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return fmt.Sprintf("%dM", n/1_000_000)
	case n >= 1000 && n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	}
	return fmt.Sprint(n)
}

// Markers around the part of docs/benchmarks.md that `make bench` writes; the rest
// of the file (the script study, the profile notes) is kept as it is.
const (
	BeginMarker = "<!-- space-bench:begin: written by `make bench` (bench/, the bench module); edit the driver, not this part -->"
	EndMarker   = "<!-- space-bench:end -->"
	// beginPrefix finds a begin marker whatever its wording: a section written
	// when the marker read differently (it named cmd/space-bench) is replaced too.
	beginPrefix = "<!-- space-bench:begin"
)

// WriteDoc puts section between the markers of the file at path, after its first
// heading when the markers are not there yet.
func WriteDoc(path, section string) error {
	old, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("read %s: %w", path, err)
	}
	block := BeginMarker + "\n" + strings.TrimRight(section, "\n") + "\n" + EndMarker
	doc := string(old)
	i, j := strings.Index(doc, beginPrefix), strings.Index(doc, EndMarker)
	switch {
	case i >= 0 && j > i:
		doc = doc[:i] + block + doc[j+len(EndMarker):]
	case strings.HasPrefix(doc, "# "):
		nl := strings.IndexByte(doc, '\n')
		doc = doc[:nl+1] + "\n" + block + "\n" + doc[nl+1:]
	default:
		doc = "# Benchmarks\n\n" + block + "\n\n" + doc
	}
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// Markdown renders the report as the generated section of docs/benchmarks.md.
// command is how the run was started.
func (r *Report) Markdown(command string) string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("## `make bench`: admission and the create path\n\n")
	w("Every figure is the **median of %d runs, [min–max]** beside it", r.Runs)
	if r.CheapRuns != r.Runs {
		w(" (%d runs for the script cost and decisions/s, which take seconds a run)", r.CheapRuns)
	}
	if r.Quick {
		w(" (**a quick smoke run: the figures mean nothing**)")
	}
	w(". The machine has %d cores shared by everything measured *and* by the load generator, and other work may run on it: ", r.Machine.CPUs)
	w("read the ratios (each taken within one run, so a change of load falls on both sides) before the absolute figures.\n\n")

	w("### Targets\n\n| target | measured | |\n|---|---|---|\n")
	for _, t := range r.Targets() {
		mark := "met"
		if !t.Met {
			mark = "**not met** (see [where the time goes](#where-the-time-goes))"
		}
		w("| %s | %s | %s |\n", t.Name, t.Measured, mark)
	}
	w("\n")

	m := r.Machine
	w("### Machine and command\n\n")
	w("- %d CPUs (`nproc`), %s; %s; load average at the start %s\n", m.CPUs, m.CPUModel, m.Kernel, m.LoadAvg)
	w("- `%s`; `%s`; `%s`\n", m.Go, m.Redis, m.Wrk)
	w("- %s\n", m.Postgres)
	var mods []string
	for k, v := range m.Modules {
		mods = append(mods, k+" "+v)
	}
	sort.Strings(mods)
	w("- %s\n", strings.Join(mods, ", "))
	w("- run %s, took %s:\n\n```sh\n%s\n```\n\n", r.Started.UTC().Format(time.RFC3339), r.Took.Round(time.Second), command)

	if s := r.Script; s != nil {
		w("### 1. Script cost: Redis CPU per decision\n\n")
		w("`usec/calls` of `cmdstat_evalsha` in `INFO commandstats` after `CONFIG RESETSTAT`, %d decisions per cell from one goroutine, the implementations in a rotating order, on a private `redis-server`; ", s.Calls)
		w("the script's own commands are included. `space`: the two-bucket decision; `space_one_key`: the cluster key alone; `redis_rate`: v10 `Allow` on one key.\n\n")
		table := func(unit string, of func(c *ScriptCell) []float64) {
			w("| path | space %[1]s | space_one_key %[1]s | redis_rate %[1]s | space / redis_rate |\n|---|---:|---:|---:|---:|\n", unit)
			for _, path := range []string{"allow", "reject"} {
				w("| %s | %s | %s | %s | %s |\n", path,
					summarize(of(s.Cell(implSpace, path))).format("%.2f"),
					summarize(of(s.Cell(implSpaceOneKey, path))).format("%.2f"),
					summarize(of(s.Cell(implRedisRate, path))).format("%.2f"),
					ratioStats(of(s.Cell(implSpace, path)), of(s.Cell(implRedisRate, path))).format("%.2f×"))
			}
		}
		w("The targets are judged on **Redis instructions per call**: the same calls, %d per cell and one at a time, on a private `redis-server` run under `valgrind --tool=callgrind` (counters zeroed before and dumped after each cell; each call's network handling included, the same for every implementation). The count does not move with the load, where the timings below move by up to 2× between runs on this machine.\n\n", s.InstructionCalls)
		w("| path | space | space_one_key | redis_rate | space / redis_rate |\n|---|---:|---:|---:|---:|\n")
		for _, path := range []string{"allow", "reject"} {
			a, one, p := s.Cell(implSpace, path), s.Cell(implSpaceOneKey, path), s.Cell(implRedisRate, path)
			w("| %s | %.0f | %.0f | %.0f | %.2f× |\n", path, a.Instructions, one.Instructions, p.Instructions, a.Instructions/p.Instructions)
		}
		if bi := s.Batched; bi != nil && bi.Calls > 0 {
			w("\nFrom %d goroutines at once, the Admitter's coalescer sends the decisions that wait for a round trip as one batch script call (`batch.lua`): %d decisions of `space`, allow, went in %d calls (%.1f a call) and cost Redis **%.0f instructions a decision** (%.2f× redis_rate's call above). Under callgrind Redis is about fifty times slower, so more decisions wait for each round trip than they would without it: this is a decision's cost in a deep batch.\n", bi.Goroutines, bi.Decisions, bi.Calls, float64(bi.Decisions)/float64(bi.Calls), bi.Instructions, bi.Instructions/s.Cell(implRedisRate, "allow").Instructions)
		}
		w("\nWall time in Redis, `usec/calls`:\n\n")
		table("µs", func(c *ScriptCell) []float64 { return c.Usec })
		w("\n`usec` is wall time inside each command, so it also counts the moments another process held Redis's core. The same runs, measured by the Redis main thread's CPU time instead (`INFO cpu`, `used_cpu_user_main_thread` + `used_cpu_sys_main_thread`, from getrusage, per decision; it includes reading each request and writing its reply, the same for every implementation):\n\n")
		table("CPU µs", func(c *ScriptCell) []float64 { return c.CPUUsec })
		w("\nAn admitted activation with more to check, beside the plain two-bucket decision (`space`, allow) in the same runs: `space_soft` adds the client's soft limit, checked in the same script; `space_reserved` charges a tier with a reserve (`reserve.lua`: the cluster key holds the shared remainder, one more key the tier's reserve, all in the cluster key's slot).\n\n")
		w("| charge | instructions | / space | µs | CPU µs | / space (µs) | / space (CPU µs) |\n|---|---:|---:|---:|---:|---:|---:|\n")
		for _, impl := range []string{implSpace, implSpaceSoft, implSpaceReserved} {
			c, base := s.Cell(impl, "allow"), s.Cell(implSpace, "allow")
			w("| %s | %.0f | %.2f× | %s | %s | %s | %s |\n", impl, c.Instructions, c.Instructions/base.Instructions,
				summarize(c.Usec).format("%.2f"), summarize(c.CPUUsec).format("%.2f"),
				ratioStats(c.Usec, base.Usec).format("%.2f×"), ratioStats(c.CPUUsec, base.CPUUsec).format("%.2f×"))
		}
		w("\n")
	}

	if d := r.Decision; d != nil {
		w("### 2. Decisions/s from Go\n\n")
		w("Allow path (every decision admits and writes), %s per cell, ours and redis_rate back to back in each run (which goes first alternates), on the services' Redis (standalone on one port, and the 3-node cluster), one go-redis client per topology built as space-api builds its own.\n\n", d.Duration)
		w("| topology | goroutines | space decisions/s | redis_rate decisions/s | space / redis_rate | space decisions a script call | client CPU µs a decision, space / redis_rate | Redis CPU µs a decision, space / redis_rate | decisions a Redis CPU-second, space ÷ redis_rate |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, topo := range []string{"standalone", "cluster"} {
			for _, g := range []int{1, 8, 32} {
				a, p := d.Cell(implSpace, topo, g), d.Cell(implRedisRate, topo, g)
				w("| %s | %d | %s | %s | %s | %s | %s / %s | %s / %s | %s |\n", topo, g, summarize(a.PerSec).format("%.0f"), summarize(p.PerSec).format("%.0f"), ratioStats(a.PerSec, p.PerSec).format("%.2f×"), summarize(a.PerCall).format("%.1f"),
					summarize(a.ClientCPU).format("%.1f"), summarize(p.ClientCPU).format("%.1f"),
					summarize(a.RedisCPU).format("%.2f"), summarize(p.RedisCPU).format("%.2f"), ratioStats(p.RedisCPU, a.RedisCPU).format("%.2f×"))
			}
		}
		w("\nClient CPU is the driver process's (getrusage, user and system, over the cell's decisions): the replica's side of a decision, go-redis's system calls included. Redis CPU is the Redis main threads' (`INFO cpu`, `used_cpu_user_main_thread` + `used_cpu_sys_main_thread`, over every master of the cluster), reading requests and writing replies included: what a decision costs the one Redis that every replica shares. Its ratio is how many more decisions a second one Redis core serves for space than for redis_rate once Redis is what is short, as it is with enough replicas; on this machine one driver process sharing the two cores with Redis never gets it there.\n")
		w("\n")
		w("A decision's latency at 1 goroutine (each call timed, the median of the cell's calls):\n\n")
		w("| topology | space p50 ms | redis_rate p50 ms |\n|---|---:|---:|\n")
		for _, topo := range []string{"standalone", "cluster"} {
			w("| %s | %s | %s |\n", topo, summarize(d.Cell(implSpace, topo, 1).P50).format("%.3f"), summarize(d.Cell(implRedisRate, topo, 1).P50).format("%.3f"))
		}
		w("\n")
	}

	if h := r.HTTP; h != nil {
		w("### 3. HTTP create path\n\n")
		w("One `space-api` process (trusted_header identity from 127.0.0.1; simulated substrate with no cold-start delay), its own database and a private Redis. ")
		w("Load generator for the admits: the vegeta library inside the driver, **on the same 2 cores** as the server, Postgres and Redis. ")
		w("Closed loop, %d connections, %s per run. Warm hits: a pool pre-warmed to %d slots through the `space-api-warm-pool` flag, %d creates per run (the replenisher refills meanwhile, as in production). ", h.Workers, h.Duration, h.WarmTarget, h.WarmTarget*3/4)
		w("Cold admits: a shape the pool never holds, buckets of 10^6. Each kind runs %s unmeasured first.\n\n", h.WarmUp)
		w("| creates | answered | req/s | p50 ms | p99 ms | other answers |\n|---|---|---:|---:|---:|---|\n")
		for _, row := range []*HTTPRow{h.Warm, h.Cold} {
			w("| %s | %s | %s | %s | %s | %s |\n", row.Name, row.Outcome, summarize(row.RPS).format("%.0f"), summarize(row.P50).format("%.2f"), summarize(row.P99).format("%.2f"), orNone(row.unexpected()))
		}
		if f := h.Refusals; f != nil {
			w("\n**Refused creates: the ceiling against peers.** A client over its rate (env client rate 0, burst 1: its one token went on its first create) sends creates as fast as it is answered; every answer is a 429. ")
			warm := "no unmeasured warm-up (a quick run)"
			if f.WarmUp > 0 {
				warm = "each server " + f.WarmUp.String() + " unmeasured first"
			}
			w("Load generator: `wrk`, %d thread, %d connections, the same body and `X-Client-ID`, %s per run, %s; in each run the six one after another, the order rotating from run to run. ", f.Threads, f.Connections, f.Duration, warm)
			w("`space-api, no caps`: the client has no concurrency cap and no live cap. `space-api, full path`: the same rate with a concurrency cap and a live cap (the lease and its release, the live count). ")
			w("`chi + redis_rate`: a chi server in its own process that decodes the same body and asks go-redis/redis_rate v10 `Allow` with a per-client limit (one `EVALSHA` on the same private Redis), 429 when refused. `chi, no store`: the same server answering 429 at once. `chi, space's answer`: the same server answering space-api's own 429 to the same client (the same headers and values, the same body but for the request id's value; the driver checks the two alike before it measures), so that what the answer costs, to write and to read, is told apart from what deciding it costs. `chi, constant answer`: the same router reading no body and writing one pre-rendered 429, the limit of HTTP itself here. ")
			w("The ratios are taken within each run.\n\n")
			w("| server | refused creates/s | p50 ms | p99 ms | vs chi + redis_rate | vs bare chi | vs space's answer | vs constant answer | other answers |\n|---|---:|---:|---:|---:|---:|---:|---:|---|\n")
			for _, row := range f.Rows() {
				w("| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", row.Name, summarize(row.RPS).format("%.0f"), summarize(row.P50).format("%.2f"), summarize(row.P99).format("%.2f"),
					ratioStats(row.RPS, f.RedisRate.RPS).format("%.2f×"), ratioStats(row.RPS, f.Bare.RPS).format("%.2f×"), ratioStats(row.RPS, f.Same.RPS).format("%.2f×"), ratioStats(row.RPS, f.Constant.RPS).format("%.2f×"), orNone(row.unexpected()))
			}
		}
		w("\nWhat admission adds to a create: cold admits at %d creates/s (open loop), %d rounds of %s on a fresh server with admission on and %s on a twin with `SPACE_CLUSTER_ACTIVATION_ADMISSION_ENABLED=false` (one database for both, same Redis), the order flipping every round; p50 and p99 per run over all its segments (%d and %d creates in all).\n\n",
			h.OnOffRate, h.OnOffRounds, h.OnOffSegment, h.OnOffSegment, h.OnRequests, h.OffRequests)
		w("| | admission on | admission off | on − off |\n|---|---:|---:|---:|\n")
		w("| p50 ms | %s | %s | %s |\n", summarize(h.OnP50).format("%.2f"), summarize(h.OffP50).format("%.2f"), summarize(h.DeltaP50).format("%+.2f"))
		var d99 []float64
		for i := range min(len(h.OnP99), len(h.OffP99)) {
			d99 = append(d99, h.OnP99[i]-h.OffP99[i])
		}
		w("| p99 ms | %s | %s | %s |\n\n", summarize(h.OnP99).format("%.2f"), summarize(h.OffP99).format("%.2f"), summarize(d99).format("%+.2f"))
		if len(h.OnOffUnexpected) > 0 {
			w("Answers other than 201 in the on/off runs: %v.\n\n", h.OnOffUnexpected)
		}
	}

	if f := r.Flood; f != nil {
		w("### 4. Flood\n\n")
		w("`bench-flood` (rate %g/s, burst %g) sends %d creates/s, 20× its rate; `bench-good` (rate %g/s) sends %d/s, within it; cluster bucket %g/s. Open loop, %s per run (after an unmeasured warm-up), one server, private Redis; in each run space-api, then the peer (chi + redis_rate, the same Redis, each client its own limit of the same rate and burst).\n\n",
			f.FloodRate, f.FloodRate, f.FloodSend, f.GoodRate, f.GoodSend, f.ClusterRate, f.Duration)
		arms := f.servers()
		row := func(name string, cell func(a *FloodArm) string) {
			w("| %s |", name)
			for _, a := range arms {
				w(" %s |", cell(a.arm))
			}
			w("\n")
		}
		w("| median [min–max] | %s | %s |\n|---|---:|---:|\n", arms[0].name, arms[1].name)
		row("well-behaved client: creates answered 201", func(a *FloodArm) string { return summarize(a.GoodSuccess).format("%.1f%%") })
		row("well-behaved client: p50 / p99 ms", func(a *FloodArm) string {
			return summarize(a.GoodP50).format("%.2f") + " / " + summarize(a.GoodP99).format("%.2f")
		})
		row("flooding client: admitted/s", func(a *FloodArm) string { return summarize(a.FloodAdmitted).format("%.1f") })
		row("flooding client: 429 p50 ms", func(a *FloodArm) string { return summarize(a.FloodRejectP50).format("%.2f") })
		row("Redis commands sent per create (INFO commandstats delta / creates)", func(a *FloodArm) string { return summarize(a.CallsPerRequest).format("%.2f") })
		row("of which EVALSHA", func(a *FloodArm) string { return summarize(a.EvalshaPerRequest).format("%.2f") })
		row("Redis CPU µs per create", func(a *FloodArm) string { return summarize(a.RedisUsecPerRequest).format("%.1f") })
		row("failed decisions (space-api: let through, failure mode open; the peer: answered 503)", func(a *FloodArm) string { return summarize(a.Failed).format("%.0f") })
		w("\nAll answers from space-api: well-behaved %s; flooding %s. From the peer: well-behaved %s; flooding %s. Commands counted are those a client sends (space-api: `EVALSHA` of the concurrency lease and of the admission decision, `ZREM` of the lease; the peer: redis_rate's `EVALSHA`), not those the scripts run inside Redis; the well-behaved client's creates, %.1f%% of the total, cost space-api the same three.\n\n",
			outcomes(f.Space.GoodOutcomes), outcomes(f.Space.FloodOutcomes), outcomes(f.Peer.GoodOutcomes), outcomes(f.Peer.FloodOutcomes),
			100*float64(f.Space.GoodTotal)/float64(max(f.Space.GoodTotal+f.Space.FloodSent, 1)))
		if n := f.Neighbour; n != nil {
			w("A quiet neighbour: `bench-quiet` sends %d creates/s (a quarter of its rate) for %s alone, then beside `bench-flood` sending %d/s (open loop over %d connections, as wrk2 -c %d -R %d), then beside `bench-flood` as fast as wrk goes (1 thread, %d connections, closed loop); the three back to back in each run, on the same server, then on space-api in api_key mode (a second replica on the same database and Redis; each request carries its client's API key, which space-api reads from Postgres before its overload gate, so the flood is one key's), then on the peer (chi + redis_rate, each client its own limit: the flooder's rate and burst, the quiet client's). Each client is a process of its own (the driver's binary, started again for one stream), as another client would be, on the same 2 cores; the floods' two generators (the fixed flood's process and wrk) run at the lowest CPU priority (nice %d), so that on cores they share with the server, Postgres and Redis they take only what nothing else wants, as a flooding client's own machine would, while the server's work for the flood keeps its priority. The fixed flood starts with the flooder's bucket full: the quiet client's creates of its first %s are beside the flooder's burst of admitted creates, reported apart; the arm's p99 is that of the %s after, beside the flood over its rate, reported with no target (section 9 has the goals of a flood past capacity).\n\n",
				n.QuietSend, n.Duration, n.FixedFlood, n.FloodConns, n.FloodConns, n.FixedFlood, n.Connections, yieldNice, n.Settle, n.Duration)
			w("| quiet client p99 ms | alone | beside %d/s | ratio | beside the flooder's burst (first %s) | beside wrk | ratio |\n|---|---:|---:|---:|---:|---:|---:|\n", n.FixedFlood, n.Settle)
			for _, a := range n.servers() {
				w("| %s | %s | %s | %s | %s | %s | %s |\n", a.name, summarize(a.arms.Alone).format("%.2f"), summarize(a.arms.Fixed).format("%.2f"),
					ratioStats(a.arms.Fixed, a.arms.Alone).format("%.2f×"), summarize(a.arms.Burst).format("%.2f"),
					summarize(a.arms.Saturated).format("%.2f"), ratioStats(a.arms.Saturated, a.arms.Alone).format("%.2f×"))
			}
			servers := n.servers()
			w("\n|")
			for _, a := range servers {
				w(" | %s", a.name)
			}
			w(" |\n|---|%s\n", strings.Repeat("---:|", len(servers)))
			for _, row := range []struct {
				name, verb string
				of         func(a NeighbourArms) []float64
			}{
				{"flooder's answers/s, fixed flood", "%.0f", func(a NeighbourArms) []float64 { return a.FixedFloodRPS }},
				{"flooder's answers/s, wrk", "%.0f", func(a NeighbourArms) []float64 { return a.SaturatedFloodRPS }},
				{"quiet client's creates answered 201 (worst arm)", "%.1f%%", func(a NeighbourArms) []float64 { return a.Success }},
			} {
				w("| %s", row.name)
				for _, a := range servers {
					w(" | %s", summarize(row.of(a.arms)).format(row.verb))
				}
				w(" |\n")
			}
			w("\n")
			type neighbourRow struct {
				name, verb string
				set        func(*NeighbourArms) ArmSet
			}
			rows := []neighbourRow{
				{"quiet client's p99 ms inside the server (its access log)", "%.2f", func(a *NeighbourArms) ArmSet { return a.Server }},
				{"machine's CPU busy", "%.0f%%", func(a *NeighbourArms) ArmSet { return a.Busy }},
				{"machine's CPU stolen by the hypervisor", "%.0f%%", func(a *NeighbourArms) ArmSet { return a.Steal }},
			}
			// perIndex adds a row for each name, the i-th ArmSet of what sets picks.
			perIndex := func(prefix string, names []string, verb string, sets func(*NeighbourArms) []ArmSet) {
				for i, name := range names {
					rows = append(rows, neighbourRow{prefix + name, verb, func(a *NeighbourArms) ArmSet {
						if s := sets(a); i < len(s) {
							return s[i]
						}
						return ArmSet{}
					}})
				}
			}
			perIndex("cores used by ", cpuUserNames, "%.2f", func(a *NeighbourArms) []ArmSet { return a.Cores })
			perIndex("a create's mean wait, ms: ", activationSteps, "%.3f", func(a *NeighbourArms) []ArmSet { return a.Steps })
			perIndex("a create's waits over 1 ms: ", activationSteps, "%.1f%%", func(a *NeighbourArms) []ArmSet { return a.SlowSteps })
			w("| during the quiet client's arms")
			for _, a := range servers {
				w(" | %s: alone | beside %d/s | beside wrk", a.name, n.FixedFlood)
			}
			w(" |\n|---|%s\n", strings.Repeat("---:|", 3*len(servers)))
			for _, row := range rows {
				w("| %s", row.name)
				for _, a := range servers {
					set := row.set(&a.arms)
					for _, v := range [][]float64{set.Alone, set.Fixed, set.Saturated} {
						w(" | %s", summarize(v).format(row.verb))
					}
				}
				w(" |\n")
			}
			w("\n")
			w("Inside the server is from the request's first middleware to its answer written, as space-api logs it: without the driver's own queues, the kernel's or the loopback's (the peer logs no requests: n/a). Busy and stolen are shares of the machine's CPU time during each arm's measured part (`/proc/stat`): stolen is time a vCPU of this virtual machine was ready to run while the host ran another guest, latency no process here caused. Cores are each process's CPU seconds a second over the same part (`/proc/<pid>/stat`); the driver's are its own and its load streams' processes' (the fixed flood's plain HTTP client and the quiet client's vegeta), and wrk's are not counted. A create's mean wait is each step of the creates space-api activated during the arm (`space_sandbox_activation_step_seconds`, its sum over its count; the quiet client's, and the flooder's admitted or refused by Redis, not those refused from memory, which take no step): its concurrency place and its charge in Redis, its booking and its finish in Postgres, its start on the simulated substrate; its waits over 1 ms are the share of each step's waits past the histogram's 1 ms bucket.\n\n")
			w("The quiet client's answers, every arm and run: from space-api %s; in api_key mode %s; from the peer %s.\n\n", outcomes(n.Space.Outcomes), outcomes(n.APIKey.Outcomes), outcomes(n.Peer.Outcomes))
		}
	}

	if k := r.Keys; k != nil {
		w("### 5. Scale with keys\n\n")
		w("- Memory per idle client key: **%.0f bytes** (`used_memory` growth over %s keys made by real decisions); %.0f bytes per key at %s keys of each kind (ours and redis_rate's, written by a Lua loop, ours in the script's state format).\n",
			k.BytesPerKey, count(k.MemoryKeys), k.BytesPerKeyAtMax, count(k.Counts[len(k.Counts)-1]))
		w("- Idle keys expire: %s client keys of a bucket that refills fully in %s; `DBSIZE` %d right after the last write, back to %d (the cluster key) **%s** after it.\n",
			count(k.ExpiryKeys), k.ExpiryTTL, k.ExpiryPeak, k.ExpiryBaseline, k.ExpiryGoneAfter.Round(time.Millisecond))
		w("- Decisions/s, %d goroutines, %s per run, each decision for a random one of N client keys that all exist (one logical database per N, runs interleaved):\n\n", k.Goroutines, k.Duration)
		w("| client keys | space decisions/s | vs %s | redis_rate decisions/s | vs %s |\n|---:|---:|---:|---:|---:|\n", count(k.Counts[0]), count(k.Counts[0]))
		for _, n := range k.Counts {
			w("| %s | %s | %s | %s | %s |\n", count(n), summarize(k.PerSec[n]).format("%.0f"), ratioStats(k.PerSec[n], k.PerSec[k.Counts[0]]).format("%.2f×"),
				summarize(k.PeerPerSec[n]).format("%.0f"), ratioStats(k.PeerPerSec[n], k.PeerPerSec[k.Counts[0]]).format("%.2f×"))
		}
		w("\nredis_rate's Allow runs over as many keys of its own in the same databases (each database holds both kinds, N of each): what a larger keyspace costs Redis itself (hash table and CPU cache misses) shows in both columns alike.\n")
		w("\n")
	}

	if p := r.Replicas; p != nil {
		w("### 6. Several replicas\n\n")
		w("%d `space-api` processes, one database, one Redis; cluster bucket burst %d, refill %g/s (fails closed, 2 s Redis timeout, so that no decision is admitted unbudgeted); each replica flooded by %d connections for %s at once. ", p.Replicas, p.Burst, p.Refill, p.Workers, p.Duration)
		w("Expected = ⌊burst + refill × (t_last − t_first)⌋: t_last is the Redis time of the last admission (bucket.lua stores it in the cluster key with the tokens left), t_first the start of the first admitted create (the earliest `created_at` of the flood's sandboxes; a refused create leaves none; Postgres and Redis read the same clock here). ")
		w("Exact = burst + refill × (t_last − t_first) − tokens left: it exceeds the count only by the refill of the instant between the first create's start and its charge, under one token. ")
		w("The column `burst + refill × (t_end − t_start)` is the same over the whole flood (t_start and t_end read with Redis `TIME` before and after): it is higher by what refilled before the first admission and after the last one, while the generator started and stopped.\n\n")
		w("| run | 201s (per replica) | expected | admitted − expected | exact | burst + refill × (t_end − t_start) | 429s | other | decision errors |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|\n")
		for i, run := range p.Runs {
			w("| %d | %d %v | %d | %+d | %.3f | %.1f | %d | %d | %.0f |\n", i+1, run.Admitted, run.PerReplica, run.Expected, run.Diff(), run.Exact, run.Window, run.Rejected, run.Other, run.Errors)
		}
		w("\nThe peer: %d chi + redis_rate processes, the same loads right after each run above, the client's one redis_rate key (burst %d, %g a second, a 2 s Redis timeout), a fresh key each run. redis_rate keeps no time of its last admission, so its count is compared with its own flood's window only.\n\n", p.Replicas, p.Burst, p.Refill)
		w("| run | peer 201s (per peer) | burst + refill × (t_end − t_start) | 201s − window | 429s | other |\n|---:|---|---:|---:|---:|---:|\n")
		for i, run := range p.Runs {
			q := run.Peer
			w("| %d | %d %v | %.1f | %+.1f | %d | %d |\n", i+1, q.Admitted, q.PerReplica, q.Window, float64(q.Admitted)-q.Window, q.Rejected, q.Other)
		}
		w("\n")
	}

	r.poolMarkdown(&b)
	r.lifecycleMarkdown(&b)
	if o := r.Overload; o != nil {
		o.markdown(&b)
	}
	r.migrationsMarkdown(&b)
	r.soakMarkdown(&b)
	r.scaleMarkdown(&b)
	r.fleetMarkdown(&b)
	if g := r.GoBench; g != nil {
		w("### Go benchmarks of the hot paths\n\n")
		w("`%s`, median [min–max] over the runs. Each package says what its benchmark measures; those with Postgres or Redis in them use the services.", g.Command)
		for _, gb := range goBenchmarks {
			if gb.Pair == nil {
				continue
			}
			a, b := gb.Pair.names()
			w(" `%s` and `%s` (`%s`), whose ratio is a target, are each run as `go test`s of their own with `-count 1` and `-benchtime %s`, four a run in the order first, second, second, first, the first alternating from run to run, and each run's figure of one is the mean of its two, beside the other's: with `-count`, go test runs one sub-benchmark's repetitions in a block and the second block meets what the machine does later, and of two runs one after the other, the second meets a drift over their seconds that the order first, second, second, first shares between them.",
				a, b, gb.Pkg, g.PairTime)
		}
		w("\n\n")
		w("| package | benchmark | figures |\n|---|---|---|\n")
		for _, l := range g.Lines {
			w("| `%s` | `%s` | %s |\n", l.Pkg, strings.TrimPrefix(l.Name, "Benchmark"), l.brief())
		}
		w("\n")
	}
	return b.String()
}

// orNone is s, or "none" for "".
func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// outcomes renders answer counts, largest first.
func outcomes(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int { return m[b] - m[a] })
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%d × %s", m[k], k))
	}
	return strings.Join(parts, ", ")
}
