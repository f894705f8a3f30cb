// Command space-bench measures admission and the create path of space-api on this
// machine and writes the figures into docs/benchmarks.md (`make bench` runs it through
// scripts/bench.sh, which starts the local services first and builds it from the bench
// module, bench/, into bin/space-bench):
//
//	space-bench [-runs 3] [-only http,flood] [-quick] [-soak 5m] [-space-api bin/space-api] [-doc docs/benchmarks.md]
//
// It reads the services from the variables `scripts/services.sh env` prints:
// SPACE_DATABASE_URL (the Postgres server; the bench creates and drops databases of
// its own beside the named one), SPACE_REDIS_ADDRS and SPACE_TEST_REDIS_CLUSTER_ADDRS.
// Everything else (redis-server processes, space-api processes, the peers of the
// refusal comparison, wrk) it starts and stops itself. See package bench for the
// scenarios.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"

	"github.com/space-sandbox/space/bench/bench"
)

// driverMemoryLimit is the heap at which the driver collects garbage, unless GOGC or
// GOMEMLIMIT says otherwise: see main.
const driverMemoryLimit = 2 << 30

func main() {
	// The driver is the load generator and the clock of every latency: a collection's
	// stop-the-world pause, up to 4 ms on 2 busy cores, lands on whatever answers
	// arrive meanwhile. At its default GOGC it collected every ~150 ms of a 5,000/s
	// flood (a live heap of ~5 MB), inside the quiet neighbour's measurement. It holds
	// little, so it collects only at driverMemoryLimit: a few times a run.
	if os.Getenv("GOGC") == "" && os.Getenv("GOMEMLIMIT") == "" {
		debug.SetGCPercent(-1)
		debug.SetMemoryLimit(driverMemoryLimit)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// A stream of the quiet-neighbour scenario, started by the driver as a process of
	// its own.
	if served, err := bench.ServeLoad(ctx, os.Stdout); served {
		if err != nil {
			fmt.Fprintln(os.Stderr, "space-bench:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "space-bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("space-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	runs := fs.Int("runs", 3, "runs per figure (median, min and max are reported)")
	only := fs.String("only", "", "comma-separated scenarios to run ("+strings.Join(bench.Scenarios, ", ")+"); default all")
	quick := fs.Bool("quick", false, "tiny durations and counts: a smoke run of the code paths, not figures")
	spaceAPI := fs.String("space-api", "", "space-api binary; default: go build one into a scratch directory")
	doc := fs.String("doc", "docs/benchmarks.md", "file whose space-bench section is rewritten; empty writes none")
	keep := fs.Bool("keep", false, "keep the scratch directory (each server's log, its flags file) and print where it is")
	soak := fs.Duration("soak", 0, "how long the soak scenario sends its load (default 5m, quick 20s); a longer soak: -only soak -soak 30m")
	profile := fs.String("profile", "", "directory for CPU profiles of space-api where a scenario takes them (overload: each flood's window; http: each refusal flood of space-api)")
	templates := fs.String("templates", "deploy/demo/templates.json", "SPACE_TEMPLATES_FILE of the servers")
	if err := fs.Parse(args); err != nil {
		return err
	}
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "space-bench-")
	if err != nil {
		return fmt.Errorf("scratch directory: %w", err)
	}
	if *keep {
		fmt.Fprintf(stderr, "space-bench: keeping %s (the servers' logs and flags)\n", dir)
	} else {
		defer os.RemoveAll(dir)
	}

	env := &bench.Env{
		AdminURL:     os.Getenv("SPACE_DATABASE_URL"),
		RedisAddr:    firstNonEmpty(os.Getenv("SPACE_REDIS_ADDRS"), os.Getenv("SPACE_TEST_REDIS_ADDR")),
		ClusterAddrs: splitAddrs(os.Getenv("SPACE_TEST_REDIS_CLUSTER_ADDRS")),
		SpaceAPI:     *spaceAPI,
		Templates:    absFrom(root, *templates),
		Module:       root,
		Dir:          dir,
		Progress:     stderr,
		ProfileDir:   *profile,
	}
	if env.ProfileDir != "" {
		if err := os.MkdirAll(env.ProfileDir, 0o755); err != nil {
			return fmt.Errorf("-profile: %w", err)
		}
	}
	if env.AdminURL == "" {
		return errors.New(`SPACE_DATABASE_URL is not set; run: scripts/services.sh up && eval "$(scripts/services.sh env)"`)
	}
	if env.SpaceAPI == "" {
		env.SpaceAPI = filepath.Join(dir, "space-api")
		build := exec.CommandContext(ctx, "go", "build", "-o", env.SpaceAPI, "./cmd/space-api")
		build.Dir, build.Stdout, build.Stderr = root, stderr, stderr
		if err := build.Run(); err != nil {
			return fmt.Errorf("go build ./cmd/space-api: %w", err)
		}
	} else {
		env.SpaceAPI = absFrom(root, env.SpaceAPI)
	}

	cfg := bench.Config{Runs: *runs, Quick: *quick, Soak: *soak}
	if *only != "" {
		cfg.Only = strings.Split(*only, ",")
	}
	rep, err := bench.Run(ctx, env, cfg)
	if err != nil {
		return err
	}
	fmt.Fprint(stdout, rep.Summary())
	if *doc != "" {
		command := "make bench   # scripts/bench.sh: scripts/services.sh up, then bin/space-bench (built from bench/) " + strings.Join(args, " ")
		if err := bench.WriteDoc(absFrom(root, *doc), rep.Markdown(strings.TrimSpace(command))); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s\n", *doc)
	}
	return nil
}

// productModule is the module path of the repository root's go.mod.
const productModule = "github.com/space-sandbox/space"

// moduleRoot is the repository root: the directory above the working directory whose
// go.mod is the product's (not the bench module's, bench/go.mod), where `go test
// -bench` runs and the default paths are resolved.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && modulePath(b) == productModule {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("run space-bench inside the repository (no go.mod of %s above the working directory)", productModule)
		}
		dir = parent
	}
}

// modulePath is the path on the module line of a go.mod.
func modulePath(gomod []byte) string {
	for line := range strings.SplitSeq(string(gomod), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "module "); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`)
		}
	}
	return ""
}

func absFrom(root, p string) string {
	if filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(root, p)
}

func splitAddrs(s string) []string {
	var out []string
	for a := range strings.SplitSeq(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

func firstNonEmpty(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}
