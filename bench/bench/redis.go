package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/space-sandbox/space/internal/testenv"
)

// startRedis starts a private redis-server (testenv's) on a free loopback port: INFO
// commandstats and used_memory then count only what the bench sent, and no other
// process on the machine (make run's space-api, a test run) shares its keys. extra
// are more redis-server arguments, e.g. "--databases", "4".
func startRedis(ctx context.Context, dir string, extra ...string) (*testenv.RedisProcess, error) {
	return testenv.StartRedisServer(ctx, dir, extra...)
}

// cmdStat is one line of INFO commandstats.
type cmdStat struct {
	Calls int64
	Usec  int64
}

// commandStats reads INFO commandstats: command name (lower case) to its counters.
func commandStats(ctx context.Context, rdb redis.Cmdable) (map[string]cmdStat, error) {
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, fmt.Errorf("INFO commandstats: %w", err)
	}
	out := map[string]cmdStat{}
	for line := range strings.SplitSeq(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_")
		if !ok {
			continue
		}
		name, fields, ok := strings.Cut(rest, ":")
		if !ok {
			continue
		}
		var st cmdStat
		for field := range strings.SplitSeq(fields, ",") {
			k, v, _ := strings.Cut(field, "=")
			switch k {
			case "calls":
				st.Calls, _ = strconv.ParseInt(v, 10, 64)
			case "usec":
				st.Usec, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		out[name] = st
	}
	return out, nil
}

// infoInt reads one integer field of an INFO section, e.g. memory/used_memory.
func infoInt(ctx context.Context, rdb redis.Cmdable, section, field string) (int64, error) {
	info, err := rdb.Info(ctx, section).Result()
	if err != nil {
		return 0, fmt.Errorf("INFO %s: %w", section, err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("INFO %s %s=%q: %w", section, field, v, err)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("INFO %s has no %s", section, field)
}

// processCPU is the Redis main thread's CPU time so far (INFO cpu,
// used_cpu_user_main_thread + used_cpu_sys_main_thread, from getrusage): unlike
// commandstats' usec, which is wall time inside a command, it does not grow while
// another process holds the core.
func processCPU(ctx context.Context, rdb redis.Cmdable) (time.Duration, error) {
	info, err := rdb.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, fmt.Errorf("INFO cpu: %w", err)
	}
	var total float64
	found := 0
	for line := range strings.SplitSeq(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (k != "used_cpu_user_main_thread" && k != "used_cpu_sys_main_thread") {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("INFO cpu %s=%q: %w", k, v, err)
		}
		total += f
		found++
	}
	if found != 2 {
		return 0, fmt.Errorf("INFO cpu lacks the main thread's used_cpu_user/sys")
	}
	return time.Duration(total * float64(time.Second)), nil
}

// serverCPU is processCPU summed over every Redis that rdb reaches: the one server,
// or each master of a cluster (a decision's keys share one slot, so one master runs
// them; the others' idle CPU is counted alike for every implementation).
func serverCPU(ctx context.Context, rdb redis.UniversalClient) (time.Duration, error) {
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		return processCPU(ctx, rdb)
	}
	var mu sync.Mutex
	var total time.Duration
	err := cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
		cpu, err := processCPU(ctx, node)
		mu.Lock()
		total += cpu
		mu.Unlock()
		return err
	})
	return total, err
}

// redisCPUOf is the CPU Redis's main threads (serverCPU) spent while fn ran.
func redisCPUOf(ctx context.Context, rdb redis.UniversalClient, fn func() error) (time.Duration, error) {
	before, err := serverCPU(ctx, rdb)
	if err != nil {
		return 0, err
	}
	if err := fn(); err != nil {
		return 0, err
	}
	after, err := serverCPU(ctx, rdb)
	if err != nil {
		return 0, err
	}
	return after - before, nil
}

// redisTime is the server's clock, the one the admission script reads.
func redisTime(ctx context.Context, rdb redis.Cmdable) (time.Time, error) {
	t, err := rdb.Time(ctx).Result()
	if err != nil {
		return time.Time{}, fmt.Errorf("TIME: %w", err)
	}
	return t, nil
}

// scriptCommands are the commands the bench's Lua scripts (ours and redis_rate's)
// run inside Redis; INFO commandstats counts them beside the EVALSHA that ran them,
// so they are left out of "calls per request", which counts round trips.
var scriptCommands = map[string]bool{
	"time": true, "get": true, "mget": true, "set": true, "setex": true, "psetex": true,
	"zremrangebyscore": true, "zcard": true, "zadd": true, "zrange": true, "pexpireat": true,
	"pexpire": true, "expire": true, "zscore": true, "del": true,
}

// benchCommands are the bench's own commands (reading the counters), not the server's.
var benchCommands = map[string]bool{"info": true, "config|resetstat": true, "config": true, "ping": true, "time": true}

// topLevelDelta sums the calls and usec of the commands a client sent (not those run
// inside scripts, not the bench's own) between two INFO commandstats snapshots, and
// returns them with the per-command call deltas.
func topLevelDelta(before, after map[string]cmdStat) (calls, usec int64, per map[string]int64) {
	per = map[string]int64{}
	for name, a := range after {
		b := before[name]
		dc, du := a.Calls-b.Calls, a.Usec-b.Usec
		if dc == 0 {
			continue
		}
		per[name] = dc
		if scriptCommands[name] || benchCommands[name] {
			continue
		}
		calls += dc
		usec += du
	}
	return calls, usec, per
}
