package bench

import (
	"context"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

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

// cpuTimes are the machine's CPU time counters (/proc/stat's first line, in clock
// ticks, all CPUs together). On a virtual machine, steal is the time a vCPU was ready
// to run and the hypervisor ran something else: latency no process here caused and
// none can see from inside, which is why an arm's p99 is printed beside it.
type cpuTimes struct{ busy, idle, steal uint64 }

// readCPUTimes reads the counters; ok is false where /proc/stat is missing or has no
// steal column.
func readCPUTimes() (t cpuTimes, ok bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return t, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	// cpu user nice system idle iowait irq softirq steal ...
	if len(f) < 9 || f[0] != "cpu" {
		return t, false
	}
	var v [8]uint64
	for i := range v {
		n, err := strconv.ParseUint(f[i+1], 10, 64)
		if err != nil {
			return t, false
		}
		v[i] = n
	}
	return cpuTimes{busy: v[0] + v[1] + v[2] + v[5] + v[6], idle: v[3] + v[4], steal: v[7]}, true
}

// CPUShare is how the machine's CPU time went over an interval, in percent of it.
type CPUShare struct{ Busy, Steal float64 }

// since is the share of each kind of time between a and t (t read after a).
func (t cpuTimes) since(a cpuTimes) CPUShare {
	busy, idle, steal := t.busy-a.busy, t.idle-a.idle, t.steal-a.steal
	total := float64(busy + idle + steal)
	if total == 0 {
		return CPUShare{}
	}
	return CPUShare{Busy: 100 * float64(busy) / total, Steal: 100 * float64(steal) / total}
}

// clockTicks is Linux's USER_HZ, the unit of /proc's CPU times: 100 on every
// architecture Go runs Linux on.
const clockTicks = 100

// procTicks is the CPU time (user and system, clock ticks) of u's processes; a
// process gone counts nothing.
func procTicks(u cpuUser) uint64 {
	var sum uint64
	read := func(dir string, byName bool) {
		comm, ticks, ok := readProcTicks(dir)
		if ok && (!byName || slices.Contains(u.names, comm)) {
			sum += ticks
		}
	}
	for _, pid := range u.pids {
		if pid > 0 {
			read("/proc/"+strconv.Itoa(pid), false)
		}
	}
	if len(u.names) > 0 {
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			if pid, err := strconv.Atoi(e.Name()); err == nil && !slices.Contains(u.pids, pid) {
				read("/proc/"+e.Name(), true)
			}
		}
	}
	if u.streams {
		sum += streams.ticks()
	}
	return sum
}

// readProcTicks is a process's command name and CPU time (user and system, clock
// ticks) from its /proc/<pid>/stat.
func readProcTicks(dir string) (comm string, ticks uint64, ok bool) {
	b, err := os.ReadFile(dir + "/stat")
	if err != nil {
		return "", 0, false
	}
	// pid (comm) state ppid ...: comm may hold spaces, so fields count from ")".
	open, end := strings.IndexByte(string(b), '('), strings.LastIndexByte(string(b), ')')
	if open < 0 || end < open {
		return "", 0, false
	}
	f := strings.Fields(string(b[end+1:]))
	if len(f) < 13 {
		return "", 0, false
	}
	// After ")": state is field 3 of proc(5), utime 14 and stime 15.
	u, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return "", 0, false
	}
	return string(b[open+1 : end]), u + st, true
}

// cpuUser is a process, or a kind of process (by command name), whose CPU use an arm
// reports.
type cpuUser struct {
	pids  []int
	names []string
	// streams adds the CPU of the load streams this driver ran in processes of
	// their own (runApart).
	streams bool
}

// cpuWatch measures the CPU shares of one interval, and the cores each of users
// used: started by watchCPU, read by share; where the machine's counters cannot be
// read, share is false.
type cpuWatch struct {
	start cpuTimes
	ok    bool
	wall  time.Time
	users []cpuUser
	ticks []uint64
}

func watchCPU(users ...cpuUser) cpuWatch {
	t, ok := readCPUTimes()
	w := cpuWatch{start: t, ok: ok, wall: time.Now(), users: users}
	for _, u := range users {
		w.ticks = append(w.ticks, procTicks(u))
	}
	return w
}

// share is the machine's CPU shares since the watch started, and the cores (CPU
// seconds a second) each user used, in the order given.
func (w cpuWatch) share() (CPUShare, []float64, bool) {
	t, ok := readCPUTimes()
	if !ok || !w.ok {
		return CPUShare{}, nil, false
	}
	wall := time.Since(w.wall).Seconds()
	cores := make([]float64, len(w.users))
	for i, u := range w.users {
		if n := procTicks(u); n >= w.ticks[i] && wall > 0 {
			cores[i] = float64(n-w.ticks[i]) / clockTicks / wall
		}
	}
	return t.since(w.start), cores, true
}
