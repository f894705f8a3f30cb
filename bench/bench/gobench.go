package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
)

// goBenchmarks are the hot-path benchmarks the report includes, by package: the
// create path's layers, each with allocations reported. A package's Pair, when set,
// is two sub-benchmarks whose ratio is a target (report.go), run apart (goBenchPair).
var goBenchmarks = []struct {
	Pkg, Pattern string
	Pair         *goBenchPair
}{
	{"./internal/api", "^BenchmarkIdentify$", nil},
	{"./internal/apikey", "^BenchmarkLookup$", nil},
	{"./internal/flags", "^BenchmarkResolve$", nil},
	{"./internal/keyed", "^(BenchmarkLoadSpread|BenchmarkBytesPerKey)$", nil},
	{"./internal/admission", "^(BenchmarkAdmit|BenchmarkConcurrencyAcquire)$", nil},
	{"./internal/sandbox", "^BenchmarkCreate$", nil},
	{"./internal/app", "^(BenchmarkCreate|BenchmarkRefusalHandler)$", &goBenchPair{
		Bench: "BenchmarkCreate", Subs: [2]string{"rejected", "rejected_tiered"}, Unit: "creates/s", AtLeast: 0.95,
		Target: "a tiered client's refused creates/s ≥ 0.95× an untiered one's (in process, same run)"}},
	// Not a hot path: the queue's fairness scenario, one run of seconds (see its doc).
	{"./internal/dispatcher", "^BenchmarkFairQueue$", nil},
}

// goBenchPair is two sub-benchmarks of Bench whose ratio is a target. Each of a run's
// figures is the mean of two go tests of its own (-count 1, -benchtime
// sizes.goPairTime), the four in the order first, second, second, first (order), the
// first alternating from run to run, so that run i of each is taken beside run i of
// the other; the package's run with -count skips them. go test's -count runs one
// sub-benchmark's repetitions in a block, and the block that ran second met whatever
// the machine did later: in process the two refusals cost the same
// (BenchmarkRefusalHandler), while over loopback the later block read 0.88–0.99× the
// earlier one, whichever went first. One go test of each a run, one after the other,
// still read 0.86× to 1.12× between pairs minutes apart (eight pairs by hand at
// afcb14d, median 1.00×): a drift over the pair's seconds falls on whichever ran
// second, where over first, second, second, first a steady one falls alike on both.
type goBenchPair struct {
	Bench string
	Subs  [2]string
	// The target: Subs[1]'s Unit over Subs[0]'s, run by run, at least AtLeast at the
	// median; Target says so in the report.
	Unit    string
	AtLeast float64
	Target  string
}

// target is the pair's target as g measured it in pkg; false when either did not run.
func (p *goBenchPair) target(g *GoBenchResult, pkg string) (Target, bool) {
	base, other := g.line(pkg, p.Bench+"/"+p.Subs[0]), g.line(pkg, p.Bench+"/"+p.Subs[1])
	if base == nil || other == nil {
		return Target{}, false
	}
	st := ratioStats(other.Metrics[p.Unit], base.Metrics[p.Unit])
	return Target{p.Target, st.format("%.2f×"), st.Median >= p.AtLeast}, true
}

// names are the pair's two sub-benchmarks as the report names them: Create/rejected
// and Create/rejected_tiered.
func (p *goBenchPair) names() (string, string) {
	b := strings.TrimPrefix(p.Bench, "Benchmark")
	return b + "/" + p.Subs[0], b + "/" + p.Subs[1]
}

// GoBenchLine is one benchmark's figures over its -count runs.
type GoBenchLine struct {
	Pkg, Name string
	// Metrics by unit (ns/op, B/op, allocs/op, and the benchmarks' own, such as
	// creates/s), one value per run.
	Metrics map[string][]float64
	Units   []string // in the order go test printed them
}

// GoBenchResult is the go test -bench part.
type GoBenchResult struct {
	Command  string
	PairTime string // the -benchtime of the pairs' runs (goBenchPair)
	Lines    []*GoBenchLine
}

// line is the benchmark name of package pkg, nil when it did not run.
func (r *GoBenchResult) line(pkg, name string) *GoBenchLine {
	for _, l := range r.Lines {
		if l.Pkg == pkg && l.Name == name {
			return l
		}
	}
	return nil
}

// runGoBench runs the hot-path benchmarks in the module and parses their output: each
// package's with -count, then its pair's runs (goBenchPair), which the first skips.
func runGoBench(ctx context.Context, env *Env, sz sizes) (*GoBenchResult, error) {
	res := &GoBenchResult{Command: fmt.Sprintf("go test -run '^$' -bench <pattern> -benchmem -benchtime %s -count %d <package>", sz.goBenchTime, sz.goBenchCount),
		PairTime: sz.goPairTime}
	for _, gb := range goBenchmarks {
		p, skip := gb.Pair, ""
		if p != nil {
			skip = "^" + p.Bench + "$/^(" + p.Subs[0] + "|" + p.Subs[1] + ")$"
		}
		lines, err := goTest(ctx, env, gb.Pkg, gb.Pattern, skip, sz.goBenchTime, sz.goBenchCount)
		if err != nil {
			return nil, err
		}
		if p != nil {
			if lines, err = p.run(ctx, env, gb.Pkg, sz, lines); err != nil {
				return nil, err
			}
		}
		res.Lines = append(res.Lines, lines...)
		env.logf("gobench: %s done", gb.Pkg)
	}
	return res, nil
}

