package bench

import (
	"context"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Machine is what the figures were measured on.
type Machine struct {
	CPUs     int
	CPUModel string
	Kernel   string
	Go       string
	Redis    string
	Postgres string
	// Wrk is `wrk --version`'s first line: the refusal comparison's load generator.
	Wrk string
	// LoadAvg is /proc/loadavg when the run started: the machine is shared.
	LoadAvg string
	// Modules are the versions of the libraries measured or used to measure.
	Modules map[string]string
}

func describeMachine(ctx context.Context, env *Env) Machine {
	m := Machine{CPUs: runtime.NumCPU(), Go: runtime.Version(), Modules: map[string]string{}}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = "Linux " + strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		f := strings.Fields(string(b))
		if len(f) >= 3 {
			m.LoadAvg = strings.Join(f[:3], " ")
		}
	}
	if out, err := exec.CommandContext(ctx, "redis-server", "--version").Output(); err == nil {
		m.Redis = strings.TrimSpace(string(out))
	}
	// wrk prints its version and usage and exits 1.
	if out, _ := exec.CommandContext(ctx, "wrk", "--version").CombinedOutput(); len(out) > 0 {
		m.Wrk, _, _ = strings.Cut(strings.TrimSpace(string(out)), "\n")
		m.Wrk, _, _ = strings.Cut(m.Wrk, " Copyright")
	}
	if env.AdminURL != "" {
		if conn, err := pgx.Connect(ctx, env.AdminURL); err == nil {
			_ = conn.QueryRow(ctx, "SELECT version()").Scan(&m.Postgres)
			conn.Close(ctx)
		}
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			switch d.Path {
			case "github.com/redis/go-redis/v9", "github.com/go-redis/redis_rate/v10", "github.com/tsenart/vegeta/v12", "github.com/jackc/pgx/v5":
				m.Modules[d.Path] = d.Version
			}
		}
	}
	return m
}
