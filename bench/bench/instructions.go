package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/space-sandbox/space/internal/testenv"
)

// callgrind counts the instructions a private redis-server runs, under valgrind's
// callgrind tool: the script cost's load-independent figure. usec (wall time in
// Redis) and the Redis thread's CPU time both move with whatever else holds the
// machine's two cores, by up to 2× between runs; the instructions of the same calls
// do not move at all. Every call goes one at a time from one goroutine, as in the
// usec runs, so each carries its own network handling.
type callgrind struct {
	srv *testenv.RedisProcess
	rdb *redis.Client
	dir string // where callgrind writes its dumps
	// dumps counts the dumps asked for: callgrind names the n-th
	// callgrind.out.<pid>.<n>.
	dumps int
}

// toolsHint says how to get the tools when they are missing.
const toolsHint = "run bench/tools.sh (as root it installs the Debian packages wrk and valgrind; otherwise: sudo apt-get install -y wrk valgrind)"

// startCallgrind starts redis-server under callgrind in a directory of its own
// under dir.
func startCallgrind(ctx context.Context, dir string) (*callgrind, error) {
	for _, tool := range []string{"valgrind", "callgrind_control"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("%s is not on PATH: %s: %w", tool, toolsHint, err)
		}
	}
	out, err := os.MkdirTemp(dir, "callgrind-")
	if err != nil {
		return nil, fmt.Errorf("callgrind directory: %w", err)
	}
	srv, err := testenv.StartRedisServerWith(ctx, dir, testenv.RedisServerOptions{
		Wrapper: []string{"valgrind", "--tool=callgrind", "--callgrind-out-file=" + filepath.Join(out, "callgrind.out.%p")},
	})
	if err != nil {
		return nil, fmt.Errorf("redis-server under callgrind: %w", err)
	}
	return &callgrind{srv: srv, dir: out, rdb: redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})}, nil
}

func (c *callgrind) stop() {
	_ = c.rdb.Close()
	c.srv.Stop()
}

// perCall makes calls decisions (the first of them unmeasured: it loads the
// script) and returns the instructions Redis ran for each of the others.
func (c *callgrind) perCall(ctx context.Context, decide decider, calls int, allow bool) (float64, error) {
	if err := decideN(ctx, decide, 1, 1, allow); err != nil {
		return 0, err
	}
	if err := c.control(ctx, "-z"); err != nil {
		return 0, err
	}
	if err := decideN(ctx, decide, calls, 1, allow); err != nil {
		return 0, err
	}
	if err := c.control(ctx, "-d"); err != nil {
		return 0, err
	}
	c.dumps++
	total, err := dumpTotal(filepath.Join(c.dir, fmt.Sprintf("callgrind.out.%d.%d", c.srv.Pid(), c.dumps)))
	if err != nil {
		return 0, err
	}
	return float64(total) / float64(calls), nil
}

// control runs callgrind_control with arg on the server.
func (c *callgrind) control(ctx context.Context, arg string) error {
	out, err := exec.CommandContext(ctx, "callgrind_control", arg, strconv.Itoa(c.srv.Pid())).CombinedOutput()
	if err != nil {
		return fmt.Errorf("callgrind_control %s: %w: %s", arg, err, out)
	}
	return nil
}

// dumpTotal reads the instructions counted in a callgrind dump: its "totals:" line
// (or, in an older format, "summary:").
func dumpTotal(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	var total int64 = -1
	for sc.Scan() {
		for _, prefix := range []string{"totals:", "summary:"} {
			if rest, ok := strings.CutPrefix(sc.Text(), prefix); ok {
				fields := strings.Fields(rest)
				if len(fields) == 0 {
					return 0, fmt.Errorf("%s: an empty %s line", path, prefix)
				}
				n, err := strconv.ParseInt(fields[0], 10, 64)
				if err != nil {
					return 0, fmt.Errorf("%s: %s %w", path, prefix, err)
				}
				total = n
			}
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	if total < 0 {
		return 0, errors.New(path + ": no totals line")
	}
	return total, nil
}

// countInstructions measures every cell of res under callgrind: calls decisions each,
// on fresh keys of its own.
func countInstructions(ctx context.Context, env *Env, res *ScriptResult, calls int) error {
	cg, err := startCallgrind(ctx, env.Dir)
	if err != nil {
		return err
	}
	defer cg.stop()
	for _, c := range res.Cells {
		allow := c.Path == "allow"
		decide, err := newDecider(ctx, cg.rdb, c.Impl, allow)
		if err != nil {
			return fmt.Errorf("%s/%s: %w", c.Impl, c.Path, err)
		}
		n, err := cg.perCall(ctx, decide, calls, allow)
		if err != nil {
			return fmt.Errorf("instructions of %s/%s: %w", c.Impl, c.Path, err)
		}
		c.Instructions = n
	}
	res.InstructionCalls = calls
	decide, err := newDecider(ctx, cg.rdb, implSpace, true)
	if err != nil {
		return err
	}
	if res.Batched, err = cg.batched(ctx, decide, calls, 32); err != nil {
		return fmt.Errorf("instructions of %s/allow from 32 goroutines: %w", implSpace, err)
	}
	env.logf("script: instructions counted under callgrind")
	return nil
}

// batched makes calls decisions from g goroutines at once (the first, unmeasured, on
// its own: it loads the script) and returns the instructions Redis ran for each and
// the script calls that carried them. Redis under callgrind is about fifty times
// slower than without, so more decisions wait for each round trip than they would:
// the figure is what a decision costs Redis in a deep batch.
func (c *callgrind) batched(ctx context.Context, decide decider, calls, g int) (*BatchedInstructions, error) {
	if err := decideN(ctx, decide, 1, 1, true); err != nil {
		return nil, err
	}
	// The first batch loads the batch script (EVALSHA refused NOSCRIPT, then EVAL with
	// its source, which Redis compiles: millions of instructions, which over a smoke
	// run's few decisions outweighed them all). Warm up from g goroutines, unmeasured,
	// until a batch has gone.
	for try := 0; ; try++ {
		if err := c.rdb.ConfigResetStat(ctx).Err(); err != nil {
			return nil, fmt.Errorf("CONFIG RESETSTAT: %w", err)
		}
		if err := decideN(ctx, decide, 4*g, g, true); err != nil {
			return nil, err
		}
		stats, err := commandStats(ctx, c.rdb)
		if err != nil {
			return nil, err
		}
		if stats["eval"].Calls > 0 || stats["evalsha"].Calls < int64(4*g) {
			break
		}
		if try == 10 {
			return nil, fmt.Errorf("%d decisions from %d goroutines, %d times, never went as a batch", 4*g, g, try+1)
		}
	}
	if err := c.rdb.ConfigResetStat(ctx).Err(); err != nil {
		return nil, fmt.Errorf("CONFIG RESETSTAT: %w", err)
	}
	if err := c.control(ctx, "-z"); err != nil {
		return nil, err
	}
	if err := decideN(ctx, decide, calls, g, true); err != nil {
		return nil, err
	}
	if err := c.control(ctx, "-d"); err != nil {
		return nil, err
	}
	c.dumps++
	total, err := dumpTotal(filepath.Join(c.dir, fmt.Sprintf("callgrind.out.%d.%d", c.srv.Pid(), c.dumps)))
	if err != nil {
		return nil, err
	}
	stats, err := commandStats(ctx, c.rdb)
	if err != nil {
		return nil, err
	}
	return &BatchedInstructions{Goroutines: g, Decisions: calls, Calls: stats["evalsha"].Calls + stats["eval"].Calls,
		Instructions: float64(total) / float64(calls)}, nil
}