// run runs the pair's sub-benchmarks of pkg for sz.goBenchCount runs, each run's
// four go tests in order, and adds their lines to lines: one figure a run for each,
// the mean of its two.
func (p *goBenchPair) run(ctx context.Context, env *Env, pkg string, sz sizes, lines []*GoBenchLine) ([]*GoBenchLine, error) {
	for run := range sz.goBenchCount {
		var got []*GoBenchLine
		for _, sub := range p.order(run) {
			more, err := goTest(ctx, env, pkg, "^"+p.Bench+"$/^"+sub+"$", "", sz.goPairTime, 1)
			if err != nil {
				return nil, err
			}
			got = mergeGoBench(got, more)
		}
		lines = mergeGoBench(lines, meanRuns(got))
	}
	return lines, nil
}

// order is the order of the pair's four go tests in run number run: first, second,
// second, first, the first alternating from run to run.
func (p *goBenchPair) order(run int) [4]string {
	a, b := p.Subs[run%2], p.Subs[(run+1)%2]
	return [4]string{a, b, b, a}
}

// meanRuns is lines with each benchmark's runs of each unit made one: their mean.
func meanRuns(lines []*GoBenchLine) []*GoBenchLine {
	out := make([]*GoBenchLine, 0, len(lines))
	for _, l := range lines {
		m := &GoBenchLine{Pkg: l.Pkg, Name: l.Name, Units: slices.Clone(l.Units), Metrics: make(map[string][]float64, len(l.Metrics))}
		for u, vs := range l.Metrics {
			sum := 0.0
			for _, v := range vs {
				sum += v
			}
			m.Metrics[u] = []float64{sum / float64(len(vs))}
		}
		out = append(out, m)
	}
	return out
}

// goTest runs go test's benchmarks matching pattern, less those matching skip (none
// when empty), in pkg, and parses their lines.
func goTest(ctx context.Context, env *Env, pkg, pattern, skip, benchtime string, count int) ([]*GoBenchLine, error) {
	args := []string{"test", "-run", "^$", "-bench", pattern, "-benchmem", "-benchtime", benchtime,
		"-count", strconv.Itoa(count)}
	if skip != "" {
		args = append(args, "-skip", skip)
	}
	args = append(args, pkg)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = env.Module
	cmd.Env = os.Environ()
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("go %s: %w\n%s%s", strings.Join(args, " "), err, out.String(), errOut.String())
	}
	lines := parseGoBench(pkg, out.Bytes())
	if len(lines) == 0 {
		return nil, fmt.Errorf("go %s printed no benchmark:\n%s", strings.Join(args, " "), out.String())
	}
	return lines, nil
}

// mergeGoBench adds more's runs to the line of the same name in lines, or more's line
// after them when there is none.
func mergeGoBench(lines, more []*GoBenchLine) []*GoBenchLine {
	for _, m := range more {
		i := slices.IndexFunc(lines, func(l *GoBenchLine) bool { return l.Pkg == m.Pkg && l.Name == m.Name })
		if i < 0 {
			lines = append(lines, m)
			continue
		}
		for _, u := range m.Units {
			if _, ok := lines[i].Metrics[u]; !ok {
				lines[i].Units = append(lines[i].Units, u)
			}
			lines[i].Metrics[u] = append(lines[i].Metrics[u], m.Metrics[u]...)
		}
	}
	return lines
}

// parseGoBench reads `go test -bench` output: each Benchmark line's name (without the
// -GOMAXPROCS suffix) and its value/unit pairs, merged over -count repetitions.
func parseGoBench(pkg string, out []byte) []*GoBenchLine {
	var lines []*GoBenchLine
	byName := map[string]*GoBenchLine{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 4 || !strings.HasPrefix(fields[0], "Benchmark") {
			continue
		}
		if _, err := strconv.Atoi(fields[1]); err != nil {
			continue
		}
		name := fields[0]
		if i := strings.LastIndexByte(name, '-'); i > 0 {
			if _, err := strconv.Atoi(name[i+1:]); err == nil {
				name = name[:i]
			}
		}
		l := byName[name]
		if l == nil {
			l = &GoBenchLine{Pkg: pkg, Name: name, Metrics: map[string][]float64{}}
			byName[name] = l
			lines = append(lines, l)
		}
		for i := 2; i+1 < len(fields); i += 2 {
			v, err := strconv.ParseFloat(fields[i], 64)
			if err != nil {
				break
			}
			unit := fields[i+1]
			if _, ok := l.Metrics[unit]; !ok {
				l.Units = append(l.Units, unit)
			}
			l.Metrics[unit] = append(l.Metrics[unit], v)
		}
	}
	return lines
}
