package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
)

// goBenchmarks are the hot-path benchmarks the report includes, by package: the
// create path's layers, each with allocations reported.
var goBenchmarks = []struct{ Pkg, Pattern string }{
	{"./internal/api", "^BenchmarkIdentify$"},
	{"./internal/apikey", "^BenchmarkLookup$"},
	{"./internal/flags", "^BenchmarkResolve$"},
	{"./internal/keyed", "^(BenchmarkLoadSpread|BenchmarkBytesPerKey)$"},
	{"./internal/admission", "^(BenchmarkAdmit|BenchmarkConcurrencyAcquire)$"},
	{"./internal/sandbox", "^BenchmarkCreate$"},
	{"./internal/app", "^(BenchmarkCreate|BenchmarkRefusalHandler)$"},
	// Not a hot path: the queue's fairness scenario, one run of seconds (see its doc).
	{"./internal/dispatcher", "^BenchmarkFairQueue$"},
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
	Command string
	Lines   []*GoBenchLine
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

// runGoBench runs the hot-path benchmarks in the module and parses their output.
func runGoBench(ctx context.Context, env *Env, sz sizes) (*GoBenchResult, error) {
	res := &GoBenchResult{Command: fmt.Sprintf("go test -run '^$' -bench <pattern> -benchmem -benchtime %s -count %d <package>", sz.goBenchTime, sz.goBenchCount)}
	for _, gb := range goBenchmarks {
		args := []string{"test", "-run", "^$", "-bench", gb.Pattern, "-benchmem", "-benchtime", sz.goBenchTime,
			"-count", strconv.Itoa(sz.goBenchCount), gb.Pkg}
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir = env.Module
		cmd.Env = os.Environ()
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("go %s: %w\n%s%s", strings.Join(args, " "), err, out.String(), errOut.String())
		}
		lines := parseGoBench(gb.Pkg, out.Bytes())
		if len(lines) == 0 {
			return nil, fmt.Errorf("go %s printed no benchmark:\n%s", strings.Join(args, " "), out.String())
		}
		res.Lines = append(res.Lines, lines...)
		env.logf("gobench: %s done", gb.Pkg)
	}
	return res, nil
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
