// Package app is space-api: Main, the wired service (app.go, wire.go), and its
// commands (Run). cmd/space-api is only its entry point, so that the service and the
// end-to-end tests that start it on :0 live outside package main.
package app

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/space-sandbox/space/internal/config"
	"github.com/space-sandbox/space/internal/store"
)

// version is the build's version as cmd/space-api was stamped with it
// (-ldflags "-X main.version=..."), set by SetVersion; otherwise it is read from the
// module build info.
var version = ""

// SetVersion records the version the binary was stamped with, before Run.
func SetVersion(v string) { version = v }

// TuneGC sets the garbage collector's percent to config.GCPercent through set
// (debug.SetGCPercent) unless GOGC is set in the environment.
func TuneGC(getenv func(string) string, set func(int) int) {
	if getenv("GOGC") == "" {
		set(config.GCPercent)
	}
}

// Run is space-api without the process: the command in args[0] (serve when none),
// with its environment read through getenv. Tests call it with their own.
func Run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cmd := "serve"
	if len(args) > 0 {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "version", "-version", "--version":
		fmt.Fprintln(stdout, "space-api", Version())
		return nil
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	case "config":
		return printConfig(args, stdout)
	case "serve", "migrate", "keys":
	default:
		return fmt.Errorf("unknown command %q\n%s", cmd, usage)
	}

	load := config.Load
	if cmd != "serve" {
		load = config.LoadDatabase // migrate and keys need the database alone
	}
	cfg, err := load(getenv)
	if err != nil {
		return err
	}
	logger := NewLogger(stderr, cfg.LogLevel)

	switch cmd {
	case "keys":
		return keys(ctx, cfg, args, stdout, logger)
	case "migrate":
		pool, err := store.Open(ctx, cfg.DatabaseURL)
		if err != nil {
			return err
		}
		defer pool.Close()
		if err := store.Migrate(ctx, pool, logger); err != nil {
			return err
		}
		logger.Info("database migrated")
		return nil
	default: // serve
		m := NewMain(cfg, logger)
		if err := m.Run(ctx); err != nil {
			m.Close()
			return err
		}
		return m.Serve(ctx)
	}
}

const usage = `usage: space-api [command]

commands:
  serve     serve the public and internal listeners (default)
  migrate   apply database migrations
  keys      create, list and revoke API keys (keys create --client acme --name ci)
  config    print every configuration variable with its default and help, as an env
            file (config --markdown: the table of docs/configuration.md)
  version   print the version

Configuration is read from environment variables: see space-api config.
`

// printConfig prints every declared variable: an env file of the defaults, or with
// --markdown the tables of docs/configuration.md. It reads no environment, so it
// works anywhere the binary does.
func printConfig(args []string, stdout io.Writer) error {
	switch {
	case len(args) == 0:
		return config.WriteEnv(stdout)
	case len(args) == 1 && (args[0] == "--markdown" || args[0] == "-markdown"):
		return config.WriteMarkdown(stdout)
	}
	return fmt.Errorf("config: unknown arguments %q: want none, or --markdown", args)
}

// Version is the build's version.
func Version() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

// Revision is the VCS revision the binary was built from, with "-dirty" when the tree
// had changes, and "unknown" when the build recorded none (go build -buildvcs=false, or
// a build outside a checkout).
func Revision() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	rev, dirty := "", false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	switch {
	case rev == "":
		return "unknown"
	case dirty:
		return rev + "-dirty"
	}
	return rev
}

// buildInfo is space_build_info: 1, labelled with what was built, so that a dashboard
// can tell which replicas run which build, and a rollout is visible as two versions.
func buildInfo() prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "space_build_info",
		Help:        "Always 1; its labels say which build of space-api this replica runs.",
		ConstLabels: prometheus.Labels{"version": Version(), "revision": Revision(), "goversion": runtime.Version()},
	})
	g.Set(1)
	return g
}

// NewLogger returns the JSON logger every component logs through.
func NewLogger(w io.Writer, level string) *slog.Logger {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		l = slog.LevelInfo
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l}))
}
